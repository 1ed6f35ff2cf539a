// sketch: a rows x cols count-sketch of acc (count_sketch.cc) summed densely; the
// heavy hitters it recovers are the same on every rank, and their exact values are
// then summed as random-k's are.
#include <fmt/format.h>

#include "compressors/family.h"
#include "compressors/sketch/sketch.h"
#include "compressors/sparse/sparse.h"
#include "compressors/spec.h"

#if GRADCOMM_WITH_CUDA
#include "compressors/sketch/gpu_sketch.h"  // GpuCountSketch
#endif

namespace gradcomm::detail {
namespace {

constexpr int64_t kMaxRows = 64;
constexpr int64_t kMinCols = 16;
constexpr int64_t kMaxCols = int64_t{1} << 24;  // 64 rows x 2^24 cols x 4 B = 4 GiB table at most

constexpr std::string_view kKeys[] = {"rows",     "cols",   "k",    "ratio", "ef",
                                      "min_numel", "warmup", "seed", "values"};

std::shared_ptr<const FamilyParams> parse(const SpecReader& r, CompressorSpec& /*common*/) {
  auto s = std::make_shared<SketchParams>();
  s->rows = static_cast<int>(r.integer("rows", 1, kMaxRows, 5));
  // cols = 0 is the default "choose from k at use"; an explicit value must be a
  // real table width.
  if (const auto cols = r.take("cols")) {
    s->cols = static_cast<int>(*cols == "0" ? 0 : r.parse_integer("cols", *cols, kMinCols, kMaxCols));
  }
  r.ratio_or_k(s->ratio, s->k);
  return s;
}

std::string canonical(const CompressorSpec& spec) {
  const auto& s = spec.family<SketchParams>();
  return fmt::format("rows={},cols={},{},", s.rows, s.cols, ratio_or_k_text(s.ratio, s.k));
}

bool never(const CompressorSpec&) { return false; }  // its table and k are sized per tensor

SparseShape shape(const CompressorSpec& spec) {
  const auto& p = spec.family<SketchParams>();
  SparseShape s;
  s.ratio = p.ratio;
  s.k = p.k;
  return s;
}

SparseTable table(const CompressorSpec& spec, int64_t count) {
  const auto& p = spec.family<SketchParams>();
  return SparseTable{p.rows, sketch_columns(p, count)};
}

void accumulate(const CompressorSpec& /*spec*/, SparseTable t, const PhiloxStream& rng, const float* acc, int64_t n,
                float* cells) {
  CountSketch(t.rows, t.cols, rng).accumulate(acc, n, cells);
}

// The heavy hitters: the exact top-k of the estimates.
std::vector<uint64_t> recover(const CompressorSpec& /*spec*/, SparseTable t, const PhiloxStream& rng,
                              const float* cells, int64_t n, int64_t count) {
  std::vector<float> estimate(static_cast<size_t>(n));
  CountSketch(t.rows, t.cols, rng).estimate(cells, n, estimate.data());
  return topk_select(estimate.data(), n, count, TopkSelect::kExact, rng).indices;
}

constexpr SparseOps kSparse{.shape = shape, .table = table, .accumulate = accumulate, .recover = recover};

#if GRADCOMM_WITH_CUDA
void gpu_accumulate(const CompressorSpec& /*spec*/, SparseTable t, const PhiloxStream& rng, const float* data,
                    float* residual, int64_t n, float* cells, cudaStream_t stream) {
  GpuCountSketch(t.rows, t.cols, rng).accumulate(data, residual, n, cells, stream);
}
void gpu_recover(const CompressorSpec& /*spec*/, SparseTable t, const PhiloxStream& rng, const float* cells, int64_t n,
                 int64_t count, GpuSparseWorkspace& ws, cudaStream_t stream) {
  GpuCountSketch(t.rows, t.cols, rng).recover(cells, n, count, ws, stream);
}
constexpr GpuSparseOps kGpuOps{.accumulate = gpu_accumulate, .recover = gpu_recover};
constexpr const GpuSparseOps* kGpu = &kGpuOps;
#else
constexpr const GpuSparseOps* kGpu = nullptr;  // built without CUDA
#endif

constexpr Family kSketchFamily{.id = CompressorId::kSketch,
                               .name = "sketch",
                               .keys = kKeys,
                               .ef_default = true,
                               .values_default = ValueType::kFp32,
                               .collective = Collective::kTableThenValues,
                               .parse = parse,
                               .canonical = canonical,
                               .fusable = never,
                               .sparse = &kSparse,
                               .gpu_sparse = kGpu};

}  // namespace

const Family& sketch_family() { return kSketchFamily; }

}  // namespace gradcomm::detail
