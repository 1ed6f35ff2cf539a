// powersgd: a rank-r approximation P Q^T of each gradient matrix (powersgd_logic.h),
// P and Q summed over two dense rings; Q carries over between steps (warm start).
#include <fmt/format.h>

#include <limits>

#include "compressors/family.h"
#include "compressors/lowrank/lowrank.h"
#include "compressors/lowrank/powersgd_logic.h"  // kMaxRank
#include "compressors/powersgd/powersgd.h"
#include "compressors/spec.h"

namespace gradcomm::detail {
namespace {

constexpr std::string_view kKeys[] = {"rank",      "warm_start", "min_compression_rate", "start_iter", "ef",
                                      "min_numel", "warmup",     "seed"};

std::shared_ptr<const FamilyParams> parse(const SpecReader& r, CompressorSpec& common) {
  auto s = std::make_shared<PowersgdParams>();  // torch's PowerSGDState defaults
  s->rank = static_cast<int>(r.integer("rank", 1, powersgd::kMaxRank, 1));
  s->warm_start = r.choice<bool>("warm_start", {{"0", false}, {"1", true}}, true);
  // 1 compresses whatever is smaller at all.
  if (const auto rate = r.take("min_compression_rate")) {
    s->min_compression_rate = r.parse_number("min_compression_rate", *rate, 1.0, 1e9);
  }
  // start_iter is torch's name (start_powerSGD_iter) for the common warmup.
  if (const auto start = r.take("start_iter")) {
    if (r.take("warmup")) r.fail(fmt::format("{}: give start_iter or warmup (the same setting), not both", r.name()));
    common.warmup = r.parse_integer("start_iter", *start, 0, std::numeric_limits<int64_t>::max());
  }
  return s;
}

LowRankShape low_rank(const CompressorSpec& spec) {
  const auto& s = spec.family<PowersgdParams>();
  return LowRankShape{s.rank, s.warm_start, s.min_compression_rate};
}

std::string canonical(const CompressorSpec& spec) {
  const auto& s = spec.family<PowersgdParams>();
  return fmt::format("rank={},warm_start={},min_compression_rate={},", s.rank, s.warm_start ? 1 : 0,
                     s.min_compression_rate);
}

bool always(const CompressorSpec&) { return true; }   // Q carries over (or is redrawn each step)
bool never(const CompressorSpec&) { return false; }   // each tensor is its own matrices

constexpr Family kPowersgdFamily{.id = CompressorId::kPowersgd,
                                 .name = "powersgd",
                                 .keys = kKeys,
                                 .ef_default = true,
                                 .values_default = ValueType::kFp32,
                                 .collective = Collective::kLowRank,
                                 .parse = parse,
                                 .canonical = canonical,
                                 .keeps_state = always,
                                 .fusable = never,
                                 .reads_shapes = true,  // P and Q are sized by the shapes
                                 .low_rank = low_rank};

}  // namespace

const Family& powersgd_family() { return kPowersgdFamily; }

}  // namespace gradcomm::detail
