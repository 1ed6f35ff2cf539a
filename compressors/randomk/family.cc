// randomk: the same ratio * n indices drawn on every rank (randomk.cc), their values
// summed by a dense allreduce. Values stay fp32 by default: they are summed on the
// wire, where 16-bit sums lose more than top-k's fp32 sums after arrival.
#include <fmt/format.h>

#include "compressors/family.h"
#include "compressors/randomk/randomk.h"
#include "compressors/sparse/sparse.h"
#include "compressors/spec.h"

#if GRADCOMM_WITH_CUDA
#include "compressors/randomk/gpu_randomk.h"  // gpu_randomk_indices
#endif

namespace gradcomm::detail {
namespace {

constexpr std::string_view kKeys[] = {"ratio", "ef", "min_numel", "warmup", "seed", "values"};

std::shared_ptr<const FamilyParams> parse(const SpecReader& r, CompressorSpec& /*common*/) {
  const auto ratio = r.take("ratio");
  if (!ratio) r.fail(fmt::format("{}: key 'ratio' is required (a number in (0, 1])", r.name()));
  auto s = std::make_shared<RandomkParams>();
  s->ratio = r.parse_ratio("ratio", *ratio);
  return s;
}

std::string canonical(const CompressorSpec& spec) { return fmt::format("ratio={},", spec.family<RandomkParams>().ratio); }

SparseShape shape(const CompressorSpec& spec) {
  SparseShape s;
  s.ratio = spec.family<RandomkParams>().ratio;
  return s;
}

std::vector<uint64_t> draw(const CompressorSpec& /*spec*/, int64_t n, int64_t count, const PhiloxStream& rng) {
  return randomk_indices(n, count, rng);
}

constexpr SparseOps kSparse{.shape = shape, .draw = draw};

#if GRADCOMM_WITH_CUDA
void gpu_draw(const CompressorSpec& /*spec*/, int64_t n, int64_t count, const PhiloxStream& rng, GpuSparseWorkspace& ws,
              cudaStream_t stream) {
  gpu_randomk_indices(n, count, rng, ws, stream);
}
constexpr GpuSparseOps kGpuOps{.draw = gpu_draw};
constexpr const GpuSparseOps* kGpu = &kGpuOps;
#else
constexpr const GpuSparseOps* kGpu = nullptr;  // built without CUDA
#endif

bool always(const CompressorSpec&) { return true; }  // the draws change from step to step

constexpr Family kRandomkFamily{.id = CompressorId::kRandomk,
                                .name = "randomk",
                                .keys = kKeys,
                                .ef_default = true,
                                .values_default = ValueType::kFp32,
                                .collective = Collective::kSharedIndices,
                                .parse = parse,
                                .canonical = canonical,
                                .keeps_state = always,
                                .sparse = &kSparse,
                                .gpu_sparse = kGpu};

}  // namespace

const Family& randomk_family() { return kRandomkFamily; }

}  // namespace gradcomm::detail
