// randomk: the same ratio * n indices drawn on every rank (randomk.cc), their values
// summed by a dense allreduce. Values stay fp32 by default: they are summed on the
// wire, where 16-bit sums lose more than top-k's fp32 sums after arrival.
#include <fmt/format.h>

#include "compressors/family.h"

namespace gradcomm::detail {
namespace {

constexpr std::string_view kKeys[] = {"ratio", "ef", "min_numel", "warmup", "seed", "values"};

void parse(const SpecReader& r, CompressorSpec& s) {
  const auto ratio = r.take("ratio");
  if (!ratio) r.fail(fmt::format("{}: key 'ratio' is required (a number in (0, 1])", r.name()));
  s.ratio = r.parse_ratio("ratio", *ratio);
}

std::string canonical(const CompressorSpec& s) { return fmt::format("ratio={},", s.ratio); }

bool always(const CompressorSpec&) { return true; }  // the draws change from step to step

constexpr Family kRandomkFamily{.id = CompressorId::kRandomk,
                                .name = "randomk",
                                .keys = kKeys,
                                .ef_default = true,
                                .values_default = ValueType::kFp32,
                                .collective = Collective::kSharedIndices,
                                .parse = parse,
                                .canonical = canonical,
                                .keeps_state = always};

}  // namespace

const Family& randomk_family() { return kRandomkFamily; }

}  // namespace gradcomm::detail
