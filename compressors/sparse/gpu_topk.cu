// Top-k selection on the GPU (gpu_sparse.h: gpu_topk_select), the CUDA twin of
// topk_select.cc. Launchers only: the kernels are radix_select.cuh's, the
// arithmetic compressors/sparse/topk_logic.h's, both shared with the CPU tests.
//
// exact, n elements, k < n:           reads of the input
//   histogram pass 0 (+ EF fold)      1 (+ residual read and write)
//   histogram pass 1 (+ collect)      1
//   histogram pass 2                  0 when pass 0's bucket was collected, else 1
//   tile count, tile scatter          2
// sample: the sample (m random reads), a radix select over the m sampled keys,
//   tile count (+ EF fold) with T, a device-side bounds check, tile scatter; the
//   exact pipeline is enqueued behind it with its state told to skip unless the
//   count was out of bounds, so the fallback costs no host synchronization.
// Error feedback: the tile scatter zeroes the residual at the selected indices; with
// 16-bit values one more kernel over the selection (count entries, not n) sets them to
// the rounding the wire drops (sparse_code.h's sparse_rounding_residual), which for
// fp32 is the zero already there.
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstddef>
#include <sstream>

#include "compressors/sparse/gpu_sparse.h"
#include "compressors/sparse/sparse_code.h"
#include "compressors/sparse/topk_logic.h"
#include "cuda/check.h"
#include "cuda/grid.cuh"
#include "cuda/device.h"
#include "compressors/sparse/radix_select.cuh"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

constexpr int kHistBlocksPerSm = 8;  // 8 x 256 threads and 8 x 8 KiB shared per SM
constexpr int kThreads = 256;

// Enough blocks to fill the GPU, and enough that no block counts 2^31 keys (u32
// shared counters).
unsigned histogram_grid(int64_t n) {
  const int64_t fill = static_cast<int64_t>(cuda_sm_count(cuda_current_device())) * kHistBlocksPerSm;
  const int64_t wanted = std::min<int64_t>((std::max<int64_t>(n, 1) + kThreads - 1) / kThreads, fill);
  const int64_t needed = (n >> 31) + 1;
  return static_cast<unsigned>(std::max(wanted, needed));
}

int64_t tiles_for(int64_t n) { return (n + radix::kTile - 1) / radix::kTile; }

SelectState* states(GpuSparseWorkspace& ws) { return ws.state_.as<SelectState>(); }

// Grows the workspace for a selection over n elements with the given capacity and
// sample size (0: none). Only the first call at a size allocates.
void reserve(GpuSparseWorkspace& ws, int64_t n, int64_t capacity, int64_t sample) {
  ws.state_.reserve(2 * sizeof(SelectState));
  ws.hist_.reserve(topk::kRadixBuckets * sizeof(unsigned long long));
  ws.candidate_capacity_ = n / 16;  // as the CPU: a bucket of <= n/16 keys is collected
  ws.candidates_.reserve(static_cast<size_t>(std::max<int64_t>(ws.candidate_capacity_, 1)) * sizeof(uint32_t));
  const int64_t tiles = std::max<int64_t>(tiles_for(n), 1);
  ws.tiles_.reserve(static_cast<size_t>(tiles) * sizeof(TileCount));
  ws.tile_offsets_.reserve(static_cast<size_t>(tiles) * sizeof(TileCount));
  size_t scan_bytes = 0;
  GRADCOMM_CUDA_CHECK(cub::DeviceScan::ExclusiveScan(nullptr, scan_bytes, ws.tiles_.as<TileCount>(),
                                                     ws.tile_offsets_.as<TileCount>(), TileCountSum{},
                                                     TileCount{0, 0}, tiles));
  ws.cub_temp_.reserve(std::max<size_t>(scan_bytes, 1));
  ws.indices_.reserve(static_cast<size_t>(std::max<int64_t>(capacity, 1)) * sizeof(uint64_t));
  ws.values_.reserve(static_cast<size_t>(std::max<int64_t>(capacity, 1)) * sizeof(float));
  if (sample > 0) ws.sample_keys_.reserve(static_cast<size_t>(sample) * sizeof(uint32_t));
  ws.capacity_ = capacity;
}

void init_state(SelectState* s, int64_t need, uint64_t count, uint64_t take_equal, cudaStream_t stream) {
  radix::init_kernel<<<1, 1, 0, stream>>>(s, need, count, take_equal);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

// The three histogram + pick passes over src (n keys) for state s.
template <class FirstSrc, class Src>
void radix_passes(FirstSrc first, Src src, int64_t n, SelectState* s, GpuSparseWorkspace& ws, bool collect,
                  bool exact_ties, cudaStream_t stream) {
  auto* hist = ws.hist_.as<unsigned long long>();
  uint32_t* cand = collect ? ws.candidates_.as<uint32_t>() : nullptr;
  const int64_t cap = collect ? ws.candidate_capacity_ : 0;
  const unsigned grid = histogram_grid(n);
  radix::histogram_kernel<<<grid, kThreads, 0, stream>>>(first, n, 0, s, hist, cand, cap);
  GRADCOMM_CUDA_CHECK_LAUNCH();
  for (int pass = 0; pass < topk::kRadixPasses; ++pass) {
    if (pass > 0) {
      radix::histogram_kernel<<<grid, kThreads, 0, stream>>>(src, n, pass, s, hist, cand, cap);
      GRADCOMM_CUDA_CHECK_LAUNCH();
    }
    radix::pick_kernel<<<1, topk::kPickThreads, 0, stream>>>(pass, s, hist, cap, exact_ties);
    GRADCOMM_CUDA_CHECK_LAUNCH();
  }
}

// Tile counts of keys > / == sel's threshold (reading through src, which may fold
// the residual), then their exclusive scan.
template <class Src>
void count_tiles(Src src, int64_t n, const SelectState* sel, const uint32_t* run_flag, uint32_t run_value,
                 GpuSparseWorkspace& ws, cudaStream_t stream) {
  const int64_t tiles = tiles_for(n);
  radix::tile_count_kernel<<<static_cast<unsigned>(tiles), radix::kTileThreads, 0, stream>>>(
      src, n, sel, run_flag, run_value, ws.tiles_.as<TileCount>());
  GRADCOMM_CUDA_CHECK_LAUNCH();
  size_t bytes = ws.cub_temp_.size();
  GRADCOMM_CUDA_CHECK(cub::DeviceScan::ExclusiveScan(ws.cub_temp_.data(), bytes, ws.tiles_.as<TileCount>(),
                                                     ws.tile_offsets_.as<TileCount>(), TileCountSum{},
                                                     TileCount{0, 0}, tiles, stream));
}

void scatter_tiles(const float* acc, int64_t n, const SelectState* sel, const uint32_t* run_flag, uint32_t run_value,
                   float* zero_in, GpuSparseWorkspace& ws, cudaStream_t stream) {
  radix::tile_scatter_kernel<<<static_cast<unsigned>(tiles_for(n)), radix::kTileThreads, 0, stream>>>(
      acc, n, sel, run_flag, run_value, ws.tile_offsets_.as<TileCount>(), ws.indices_.as<uint64_t>(),
      ws.values_.as<float>(), ws.capacity_, zero_in);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

// Exact top-k on state 0 (initialised by the caller; every kernel returns at once
// when its skip flag is set). fold: acc = grad + residual is formed by pass 0.
void exact_pipeline(const float* grad, float* residual, bool fold, int64_t n, GpuSparseWorkspace& ws,
                    cudaStream_t stream) {
  SelectState* s = states(ws);
  const float* acc = residual != nullptr ? residual : grad;
  if (fold) {
    radix_passes(radix::FoldKeys{grad, residual}, radix::AccKeys{acc}, n, s, ws, true, true, stream);
  } else {
    radix_passes(radix::AccKeys{acc}, radix::AccKeys{acc}, n, s, ws, true, true, stream);
  }
  count_tiles(radix::AccKeys{acc}, n, s, &s->skip, 0, ws, stream);
  scatter_tiles(acc, n, s, &s->skip, 0, residual, ws, stream);
}

__global__ void sample_kernel(const float* grad, const float* residual, int64_t n, int64_t m, PhiloxStream rng,
                              uint32_t* keys) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < m; j += stride) {
    const auto pos = static_cast<int64_t>(topk::sample_position(rng, static_cast<uint64_t>(j), static_cast<uint64_t>(n)));
    // acc as the CPU forms it (data += residual), before any fold has happened.
    const float v = residual != nullptr ? __fadd_rn(grad[pos], residual[pos]) : grad[pos];
    keys[j] = topk::magnitude_key(v);
  }
}

// k >= n: everything, in order.
__global__ void take_all_kernel(const float* grad, float* residual, int64_t n, ValueType type, uint64_t* indices,
                                float* values) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    indices[i] = static_cast<uint64_t>(i);
    if (residual != nullptr) {
      const float x = __fadd_rn(grad[i], residual[i]);
      values[i] = x;
      residual[i] = sparse_rounding_residual(x, sparse_round(x, type));
    } else {
      values[i] = grad[i];
    }
  }
}

// residual[indices[j]] = the rounding of values[j] (the selection's acc values), after
// the scatter zeroed it.
__global__ void keep_rounding_kernel(float* residual, const uint64_t* indices, const float* values,
                                     const uint64_t* count, int64_t capacity, ValueType type) {
  const uint64_t c = *count < static_cast<uint64_t>(capacity) ? *count : static_cast<uint64_t>(capacity);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; static_cast<uint64_t>(j) < c;
       j += stride) {
    const float x = values[j];
    residual[indices[j]] = sparse_rounding_residual(x, sparse_round(x, type));
  }
}

void keep_rounding(float* residual, ValueType type, GpuSparseWorkspace& ws, cudaStream_t stream) {
  if (residual == nullptr || type == ValueType::kFp32 || ws.capacity_ <= 0) return;
  keep_rounding_kernel<<<grid_for(ws.capacity_, kThreads, kHistBlocksPerSm), kThreads, 0, stream>>>(
      residual, ws.indices_.as<uint64_t>(), ws.values_.as<float>(), ws.count(), ws.capacity_, type);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

}  // namespace

const uint64_t* GpuSparseWorkspace::count() const {
  // The count lives in state 0 (SelectState::count); address arithmetic only.
  return reinterpret_cast<const uint64_t*>(&state_.as<SelectState>()->count);
}

int64_t GpuSparseWorkspace::read_count(cudaStream_t stream) {
  if (state_.empty()) return 0;
  host_count_.reserve(sizeof(uint64_t));
  GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(host_count_.data(), count(), sizeof(uint64_t), cudaMemcpyDeviceToHost, stream));
  GRADCOMM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return static_cast<int64_t>(*host_count_.as<uint64_t>());
}

void gpu_topk_select(const float* grad, float* residual, int64_t n, int64_t k, TopkSelect select,
                     const PhiloxStream& rng, ValueType values, GpuSparseWorkspace& ws, cudaStream_t stream) {
  if (n < 0 || k < 0) throw_invalid("gpu_topk_select: n = ", n, " and k = ", k, " must be >= 0");
  if (n > 0 && grad == nullptr) throw_invalid("gpu_topk_select: grad is null with n = ", n);
  if (select != TopkSelect::kExact && select != TopkSelect::kSample) {
    throw_invalid("gpu_topk_select: unknown select mode ", static_cast<int>(select));
  }
  if (n == 0 || k == 0) {  // nothing selected; with EF the residual still becomes acc
    reserve(ws, 0, 0, 0);
    init_state(states(ws), 0, 0, 0, stream);
    if (n > 0 && residual != nullptr) gpu_fold_residual(grad, residual, n, stream);
    return;
  }
  if (k >= n) {
    reserve(ws, 0, n, 0);
    init_state(states(ws), 0, static_cast<uint64_t>(n), 0, stream);
    take_all_kernel<<<grid_for(n, kThreads, kHistBlocksPerSm), kThreads, 0, stream>>>(
        grad, residual, n, values, ws.indices_.as<uint64_t>(), ws.values_.as<float>());
    GRADCOMM_CUDA_CHECK_LAUNCH();
    return;
  }
  const topk::SamplePlan plan = select == TopkSelect::kSample ? topk::sample_plan(n, k) : topk::SamplePlan{true};
  if (plan.exact) {
    reserve(ws, n, k, 0);
    SelectState* s = states(ws);
    GRADCOMM_CUDA_CHECK(cudaMemsetAsync(ws.hist_.data(), 0, ws.hist_.size(), stream));
    init_state(s, k, static_cast<uint64_t>(k), 0, stream);
    exact_pipeline(grad, residual, residual != nullptr, n, ws, stream);
    keep_rounding(residual, values, ws, stream);
    return;
  }

  // select=sample. State 0: the exact fallback (count k unless the sample's result
  // is accepted); state 1: the radix select over the sample, taking all ties.
  reserve(ws, n, plan.upper, plan.m);
  SelectState* s = states(ws);
  SelectState* sampled = s + 1;
  GRADCOMM_CUDA_CHECK(cudaMemsetAsync(ws.hist_.data(), 0, ws.hist_.size(), stream));
  init_state(s, k, static_cast<uint64_t>(k), 0, stream);
  init_state(sampled, plan.ks, 0, topk::kTakeAllEqual, stream);
  sample_kernel<<<grid_for(plan.m, kThreads, kHistBlocksPerSm), kThreads, 0, stream>>>(grad, residual, n, plan.m, rng,
                                                                   ws.sample_keys_.as<uint32_t>());
  GRADCOMM_CUDA_CHECK_LAUNCH();
  const radix::RawKeys sample_keys{ws.sample_keys_.as<uint32_t>()};
  radix_passes(sample_keys, sample_keys, plan.m, sampled, ws, false, false, stream);

  // Every key >= T: count per tile (folding the residual: this is the first full
  // pass), check the bounds on the device, scatter when they hold.
  const float* acc = residual != nullptr ? residual : grad;
  if (residual != nullptr) {
    count_tiles(radix::FoldKeys{grad, residual}, n, sampled, &sampled->skip, 0, ws, stream);
  } else {
    count_tiles(radix::AccKeys{grad}, n, sampled, &sampled->skip, 0, ws, stream);
  }
  const int64_t tiles = tiles_for(n);
  radix::finalize_kernel<<<1, 1, 0, stream>>>(ws.tiles_.as<TileCount>(), ws.tile_offsets_.as<TileCount>(), tiles,
                                              sampled, s, plan.lower, plan.upper);
  GRADCOMM_CUDA_CHECK_LAUNCH();
  scatter_tiles(acc, n, sampled, &s->skip, 1, residual, ws, stream);
  // Out of bounds: the exact top-k of acc (already folded), as the CPU falls back.
  exact_pipeline(grad, residual, false, n, ws, stream);
  keep_rounding(residual, values, ws, stream);
}

}  // namespace gradcomm::detail
