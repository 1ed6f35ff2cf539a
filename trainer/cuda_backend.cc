// The CUDA backend: parameters, gradients and momentum in one device allocation
// each, GEMMs in cuBLAS (FP32, no TF32: CUBLAS_DEFAULT_MATH; opened when a backend
// is made, not linked: base/cublas_loader.h), everything else in
// trainer/kernels.cu. Batches arrive as host rows and are staged through pinned
// memory.
//
// The gradient goes to the communicator as device memory (gradient(): Device{kCuda}
// views of grads_), so the allreduce runs on the GPU path (NCCL, the CUDA
// compressors; or staged through the host when ranks share a GPU). Two streams:
// the computation on stream_, the allreduces on comm_stream_, so that a layer's
// allreduce runs while backward goes on below it. gradients_to_comm() orders
// comm_stream_ after the computation so far (a layer's finished gradient);
// gradients_from_comm() orders stream_ after the allreduces (before the update).
#include <cublas_v2.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cublas_loader.h"
#include "gradcomm/errors.h"
#include "trainer/backend.h"
#include "trainer/cuda_util.h"
#include "trainer/kernels.cuh"

namespace gradcomm::train {

void cuda::throw_cuda(cudaError_t status, const char* expression, const char* file, int line) {
  (void)cudaGetLastError();  // clears a non-sticky error, so it does not resurface at the next check
  throw CudaError(fmt::format("{} ({}) in `{}` at {}:{}", cudaGetErrorName(status), cudaGetErrorString(status),
                              expression, file, line));
}

namespace {

// cuBLAS's entry points, opened at the first CUDA backend.
const detail::CublasApi& blas() { return detail::cublas_api("gradcomm-train --device cuda"); }

#define TRAIN_CUBLAS_CHECK(expr)                                                                          \
  do {                                                                                                    \
    const cublasStatus_t status_ = (expr);                                                                \
    if (status_ != CUBLAS_STATUS_SUCCESS) {                                                               \
      throw CudaError(fmt::format("cuBLAS {} ({}) in `{}` at {}:{}", blas().status_name(status_),         \
                                  blas().status_string(status_), #expr, __FILE__, __LINE__));             \
    }                                                                                                     \
  } while (0)

using cuda::DeviceMemory;
using cuda::PinnedMemory;

class CudaBackend final : public Backend {
 public:
  CudaBackend(const MlpLayout& layout, int64_t max_batch, int device)
      : layout_(layout), max_batch_(max_batch), device_(device), scope_(device) {
    const size_t n = static_cast<size_t>(layout.num_params) * sizeof(float);
    params_ = DeviceMemory(n);
    grads_ = DeviceMemory(n);
    momentum_ = DeviceMemory(n);
    mask_ = DeviceMemory(n);
    for (size_t l = 0; l < layout.sizes.size(); ++l) {
      acts_.emplace_back(static_cast<size_t>(max_batch * layout.sizes[l]) * sizeof(float));
    }
    delta_ = DeviceMemory(static_cast<size_t>(max_batch * layout.max_width) * sizeof(float));
    delta_prev_ = DeviceMemory(delta_.size());
    labels_ = DeviceMemory(static_cast<size_t>(max_batch));
    row_loss_ = DeviceMemory(static_cast<size_t>(max_batch) * sizeof(float));
    row_correct_ = DeviceMemory(static_cast<size_t>(max_batch));
    flag_ = DeviceMemory(sizeof(int));
    TRAIN_CUDA_CHECK(cudaMemsetAsync(flag_.data(), 0, sizeof(int), stream_.get()));
    host_in_ = PinnedMemory(static_cast<size_t>(max_batch * layout.sizes[0]) * sizeof(float) +
                            static_cast<size_t>(max_batch));
    host_out_ = PinnedMemory(static_cast<size_t>(max_batch) * (sizeof(float) + 1) + sizeof(int));
    TRAIN_CUBLAS_CHECK(blas().create(&cublas_));
    TRAIN_CUBLAS_CHECK(blas().set_stream(cublas_, stream_.get()));
    TRAIN_CUBLAS_CHECK(blas().set_math_mode(cublas_, CUBLAS_DEFAULT_MATH));  // FP32 GEMMs, like the CPU path
  }
  ~CudaBackend() override { (void)blas().destroy(cublas_); }

  const char* name() const override { return "cuda"; }

  void upload(const float* params, const float* momentum) override {
    const size_t n = params_.size();
    TRAIN_CUDA_CHECK(cudaMemcpyAsync(params_.data(), params, n, cudaMemcpyHostToDevice, stream_.get()));
    TRAIN_CUDA_CHECK(cudaMemcpyAsync(momentum_.data(), momentum, n, cudaMemcpyHostToDevice, stream_.get()));
    stream_.synchronize();
  }
  void download(float* params, float* momentum) override {
    const size_t n = params_.size();
    TRAIN_CUDA_CHECK(cudaMemcpyAsync(params, params_.data(), n, cudaMemcpyDeviceToHost, stream_.get()));
    TRAIN_CUDA_CHECK(cudaMemcpyAsync(momentum, momentum_.data(), n, cudaMemcpyDeviceToHost, stream_.get()));
    stream_.synchronize();
  }

  double forward_backward(const float* x, const uint8_t* y, int64_t batch, bool* finite,
                          const LayerDone& layer_done) override {
    check_batch(batch);
    forward(x, y, batch, /*with_grad=*/true);
    const size_t L = layout_.layers.size();
    for (size_t l = L; l-- > 0;) {
      const Layer& layer = layout_.layers[l];
      const float* a = acts_[l].as<float>();  // (batch, in)
      const float one = 1.0f, zero = 0.0f;
      // dW (out, in) row-major = col-major (in x out): a^T(col) . delta^T(col)^T
      TRAIN_CUBLAS_CHECK(blas().sgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, int(layer.in), int(layer.out), int(batch),
                                      &one, a, int(layer.in), delta_.as<float>(), int(layer.out), &zero,
                                      grads_.as<float>() + layer.w_offset, int(layer.in)));
      cuda::column_sums(delta_.as<float>(), grads_.as<float>() + layer.b_offset, batch, layer.out, stream_.get());
      if (layer_done) layer_done(l);  // its allreduces queue on stream_, behind this layer's kernels
      if (l == 0) break;
      // delta_prev (batch, in) = delta . W  -> col-major (in x batch) = Wc . delta_c
      TRAIN_CUBLAS_CHECK(blas().sgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, int(layer.in), int(batch), int(layer.out),
                                      &one, params_.as<float>() + layer.w_offset, int(layer.in), delta_.as<float>(),
                                      int(layer.out), &zero, delta_prev_.as<float>(), int(layer.in)));
      cuda::relu_backward(delta_prev_.as<float>(), a, batch * layer.in, stream_.get());
      std::swap(delta_, delta_prev_);
    }
    // flag_ is zero here (the constructor, and every read below, clear it); with
    // layer_done, zero_nonfinite has set it for what it zeroed.
    if (!layer_done) cuda::flag_nonfinite(grads_.as<float>(), layout_.num_params, flag_.as<int>(), stream_.get());
    int* flag = reinterpret_cast<int*>(host_out_.as<uint8_t>() + max_batch_ * (sizeof(float) + 1));
    TRAIN_CUDA_CHECK(cudaMemcpyAsync(flag, flag_.data(), sizeof(int), cudaMemcpyDeviceToHost, stream_.get()));
    TRAIN_CUDA_CHECK(cudaMemsetAsync(flag_.data(), 0, sizeof(int), stream_.get()));
    const double loss = fetch_losses(batch, nullptr) / static_cast<double>(batch);  // synchronizes
    *finite = std::isfinite(loss) && *flag == 0;
    return loss;
  }

  void poison_gradient() override {
    const float nan = NAN;
    TRAIN_CUDA_CHECK(cudaMemcpyAsync(grads_.data(), &nan, sizeof nan, cudaMemcpyHostToDevice, stream_.get()));
    stream_.synchronize();
  }

  void evaluate(const float* x, const uint8_t* y, int64_t count, int64_t* correct, double* loss_sum) override {
    for (int64_t start = 0; start < count; start += max_batch_) {
      const int64_t rows = std::min(max_batch_, count - start);
      forward(x + start * layout_.sizes[0], y + start, rows, /*with_grad=*/false);
      *loss_sum += fetch_losses(rows, correct);
    }
  }

  TensorView gradient(const ParamRange& r) override { return device_view(grads_.as<float>() + r.offset, r.numel); }
  TensorView mask(const ParamRange& r) override { return device_view(mask_.as<float>() + r.offset, r.numel); }
  void* stream() override { return stream_.get(); }
  void* comm_stream() override { return comm_stream_.get(); }
  void gradients_to_comm() override { to_comm_.after(stream_, comm_stream_); }
  void gradients_from_comm() override { from_comm_.after(comm_stream_, stream_); }
  void zero_nonfinite(const ParamRange& r) override {
    cuda::zero_nonfinite(grads_.as<float>() + r.offset, r.numel, flag_.as<int>(), stream_.get());
  }

  void dgc_accumulate(const ParamRange& r, const SgdConfig& config) override {
    cuda::dgc_accumulate(config, params_.as<float>() + r.offset, grads_.as<float>() + r.offset,
                         momentum_.as<float>() + r.offset, r.numel, stream_.get());
  }
  void sgd_update(const ParamRange& r, const SgdConfig& config, float lr) override {
    cuda::sgd_update(config, lr, params_.as<float>() + r.offset, grads_.as<float>() + r.offset,
                     momentum_.as<float>() + r.offset, r.numel, stream_.get());
  }
  void dgc_update(const ParamRange& r, float lr, bool masked) override {
    cuda::dgc_update(lr, params_.as<float>() + r.offset, grads_.as<float>() + r.offset,
                     momentum_.as<float>() + r.offset, masked ? mask_.as<float>() + r.offset : nullptr, r.numel,
                     stream_.get());
  }

 private:
  TensorView device_view(float* data, int64_t numel) const {
    return TensorView::of(data, numel, Device{DeviceType::kCuda, device_});
  }
  void check_batch(int64_t batch) const {
    if (batch <= 0 || batch > max_batch_) {
      throw InvalidArgument(fmt::format("CudaBackend: batch of {} rows, expected 1..{}", batch, max_batch_));
    }
  }

  // Uploads rows and labels, runs the layers; leaves per-row loss/correct and
  // (with_grad) d loss/d logits in delta_.
  void forward(const float* x, const uint8_t* y, int64_t rows, bool with_grad) {
    check_batch(rows);
    const size_t xbytes = static_cast<size_t>(rows * layout_.sizes[0]) * sizeof(float);
    auto* staged = host_in_.as<uint8_t>();
    std::memcpy(staged, x, xbytes);
    std::memcpy(staged + xbytes, y, static_cast<size_t>(rows));
    TRAIN_CUDA_CHECK(cudaMemcpyAsync(acts_[0].data(), staged, xbytes, cudaMemcpyHostToDevice, stream_.get()));
    TRAIN_CUDA_CHECK(cudaMemcpyAsync(labels_.data(), staged + xbytes, static_cast<size_t>(rows),
                                        cudaMemcpyHostToDevice, stream_.get()));
    const size_t L = layout_.layers.size();
    for (size_t l = 0; l < L; ++l) {
      const Layer& layer = layout_.layers[l];
      float* z = acts_[l + 1].as<float>();
      const float one = 1.0f;
      // z = a . W^T + b: bias first, then the GEMM accumulates (beta = 1), as on the CPU.
      cuda::broadcast_rows(z, params_.as<float>() + layer.b_offset, rows, layer.out, stream_.get());
      TRAIN_CUBLAS_CHECK(blas().sgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(layer.out), int(rows), int(layer.in), &one,
                                      params_.as<float>() + layer.w_offset, int(layer.in), acts_[l].as<float>(),
                                      int(layer.in), &one, z, int(layer.out)));
      if (l + 1 < L) cuda::relu(z, rows * layer.out, stream_.get());
    }
    cuda::softmax_cross_entropy(acts_[L].as<float>(), labels_.as<uint8_t>(), rows, layout_.sizes.back(),
                                with_grad ? delta_.as<float>() : nullptr, row_loss_.as<float>(),
                                row_correct_.as<uint8_t>(), stream_.get());
  }

  // Brings the per-row losses (and correctness) home and sums them in row order,
  // in double, as mlp.cc does. Synchronizes the stream.
  double fetch_losses(int64_t rows, int64_t* correct) {
    auto* losses = host_out_.as<float>();
    auto* right = host_out_.as<uint8_t>() + max_batch_ * sizeof(float);
    TRAIN_CUDA_CHECK(cudaMemcpyAsync(losses, row_loss_.data(), static_cast<size_t>(rows) * sizeof(float),
                                        cudaMemcpyDeviceToHost, stream_.get()));
    TRAIN_CUDA_CHECK(cudaMemcpyAsync(right, row_correct_.data(), static_cast<size_t>(rows), cudaMemcpyDeviceToHost,
                                        stream_.get()));
    stream_.synchronize();
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) {
      sum += static_cast<double>(losses[r]);
      if (correct != nullptr) *correct += right[r];
    }
    return sum;
  }

  const MlpLayout& layout_;
  int64_t max_batch_;
  int device_;
  cuda::DeviceScope scope_;  // the device stays current while the backend lives
  cuda::Stream stream_;       // forward, backward, updates, evaluation
  cuda::Stream comm_stream_;  // the allreduces (CompressOptions::stream)
  cuda::StreamOrder to_comm_, from_comm_;
  cublasHandle_t cublas_ = nullptr;
  DeviceMemory params_, grads_, momentum_;  // (num_params) each, layout in mlp.h
  DeviceMemory mask_;                       // (num_params): DGC's sent masks, written by the communicator
  std::vector<DeviceMemory> acts_;          // acts_[l]: (max_batch, sizes[l]); acts_[0] is the input
  DeviceMemory delta_, delta_prev_;         // (max_batch, max_width)
  DeviceMemory labels_;                     // (max_batch) u8
  DeviceMemory row_loss_, row_correct_;     // (max_batch) f32 / u8
  DeviceMemory flag_;                       // int: any non-finite gradient
  PinnedMemory host_in_, host_out_;         // batch upload; losses, correctness and flag download
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const MlpLayout& layout, int64_t max_batch, int device) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) (void)cudaGetLastError();
  if (status != cudaSuccess || count == 0) {
    throw Unsupported(fmt::format("gradcomm-train --device cuda: no CUDA device ({})",
                                  status != cudaSuccess ? cudaGetErrorString(status) : "none found"));
  }
  if (device < 0 || device >= count) {
    throw Unsupported(fmt::format("gradcomm-train --device cuda:{}: no such CUDA device (this machine has {})", device,
                                  count));
  }
  return std::make_unique<CudaBackend>(layout, max_batch, device);
}

}  // namespace gradcomm::train
