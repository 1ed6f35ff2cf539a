// The trainer's CUDA kernels (see kernels.cuh). Grid-stride loops; launchers check
// the launch and never synchronize.
#include <cmath>

#include "trainer/cuda_util.h"
#include "trainer/kernels.cuh"

namespace gradcomm::train::cuda {
namespace {

constexpr int kBlock = 256;

int grid_for(int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

__global__ void broadcast_rows_kernel(float* z, const float* b, int64_t rows, int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols; i += int64_t{gridDim.x} * blockDim.x) {
    z[i] = b[i % cols];
  }
}

__global__ void relu_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = fmaxf(x[i], 0.0f);
  }
}

__global__ void relu_backward_kernel(float* delta, const float* a, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    if (a[i] <= 0.0f) delta[i] = 0.0f;
  }
}

// One thread per column, rows summed in order: the CPU loop's order exactly.
__global__ void column_sums_kernel(const float* delta, float* db, int64_t rows, int64_t cols) {
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < cols; o += int64_t{gridDim.x} * blockDim.x) {
    float sum = 0.0f;
    for (int64_t r = 0; r < rows; ++r) sum += delta[r * cols + o];
    db[o] = sum;
  }
}

// One thread per row (10 classes: a row is too small to share).
__global__ void softmax_xent_kernel(const float* logits, const uint8_t* labels, int64_t rows, int64_t classes,
                                    float* dlogits, float* loss, uint8_t* correct) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows; r += int64_t{gridDim.x} * blockDim.x) {
    const float* z = logits + r * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c) best = z[c] > z[best] ? c : best;
    const float zmax = z[best];
    float sum = 0.0f;
    for (int64_t c = 0; c < classes; ++c) sum += expf(z[c] - zmax);
    const float log_sum = logf(sum);
    const int64_t y = labels[r];
    loss[r] = log_sum - (z[y] - zmax);
    correct[r] = best == y ? 1 : 0;
    if (dlogits != nullptr) {
      const float scale = 1.0f / static_cast<float>(rows);
      for (int64_t c = 0; c < classes; ++c) {
        const float p = expf(z[c] - zmax - log_sum);
        dlogits[r * classes + c] = (p - (c == y ? 1.0f : 0.0f)) * scale;
      }
    }
  }
}

__global__ void flag_nonfinite_kernel(const float* x, int64_t n, int* flag) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    if (!isfinite(x[i])) *flag = 1;  // benign race: every writer writes 1
  }
}

__global__ void zero_nonfinite_kernel(float* x, int64_t n, int* flag) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    if (!isfinite(x[i])) {
      x[i] = 0.0f;
      *flag = 1;  // benign race, as above
    }
  }
}

__global__ void sgd_update_kernel(float momentum, float weight_decay, bool nesterov, float lr, float* w,
                                  const float* g, float* v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float d = g[i] + weight_decay * w[i];
    v[i] = momentum * v[i] + d;
    w[i] -= lr * (nesterov ? d + momentum * v[i] : v[i]);
  }
}

__global__ void dgc_accumulate_kernel(float momentum, float weight_decay, bool nesterov, const float* w, float* g,
                                      float* u, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float d = g[i] + weight_decay * w[i];
    u[i] = momentum * u[i] + d;
    g[i] = nesterov ? d + momentum * u[i] : u[i];
  }
}

__global__ void dgc_update_kernel(float lr, float* w, const float* r, float* u, const float* mask, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    w[i] -= lr * r[i];
    if (mask != nullptr && mask[i] == 0.0f) u[i] = 0.0f;
  }
}

}  // namespace

void broadcast_rows(float* z, const float* b, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return;
  broadcast_rows_kernel<<<grid_for(rows * cols), kBlock, 0, stream>>>(z, b, rows, cols);
  TRAIN_CUDA_CHECK_LAUNCH();
}

void relu(float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_kernel<<<grid_for(n), kBlock, 0, stream>>>(x, n);
  TRAIN_CUDA_CHECK_LAUNCH();
}

void relu_backward(float* delta, const float* a, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_backward_kernel<<<grid_for(n), kBlock, 0, stream>>>(delta, a, n);
  TRAIN_CUDA_CHECK_LAUNCH();
}

void column_sums(const float* delta, float* db, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols == 0) return;
  column_sums_kernel<<<grid_for(cols), kBlock, 0, stream>>>(delta, db, rows, cols);
  TRAIN_CUDA_CHECK_LAUNCH();
}

void softmax_cross_entropy(const float* logits, const uint8_t* labels, int64_t rows, int64_t classes,
                           float* dlogits, float* loss, uint8_t* correct, cudaStream_t stream) {
  if (rows == 0) return;
  softmax_xent_kernel<<<grid_for(rows), kBlock, 0, stream>>>(logits, labels, rows, classes, dlogits, loss, correct);
  TRAIN_CUDA_CHECK_LAUNCH();
}

void flag_nonfinite(const float* x, int64_t n, int* flag, cudaStream_t stream) {
  if (n == 0) return;
  flag_nonfinite_kernel<<<grid_for(n), kBlock, 0, stream>>>(x, n, flag);
  TRAIN_CUDA_CHECK_LAUNCH();
}

void zero_nonfinite(float* x, int64_t n, int* flag, cudaStream_t stream) {
  if (n == 0) return;
  zero_nonfinite_kernel<<<grid_for(n), kBlock, 0, stream>>>(x, n, flag);
  TRAIN_CUDA_CHECK_LAUNCH();
}

void sgd_update(const SgdConfig& c, float lr, float* w, const float* g, float* v, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  sgd_update_kernel<<<grid_for(n), kBlock, 0, stream>>>(c.momentum, c.weight_decay, c.nesterov, lr, w, g, v, n);
  TRAIN_CUDA_CHECK_LAUNCH();
}

void dgc_accumulate(const SgdConfig& c, const float* w, float* g, float* u, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  dgc_accumulate_kernel<<<grid_for(n), kBlock, 0, stream>>>(c.momentum, c.weight_decay, c.nesterov, w, g, u, n);
  TRAIN_CUDA_CHECK_LAUNCH();
}

void dgc_update(float lr, float* w, const float* r, float* u, const float* mask, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  dgc_update_kernel<<<grid_for(n), kBlock, 0, stream>>>(lr, w, r, u, mask, n);
  TRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace gradcomm::train::cuda
