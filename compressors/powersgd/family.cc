// powersgd: a rank-r approximation P Q^T of each gradient matrix (powersgd_logic.h),
// P and Q summed over two dense rings; Q carries over between steps (warm start).
#include <fmt/format.h>

#include <limits>

#include "compressors/family.h"
#include "compressors/powersgd/powersgd_logic.h"

namespace gradcomm::detail {
namespace {

constexpr std::string_view kKeys[] = {"rank",      "warm_start", "min_compression_rate", "start_iter", "ef",
                                      "min_numel", "warmup",     "seed"};

void parse(const SpecReader& r, CompressorSpec& s) {
  // torch's PowerSGDState defaults: rank 1, warm start, min_compression_rate 2.
  s.rank = static_cast<int>(r.integer("rank", 1, powersgd::kMaxRank, 1));
  s.warm_start = r.choice<bool>("warm_start", {{"0", false}, {"1", true}}, true);
  s.min_compression_rate = 2.0;
  // 1 compresses whatever is smaller at all.
  if (const auto rate = r.take("min_compression_rate")) {
    s.min_compression_rate = r.parse_number("min_compression_rate", *rate, 1.0, 1e9);
  }
  // start_iter is torch's name (start_powerSGD_iter) for the common warmup.
  if (const auto start = r.take("start_iter")) {
    if (r.take("warmup")) r.fail(fmt::format("{}: give start_iter or warmup (the same setting), not both", r.name()));
    s.warmup = r.parse_integer("start_iter", *start, 0, std::numeric_limits<int64_t>::max());
  }
}

std::string canonical(const CompressorSpec& s) {
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
                                 .reads_shapes = true};  // P and Q are sized by the shapes

}  // namespace

const Family& powersgd_family() { return kPowersgdFamily; }

}  // namespace gradcomm::detail
