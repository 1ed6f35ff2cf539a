// PowerSGD on the GPU (gpu_powersgd.h): the cuBLAS products and the kernels that draw,
// orthonormalize and reconstruct. Layers as elsewhere: the arithmetic is
// gpu_powersgd_logic.h's GRADCOMM_HD helpers; kernels add the thread mapping; launchers
// batch the plan's entries, launch on the caller's stream, check, never synchronize.
//
//   draw_q_kernel           grid-stride over the Q buffer: initial_q(s, e)
//   orthonormalize_kernel   one block of kOrthoThreads per matrix, modified Gram-Schmidt
//                           (below); blockIdx.x = entry of the batch
//   gather_dense_kernel     dense parts into the P buffer, behind the Ps
//   reconstruct_kernel      matrices: P Q^T element by element (/N, residual)
//   finish_dense_kernel     dense parts: their sum back into the tensor (/N, residual 0)
// The element kernels take blockIdx.y = entry of the batch and stride over its
// elements with blockIdx.x: every element is written by one thread, once.
//
// Modified Gram-Schmidt in one block, for column j = 0 .. r-1:
//   norm2 = sum_i a[i][j]^2           (block_sum: partials of column_dot_partial, then
//   a[.][j] *= column_scale(norm2)     the fixed tree of tree_level, all in double)
//   for k > j: d = float(sum_i a[i][j] a[i][k]); a[.][k] -= d a[.][j]
// Thread t owns rows t, t + kOrthoThreads, ...: it reads and writes only those, so the
// barriers inside block_sum are the only ones needed. No atomics anywhere: the same
// input gives the same bits on every run and every rank.
//
// --fmad=false (CMakeLists.txt): no multiply-add contraction, so the products and sums
// round as the CPU's (reconstruct_sum, the Gram-Schmidt update).
#include <cublas_v2.h>

#include <algorithm>
#include <sstream>

#include "compressors/lowrank/gpu_powersgd.h"
#include "cublas_loader.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/grid.cuh"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

using powersgd::Entry;
using powersgd::EntryBatch;

// cuBLAS's entry points (opened at the first PowerSGD call on a CUDA tensor).
const CublasApi& cublas() { return cublas_api("PowerSGD on CUDA tensors"); }

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;
// cuBLAS's documented workspace recommendation for Hopper (4 MiB suffices before it).
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;

void check_cublas(cublasStatus_t status, const char* expression, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::ostringstream text;
  text << "cuBLAS error " << cublas().status_name(status) << " (" << cublas().status_string(status) << ") in `"
       << expression << "` at " << file << ":" << line;
  (void)cudaGetLastError();  // as throw_cuda_error: no stale error for the next launch check
  throw CudaError(text.str());
}
#define GRADCOMM_CUBLAS_CHECK(expr) check_cublas((expr), #expr, __FILE__, __LINE__)

// ---- block helpers ------------------------------------------------------------------------

// The sum of every thread's `v` over the block, the same on every thread: the partials
// in shared memory, folded by powersgd::tree_level with a barrier between levels.
__device__ double block_sum(double v, double* partial) {
  const int t = static_cast<int>(threadIdx.x);
  partial[t] = v;
  __syncthreads();
  for (int half = powersgd::kOrthoThreads / 2; half > 0; half /= 2) {
    powersgd::tree_level(partial, t, half);
    __syncthreads();
  }
  const double total = partial[0];
  __syncthreads();  // every thread has read the total before the next call overwrites it
  return total;
}

// ---- kernels ------------------------------------------------------------------------------

__global__ void draw_q_kernel(float* q, int64_t floats, PhiloxStream s) {
  for (int64_t e = first_thread(); e < floats; e += thread_stride()) {
    q[e] = powersgd::initial_q(s, static_cast<uint64_t>(e));
  }
}

__global__ void __launch_bounds__(powersgd::kOrthoThreads)
    orthonormalize_kernel(EntryBatch batch, float* buf, Factor factor) {
  __shared__ double partial[powersgd::kOrthoThreads];
  __shared__ double before[powersgd::kMaxRank];  // each column's norm before any projection
  const Entry& e = batch.entries[blockIdx.x];
  const bool p_side = factor == Factor::kP;
  float* a = buf + (p_side ? e.p_offset : e.q_offset);
  const int64_t rows = p_side ? e.rows : e.cols;
  const int r = e.rank;
  const int t = static_cast<int>(threadIdx.x);
  constexpr int kStride = powersgd::kOrthoThreads;
  for (int j = 0; j < r; ++j) {
    const double norm2 = block_sum(powersgd::column_dot_partial(a, rows, r, j, j, t, kStride), partial);
    if (t == 0) before[j] = sqrt(norm2);
  }
  __syncthreads();
  for (int j = 0; j < r; ++j) {
    const double norm2 = block_sum(powersgd::column_dot_partial(a, rows, r, j, j, t, kStride), partial);
    // Every thread holds the same norm2, so the whole block takes the same branch.
    if (powersgd::only_rounding_left(sqrt(norm2), before[j])) {
      for (int64_t i = t; i < rows; i += kStride) a[i * r + j] = 0.0f;
      continue;
    }
    const float scale = powersgd::column_scale(norm2);
    for (int64_t i = t; i < rows; i += kStride) a[i * r + j] *= scale;
    for (int k = j + 1; k < r; ++k) {
      const auto d = static_cast<float>(block_sum(powersgd::column_dot_partial(a, rows, r, j, k, t, kStride), partial));
      for (int64_t i = t; i < rows; i += kStride) a[i * r + k] -= d * a[i * r + j];
    }
  }
}

__global__ void gather_dense_kernel(EntryBatch batch, const float* data, float* p_buf) {
  const Entry& e = batch.entries[blockIdx.y];
  const float* src = data + e.offset;
  float* dst = p_buf + e.p_offset;
  for (int64_t i = first_thread(); i < e.numel; i += thread_stride()) dst[i] = src[i];
}

// powersgd.cc's reconstruct, one element (i, j) per thread.
__global__ void reconstruct_kernel(EntryBatch batch, const float* p_buf, const float* q, int n, bool average,
                                   float* data, float* residual) {
  const Entry& e = batch.entries[blockIdx.y];
  const int r = e.rank;
  const float* p = p_buf + e.p_offset;
  const float* qe = q + e.q_offset;
  float* out = data + e.offset;
  float* res = residual != nullptr ? residual + e.offset : nullptr;
  for (int64_t at = first_thread(); at < e.numel; at += thread_stride()) {
    const int64_t i = at / e.cols;
    const int64_t j = at - i * e.cols;
    powersgd::finish_element(powersgd::reconstruct_sum(p + i * r, qe + j * r, r), n, average, out + at,
                             res != nullptr ? res + at : nullptr);
  }
}

// Dense parts: sent exactly, so nothing is left over for the residual.
__global__ void finish_dense_kernel(EntryBatch batch, const float* p_buf, int n, bool average, float* data,
                                    float* residual) {
  const Entry& e = batch.entries[blockIdx.y];
  const float* sum = p_buf + e.p_offset;
  float* out = data + e.offset;
  float* res = residual != nullptr ? residual + e.offset : nullptr;
  for (int64_t i = first_thread(); i < e.numel; i += thread_stride()) {
    // sum may be out itself (an all-dense call is reduced in place): read, then write.
    powersgd::finish_element(sum[i], n, average, out + i, nullptr);
    if (res != nullptr) res[i] = 0.0f;
  }
}

// ---- launch helpers -----------------------------------------------------------------------

// Grid for an element kernel over a batch: x covers the largest entry (capped to fill
// the GPU; grid-stride loops take the rest), y = one row of blocks per entry.
dim3 element_grid(const EntryBatch& batch) {
  int64_t largest = 0;
  for (int b = 0; b < batch.count; ++b) largest = std::max(largest, batch.entries[b].numel);
  return dim3(grid_for(largest, kThreads, kBlocksPerSm), static_cast<unsigned>(batch.count));
}

void sgemm(cublasHandle_t handle, const powersgd::Gemm& g, const float* a, const float* b, float* c) {
  const float one = 1.0f, zero = 0.0f;
  GRADCOMM_CUBLAS_CHECK(cublas().sgemm(handle, CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, &one,
                                       a, g.lda, b, g.ldb, &zero, c, g.ldc));
}

}  // namespace

// ---- GpuBlas ------------------------------------------------------------------------------

GpuBlas::GpuBlas() : device_(cuda_current_device()), workspace_(kBlasWorkspaceBytes) {
  cublasHandle_t handle = nullptr;
  GRADCOMM_CUBLAS_CHECK(cublas().create(&handle));
  // Full fp32 products: no TF32 or BF16x9 tensor-core shortcuts (the default mode
  // already excludes them; stated here because the tolerance in gpu_powersgd.h needs it).
  const cublasStatus_t status = cublas().set_math_mode(handle, CUBLAS_DEFAULT_MATH);
  if (status != CUBLAS_STATUS_SUCCESS) (void)cublas().destroy(handle);
  GRADCOMM_CUBLAS_CHECK(status);
  handle_ = handle;
}

GpuBlas::~GpuBlas() {
  if (handle_ == nullptr) return;
  try {
    DeviceGuard guard(device_);
    (void)cublas().destroy(handle_);  // teardown: nothing useful to do about a failure
  } catch (const std::exception&) {
    (void)cublas().destroy(handle_);
  }
}

cublasContext* GpuBlas::bind(cudaStream_t stream) {
  GRADCOMM_CUBLAS_CHECK(cublas().set_stream(handle_, stream));
  GRADCOMM_CUBLAS_CHECK(cublas().set_workspace(handle_, workspace_.data(), workspace_.size()));
  return handle_;
}

// ---- launchers ----------------------------------------------------------------------------

void gpu_powersgd_draw_q(float* q, int64_t floats, const PhiloxStream& s, cudaStream_t stream) {
  if (floats <= 0) return;
  draw_q_kernel<<<grid_for(floats, kThreads, kBlocksPerSm), kThreads, 0, stream>>>(q, floats, s);
  GRADCOMM_CUDA_CHECK_LAUNCH();
}

void gpu_powersgd_orthonormalize(const powersgd::Plan& plan, float* buf, Factor factor, cudaStream_t stream) {
  for (const EntryBatch& batch : powersgd::batches(plan, /*compressed=*/true)) {
    orthonormalize_kernel<<<batch.count, powersgd::kOrthoThreads, 0, stream>>>(batch, buf, factor);
    GRADCOMM_CUDA_CHECK_LAUNCH();
  }
}

void gpu_powersgd_project(GpuBlas& blas, const powersgd::Plan& plan, const float* data, const float* q, float* p_buf,
                          cudaStream_t stream) {
  if (plan.matrices > 0) {
    cublasHandle_t handle = blas.bind(stream);
    for (const Entry& e : plan.entries) {
      if (e.rank > 0) sgemm(handle, powersgd::gemm_for_p(e), q + e.q_offset, data + e.offset, p_buf + e.p_offset);
    }
  }
  for (const EntryBatch& batch : powersgd::batches(plan, /*compressed=*/false)) {
    gather_dense_kernel<<<element_grid(batch), kThreads, 0, stream>>>(batch, data, p_buf);
    GRADCOMM_CUDA_CHECK_LAUNCH();
  }
}

void gpu_powersgd_project_back(GpuBlas& blas, const powersgd::Plan& plan, const float* data, const float* p_buf,
                               float* q, cudaStream_t stream) {
  if (plan.matrices == 0) return;
  cublasHandle_t handle = blas.bind(stream);
  for (const Entry& e : plan.entries) {
    if (e.rank > 0) sgemm(handle, powersgd::gemm_for_q(e), p_buf + e.p_offset, data + e.offset, q + e.q_offset);
  }
}

void gpu_powersgd_reconstruct(const powersgd::Plan& plan, const float* p_buf, const float* q, int n, bool average,
                              float* data, float* residual, cudaStream_t stream) {
  for (const EntryBatch& batch : powersgd::batches(plan, /*compressed=*/true)) {
    reconstruct_kernel<<<element_grid(batch), kThreads, 0, stream>>>(batch, p_buf, q, n, average, data, residual);
    GRADCOMM_CUDA_CHECK_LAUNCH();
  }
  for (const EntryBatch& batch : powersgd::batches(plan, /*compressed=*/false)) {
    finish_dense_kernel<<<element_grid(batch), kThreads, 0, stream>>>(batch, p_buf, n, average, data, residual);
    GRADCOMM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace gradcomm::detail
