// topk: each rank's k largest |acc| (topk_select.cc), exchanged as sparse payloads
// by allgather or reduce-scatter (src/collectives/sparse_allreduce.cc); values
// travel as bf16 by default.
#include <fmt/format.h>

#include "compressors/family.h"

namespace gradcomm::detail {
namespace {

constexpr std::string_view kKeys[] = {"ratio",     "k",      "select", "indices", "algo",
                                      "ef",        "min_numel", "warmup", "seed",    "values"};

void parse(const SpecReader& r, CompressorSpec& s) {
  r.ratio_or_k(s);
  s.select = r.choice<TopkSelect>("select", {{"exact", TopkSelect::kExact}, {"sample", TopkSelect::kSample}},
                                  TopkSelect::kExact);
  s.coded_indices = r.choice<bool>("indices", {{"coded", true}, {"raw", false}}, true);
  s.algo = r.choice<SparseAlgo>(
      "algo",
      {{"auto", SparseAlgo::kAuto}, {"allgather", SparseAlgo::kAllgather}, {"reduce_scatter", SparseAlgo::kReduceScatter}},
      SparseAlgo::kAuto);
}

std::string canonical(const CompressorSpec& s) {
  return fmt::format("{},select={},indices={},algo={},", ratio_or_k_text(s),
                     s.select == TopkSelect::kExact ? "exact" : "sample", s.coded_indices ? "coded" : "raw",
                     s.algo == SparseAlgo::kAuto        ? "auto"
                     : s.algo == SparseAlgo::kAllgather ? "allgather"
                                                        : "reduce_scatter");
}

bool keeps_state(const CompressorSpec& s) { return s.select == TopkSelect::kSample; }  // draws change per step

// A ratio scales with the elements, so a fused call means what the calls would; an
// absolute k does not.
bool fusable(const CompressorSpec& s) { return s.k == 0; }

// Top-k's values are summed in fp32 after they arrive, so bf16 (fp32's range, no
// overflow) costs only rounding, which error feedback keeps.
constexpr Family kTopkFamily{.id = CompressorId::kTopk,
                             .name = "topk",
                             .keys = kKeys,
                             .ef_default = true,
                             .values_default = ValueType::kBf16,
                             .collective = Collective::kSparseSelection,
                             .parse = parse,
                             .canonical = canonical,
                             .keeps_state = keeps_state,
                             .fusable = fusable};

}  // namespace

const Family& topk_family() { return kTopkFamily; }

}  // namespace gradcomm::detail
