// Where the math runs: the CPU (OpenBLAS, the reference) or a CUDA device
// (cuBLAS + trainer/kernels.cu). The training loop (train.cc) is written once
// against this interface; the gradient always reaches the communicator as host
// memory (see gradients_to_host()).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "trainer/mlp.h"
#include "trainer/optimizer.h"

namespace gradcomm::train {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // Host copies of the parameters and the momentum buffer (num_params floats each):
  // initialization, checkpoints and resume.
  virtual void upload(const float* params, const float* momentum) = 0;
  virtual void download(float* params, float* momentum) = 0;

  // Forward and backward of `batch` rows (host memory): the gradient of the mean
  // loss lands in the backend's gradient buffer. Returns the mean loss; *finite
  // says whether the loss and every gradient element are finite. With
  // `layer_done`, it is called once each layer's gradient is complete (last layer
  // first) and the gradient is the caller's from then on (its allreduce may be
  // writing it): *finite then covers the loss only.
  virtual double forward_backward(const float* x, const uint8_t* y, int64_t batch, bool* finite,
                                  const LayerDone& layer_done = nullptr) = 0;
  // Test hook (--debug-nan-at-step): makes the gradient's first element NaN.
  virtual void poison_gradient() = 0;
  // Forward only over `count` host rows: adds to *correct and *loss_sum.
  virtual void evaluate(const float* x, const uint8_t* y, int64_t count, int64_t* correct, double* loss_sum) = 0;

  // The gradient buffer as host memory, for the allreduce, and back. CPU: the
  // buffer itself (no copy). CUDA: a pinned staging copy (see cuda_backend.cc).
  virtual float* gradients_to_host() = 0;
  virtual void gradients_from_host() = 0;
  // The same for one range (a layer's weight or bias), as soon as backward has
  // written it: the host pointer is gradients_to_host()'s + range.offset.
  virtual float* range_to_host(const ParamRange& range) = 0;
  virtual void range_from_host(const ParamRange& range) = 0;

  // Optimizer steps over one range of the buffers (optimizer.h has the formulas).
  virtual void dgc_accumulate(const ParamRange& range, const SgdConfig& config) = 0;
  virtual void sgd_update(const ParamRange& range, const SgdConfig& config, float lr) = 0;
  // `mask`: the range's sent mask (host; introspect.h's sent_mask), zero where sent.
  virtual void dgc_update(const ParamRange& range, float lr, std::span<const float> mask) = 0;
};

// `max_batch`: the largest batch forward_backward / evaluate chunks will see.
std::unique_ptr<Backend> make_cpu_backend(const MlpLayout& layout, int64_t max_batch);
// Unsupported ("no CUDA device", or "built without CUDA") when it cannot run here.
std::unique_ptr<Backend> make_cuda_backend(const MlpLayout& layout, int64_t max_batch, int device);

}  // namespace gradcomm::train
