// Count sketch on the GPU (gpu_sparse.h: GpuCountSketch), the CUDA twin of
// count_sketch.cc with the same hashes and median (sketch_hash.h).
//
// accumulate: one thread per element (grid-stride), all rows: read x once, add
//   s_r(i) * x[i] into each row's cell with a float atomic. Two variants:
//   - shared: the whole table fits in a block's shared memory (<= kSharedTableBytes)
//     and the input is long enough to pay for it: each block sums into a private
//     copy with shared-memory atomics and flushes it with one global atomic per
//     nonzero cell;
//   - global: red.global.add.f32 straight into the table (L2-resident when the table
//     is small enough; this is the bandwidth-limited case for wide sketches).
//   Either way a cell ends as the sum of exactly the terms the CPU adds, in an order
//   that depends on scheduling. Bitwise equality with the CPU is therefore not
//   promised for the table; the difference is bounded by fp32 summation error: for
//   a cell of m terms, |gpu - cpu| <= 2 (m - 1) 2^-24 sum |terms| (each order is within
//   (m - 1) u sum |terms| of the exact sum, Higham 2002, eq. 4.4). This is harmless:
//   every rank's table goes through the dense allreduce anyway (FORMAT.md).
// estimate: one thread per element gathers its rows' signed cells, sorts them with
//   the shared odd-even network and takes the median: bitwise the CPU's for the same
//   table bits. recover: estimate, then the exact GPU top-k (bitwise the CPU's).
#include <algorithm>
#include <sstream>

#include "compressors/sketch/sketch_hash.h"
#include "compressors/sketch/gpu_sketch.h"
#include "cuda/check.h"
#include "cuda/grid.cuh"
#include "cuda/device.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;
constexpr int kSharedThreads = 1024;
constexpr size_t kSharedTableBytes = 96 * 1024;  // two blocks per SM on sm_90 (228 KiB)

__device__ __forceinline__ void load_salts(uint64_t* salts, int rows, const PhiloxStream& rng) {
  for (int r = threadIdx.x; r < rows; r += blockDim.x) salts[r] = sketch::row_salt(rng, r);
  __syncthreads();
}

// The element's accumulator value; with a residual, folds it (residual = acc).
__device__ __forceinline__ float acc_at(const float* x, float* residual, int64_t i) {
  if (residual == nullptr) return x[i];
  const float a = __fadd_rn(x[i], residual[i]);
  residual[i] = a;
  return a;
}

__global__ void __launch_bounds__(kThreads) accumulate_global_kernel(const float* x, float* residual, int64_t n,
                                                                     int rows, uint32_t cols, PhiloxStream rng,
                                                                     float* table) {
  __shared__ uint64_t salts[sketch::kMaxRows];
  load_salts(salts, rows, rng);
  for (int64_t i = first_thread(); i < n; i += thread_stride()) {
    const float v = acc_at(x, residual, i);
    for (int r = 0; r < rows; ++r) {
      const uint64_t z = sketch::element_hash(salts[r], static_cast<uint64_t>(i));
      atomicAdd(&table[static_cast<size_t>(r) * cols + sketch::column_of(z, cols)], sketch::apply_sign(z, v));
    }
  }
}

__global__ void __launch_bounds__(kSharedThreads) accumulate_shared_kernel(const float* x, float* residual, int64_t n,
                                                                           int rows, uint32_t cols, PhiloxStream rng,
                                                                           float* table) {
  extern __shared__ float local[];  // rows x cols
  __shared__ uint64_t salts[sketch::kMaxRows];
  const int cells = rows * static_cast<int>(cols);
  for (int c = threadIdx.x; c < cells; c += blockDim.x) local[c] = 0.0f;
  load_salts(salts, rows, rng);  // (its barrier also orders the zeroing)
  for (int64_t i = first_thread(); i < n; i += thread_stride()) {
    const float v = acc_at(x, residual, i);
    for (int r = 0; r < rows; ++r) {
      const uint64_t z = sketch::element_hash(salts[r], static_cast<uint64_t>(i));
      atomicAdd(&local[r * static_cast<int>(cols) + static_cast<int>(sketch::column_of(z, cols))],
                sketch::apply_sign(z, v));
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < cells; c += blockDim.x) {
    if (local[c] != 0.0f) atomicAdd(&table[c], local[c]);
  }
}

__global__ void __launch_bounds__(kThreads) estimate_kernel(const float* table, int64_t n, int rows, uint32_t cols,
                                                            PhiloxStream rng, float* estimate) {
  __shared__ uint64_t salts[sketch::kMaxRows];
  load_salts(salts, rows, rng);
  float v[sketch::kMaxRows];
  for (int64_t i = first_thread(); i < n; i += thread_stride()) {
    for (int r = 0; r < rows; ++r) {
      const uint64_t z = sketch::element_hash(salts[r], static_cast<uint64_t>(i));
      v[r] = sketch::apply_sign(z, table[static_cast<size_t>(r) * cols + sketch::column_of(z, cols)]);
    }
    sketch::sort_small(v, rows);
    estimate[i] = sketch::median_of_sorted(v, rows);
  }
}

}  // namespace

GpuCountSketch::GpuCountSketch(int rows, int cols, const PhiloxStream& rng) : rows_(rows), cols_(cols), rng_(rng) {
  if (rows < 1 || rows > sketch::kMaxRows || cols < 1) {
    throw_invalid("GpuCountSketch: rows = ", rows, " must be in [1, ", sketch::kMaxRows, "] and cols = ", cols,
                  " must be >= 1");
  }
}

void GpuCountSketch::accumulate(const float* x, float* residual, int64_t n, float* table, cudaStream_t stream) const {
  if (n < 0) throw_invalid("GpuCountSketch::accumulate: n = ", n, " < 0");
  if (n == 0) return;
  if (x == nullptr || table == nullptr) throw_invalid("GpuCountSketch::accumulate: x or table is null with n = ", n);
  const auto cols = static_cast<uint32_t>(cols_);
  const size_t table_bytes = static_cast<size_t>(rows_) * cols * sizeof(float);
  const int sm = cuda_sm_count(cuda_current_device());
  const int64_t blocks_per_sm = std::min<int64_t>(2, static_cast<int64_t>((228 * 1024) / (table_bytes + 1024)));
  const int64_t shared_grid = static_cast<int64_t>(sm) * std::max<int64_t>(blocks_per_sm, 1);
  // Shared privatization pays when each block's flush (table cells) is small next to
  // its share of the updates (n * rows / grid).
  if (table_bytes <= kSharedTableBytes && shared_grid * static_cast<int64_t>(cols) * 4 <= n) {
    GRADCOMM_CUDA_CHECK(cudaFuncSetAttribute(accumulate_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(table_bytes)));
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(shared_grid, (n + kSharedThreads - 1) / kSharedThreads));
    accumulate_shared_kernel<<<grid, kSharedThreads, table_bytes, stream>>>(x, residual, n, rows_, cols, rng_, table);
  } else {
    accumulate_global_kernel<<<grid_for(n, kThreads, kBlocksPerSm), kThreads, 0, stream>>>(x, residual, n, rows_, cols,
                                                                                          rng_, table);
  }
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

void GpuCountSketch::estimate(const float* table, int64_t n, float* estimate, cudaStream_t stream) const {
  if (n < 0) throw_invalid("GpuCountSketch::estimate: n = ", n, " < 0");
  if (n == 0) return;
  if (table == nullptr || estimate == nullptr) throw_invalid("GpuCountSketch::estimate: table or estimate is null");
  estimate_kernel<<<grid_for(n, kThreads, kBlocksPerSm), kThreads, 0, stream>>>(table, n, rows_,
                                                                               static_cast<uint32_t>(cols_), rng_,
                                                                               estimate);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

void GpuCountSketch::recover(const float* table, int64_t n, int64_t k, GpuSparseWorkspace& ws,
                             cudaStream_t stream) const {
  if (n < 0 || k < 0) throw_invalid("GpuCountSketch::recover: n = ", n, " and k = ", k, " must be >= 0");
  ws.estimate_.reserve(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float));
  estimate(table, n, ws.estimate_.as<float>(), stream);
  gpu_topk_select(ws.estimate_.as<float>(), nullptr, n, k, TopkSelect::kExact, rng_, ValueType::kFp32, ws,
                  stream);
}

}  // namespace gradcomm::detail
