// The trainer's small CUDA kernels (everything that is not a GEMM), as host
// launchers on a stream. Each computes what its CPU counterpart in mlp.cc or
// optimizer.cc computes, in the same order per element, so the two paths agree
// to rounding (GEMMs aside, whose summation order cuBLAS chooses).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "trainer/optimizer.h"

namespace gradcomm::train::cuda {

// z[r, :] = b for every row r in [0, rows).
void broadcast_rows(float* z, const float* b, int64_t rows, int64_t cols, cudaStream_t stream);
// x = max(x, 0).
void relu(float* x, int64_t n, cudaStream_t stream);
// delta[i] = 0 where a[i] <= 0 (ReLU's derivative; `a` is the post-ReLU activation).
void relu_backward(float* delta, const float* a, int64_t n, cudaStream_t stream);
// db[o] = sum over rows of delta[r, o], rows in order (one thread per column).
void column_sums(const float* delta, float* db, int64_t rows, int64_t cols, cudaStream_t stream);
// Per row: loss[r] (float, as mlp.cc computes it), correct[r] (argmax == label);
// when dlogits is not null, (softmax - onehot) / rows.
void softmax_cross_entropy(const float* logits, const uint8_t* labels, int64_t rows, int64_t classes,
                           float* dlogits, float* loss, uint8_t* correct, cudaStream_t stream);
// *flag = 1 when any x[i] is not finite (flag must be zeroed by the caller).
void flag_nonfinite(const float* x, int64_t n, int* flag, cudaStream_t stream);
// x[i] = 0 where it is not finite, and then *flag = 1 (flag zeroed by the caller).
void zero_nonfinite(float* x, int64_t n, int* flag, cudaStream_t stream);

// optimizer.h, element for element.
void sgd_update(const SgdConfig& config, float lr, float* w, const float* g, float* v, int64_t n,
                cudaStream_t stream);
void dgc_accumulate(const SgdConfig& config, const float* w, float* g, float* u, int64_t n, cudaStream_t stream);
// w -= lr * r; u[i] = 0 where mask[i] == 0 (mask: device copy; null masks nothing).
void dgc_update(float lr, float* w, const float* r, float* u, const float* mask, int64_t n,
                cudaStream_t stream);

}  // namespace gradcomm::train::cuda
