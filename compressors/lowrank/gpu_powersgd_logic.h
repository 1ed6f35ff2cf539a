// The arithmetic and index math of PowerSGD's CUDA kernels (gpu_powersgd.cu), in
// GRADCOMM_HD functions and host helpers free of CUDA headers, so the host test
// (tests/unit/test_powersgd_gpu_logic.cc) can hold them to the CPU's powersgd.h in
// every build. The kernels add only the thread mapping.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "compressors/lowrank/powersgd_logic.h"

namespace gradcomm::detail::powersgd {

// ---- shared arithmetic (GRADCOMM_HD) ------------------------------------------------------

// Threads of the orthonormalizing block (one block per matrix): a power of two, for the
// reduction tree.
inline constexpr int kOrthoThreads = 256;

// Thread t's share of the dot product of columns j and k of a (rows x r, row-major):
// the rows i = t, t + threads, ... in increasing order, products exact in double. Each
// thread only ever reads and writes its own rows, so the kernel needs no barrier
// between a column's update and the next dot product except the reduction's.
GRADCOMM_HD double column_dot_partial(const float* a, int64_t rows, int r, int j, int k, int t, int threads) {
  double sum = 0;
  for (int64_t i = t; i < rows; i += threads) {
    sum += static_cast<double>(a[i * r + j]) * static_cast<double>(a[i * r + k]);
  }
  return sum;
}

// One level of the kernel's reduction tree over `partial` (a power of two long):
// partial[t] += partial[t + half] for t < half, with half = threads/2, threads/4, ..., 1;
// the total ends in partial[0]. Host code runs the levels in sequence, the kernel with
// a barrier between them: the same additions in the same order.
GRADCOMM_HD void tree_level(double* partial, int t, int half) {
  if (t < half) partial[t] += partial[t + half];
}

// The factor a column is scaled by: 1 / (norm + kEpsilon), as powersgd.cc computes it
// (the norm rounded to fp32 first).
GRADCOMM_HD float column_scale(double norm2) {
#if defined(__CUDA_ARCH__)
  const double norm = __dsqrt_rn(norm2);
#else
  const double norm = std::sqrt(norm2);
#endif
  return 1.0f / (static_cast<float>(norm) + kEpsilon);
}

// (P Q^T)[i][j] for P's row i and Q's row j (r floats each): the CPU's order, the first
// product then the others added in l order.
GRADCOMM_HD float reconstruct_sum(const float* p_row, const float* q_row, int r) {
  float s = p_row[0] * q_row[0];
  for (int l = 1; l < r; ++l) s += p_row[l] * q_row[l];
  return s;
}

// An element of a matrix once its sum s is known: `out` holds acc on entry and
// receives s (sum) or s / n (avg); the residual, when kept, acc - s / n.
GRADCOMM_HD void finish_element(float s, int n, bool average, float* out, float* residual) {
  const auto fn = static_cast<float>(n);
  if (residual != nullptr) *residual = *out - s / fn;
  *out = average ? s / fn : s;
}

// ---- launch batches -----------------------------------------------------------------------

// The kernels take their entries by value, up to kBatchEntries per launch (a few KiB of
// kernel parameters): no descriptor upload, so no copy and no host synchronization.
inline constexpr int kBatchEntries = 32;
struct EntryBatch {
  int count = 0;
  Entry entries[kBatchEntries];
};

// The plan's matrices (compressed == true) or dense parts, in plan order, in batches.
inline std::vector<EntryBatch> batches(const Plan& plan, bool compressed) {
  std::vector<EntryBatch> out;
  for (const Entry& e : plan.entries) {
    if ((e.rank > 0) != compressed || e.numel == 0) continue;
    if (out.empty() || out.back().count == kBatchEntries) out.emplace_back();
    out.back().entries[out.back().count++] = e;
  }
  return out;
}

// ---- cuBLAS products ----------------------------------------------------------------------

// The arguments of one column-major cublasSgemm: C (m x n, ldc) = A (m x k, lda) *
// op(B) (k x n), op(B) = B^T when trans_b (B then n x k), else B; A is never
// transposed. Row-major data read as column-major is its transpose: M (rows x cols,
// row-major) is M^T (cols x rows, ld cols), and P, Q (rows x r, cols x r) are P^T, Q^T
// (r x rows, r x cols, ld r). So both products below come out row-major, with no copy.
struct Gemm {
  bool trans_b = false;
  int m = 0, n = 0, k = 0;
  int lda = 0, ldb = 0, ldc = 0;
};

// P = M Q  <=>  P^T (r x rows) = Q^T (r x cols) * M^T (cols x rows).
inline Gemm gemm_for_p(const Entry& e) {
  const int rows = static_cast<int>(e.rows), cols = static_cast<int>(e.cols);
  return Gemm{false, e.rank, rows, cols, e.rank, cols, e.rank};
}

// Q = M^T P  <=>  Q^T (r x cols) = P^T (r x rows) * (M^T)^T (rows x cols).
inline Gemm gemm_for_q(const Entry& e) {
  const int rows = static_cast<int>(e.rows), cols = static_cast<int>(e.cols);
  return Gemm{true, e.rank, cols, rows, e.rank, cols, e.rank};
}

}  // namespace gradcomm::detail::powersgd
