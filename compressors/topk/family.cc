// topk: each rank's k largest |acc| (the magnitude selection of ../sparse/topk_select.cc),
// exchanged as sparse payloads by allgather or reduce-scatter
// (src/collectives/sparse_allreduce.cc); values travel as bf16 by default.
#include <fmt/format.h>

#include "compressors/family.h"
#include "compressors/sparse/sparse.h"
#include "compressors/topk/topk.h"
#include "compressors/spec.h"

#if GRADCOMM_WITH_CUDA
#include "compressors/sparse/gpu_sparse.h"  // gpu_topk_select
#endif

namespace gradcomm::detail {
namespace {

constexpr std::string_view kKeys[] = {"ratio",     "k",      "select", "indices", "algo",
                                      "ef",        "min_numel", "warmup", "seed",    "values"};

std::shared_ptr<const FamilyParams> parse(const SpecReader& r, CompressorSpec& /*common*/) {
  auto s = std::make_shared<TopkParams>();
  r.ratio_or_k(s->ratio, s->k);
  s->select = r.choice<TopkSelect>("select", {{"exact", TopkSelect::kExact}, {"sample", TopkSelect::kSample}},
                                   TopkSelect::kExact);
  s->coded_indices = r.choice<bool>("indices", {{"coded", true}, {"raw", false}}, true);
  s->algo = r.choice<SparseAlgo>(
      "algo",
      {{"auto", SparseAlgo::kAuto}, {"allgather", SparseAlgo::kAllgather}, {"reduce_scatter", SparseAlgo::kReduceScatter}},
      SparseAlgo::kAuto);
  return s;
}

std::string canonical(const CompressorSpec& spec) {
  const auto& s = spec.family<TopkParams>();
  return fmt::format("{},select={},indices={},algo={},", ratio_or_k_text(s.ratio, s.k),
                     s.select == TopkSelect::kExact ? "exact" : "sample", s.coded_indices ? "coded" : "raw",
                     s.algo == SparseAlgo::kAuto        ? "auto"
                     : s.algo == SparseAlgo::kAllgather ? "allgather"
                                                        : "reduce_scatter");
}

// The sampled threshold's draws change per step.
bool keeps_state(const CompressorSpec& spec) { return spec.family<TopkParams>().select == TopkSelect::kSample; }

// A ratio scales with the elements, so a fused call means what the calls would; an
// absolute k does not.
bool fusable(const CompressorSpec& spec) { return spec.family<TopkParams>().k == 0; }

SparseShape shape(const CompressorSpec& spec) {
  const auto& p = spec.family<TopkParams>();
  SparseShape s;
  s.ratio = p.ratio;
  s.k = p.k;
  s.format = SparseFormat{spec.values, p.coded_indices};
  s.exact_count = p.select == TopkSelect::kExact;
  s.algo = p.algo;
  return s;
}

// With a residual, the fold into it, the selection and the zeroing of data in one pass
// where the selection streams the input (topk_select_fold).
SparseVector select(const CompressorSpec& spec, float* data, float* residual, int64_t n, int64_t count,
                    const PhiloxStream& rng) {
  const TopkSelect mode = spec.family<TopkParams>().select;
  if (residual != nullptr) return topk_select_fold(data, residual, n, count, mode, rng);
  return topk_select_accumulate(data, nullptr, n, count, mode, rng);
}

constexpr SparseOps kSparse{.shape = shape, .select = select};

#if GRADCOMM_WITH_CUDA
void gpu_select(const CompressorSpec& spec, const float* data, float* residual, int64_t n, int64_t count,
                const PhiloxStream& rng, GpuSparseWorkspace& ws, cudaStream_t stream) {
  gpu_topk_select(data, residual, n, count, spec.family<TopkParams>().select, rng, spec.values, ws, stream);
}
constexpr GpuSparseOps kGpuOps{.select = gpu_select};
constexpr const GpuSparseOps* kGpu = &kGpuOps;
#else
constexpr const GpuSparseOps* kGpu = nullptr;  // built without CUDA
#endif

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
                             .fusable = fusable,
                             .sparse = &kSparse,
                             .gpu_sparse = kGpu};

}  // namespace

const Family& topk_family() { return kTopkFamily; }

}  // namespace gradcomm::detail
