// Where the math runs: the CPU (OpenBLAS, the reference) or a CUDA device
// (cuBLAS + trainer/kernels.cu). The training loop (train.cc) is written once
// against this interface; the gradient reaches the communicator where it lives
// (gradient(): host memory, or CUDA device memory for the NCCL path).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "gradcomm/types.h"
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
  // writing it): *finite then covers the loss and what zero_nonfinite() found.
  virtual double forward_backward(const float* x, const uint8_t* y, int64_t batch, bool* finite,
                                  const LayerDone& layer_done = nullptr) = 0;
  // Test hook (--debug-nan-at-step): makes the gradient's first element NaN.
  virtual void poison_gradient() = 0;
  // Forward only over `count` host rows: adds to *correct and *loss_sum.
  virtual void evaluate(const float* x, const uint8_t* y, int64_t count, int64_t* correct, double* loss_sum) = 0;

  // One range of the gradient buffer (a layer's weight or bias) as the communicator's
  // tensor: the buffer itself, in host memory (cpu) or device memory (cuda), never a
  // copy. Allreduced in place.
  virtual TensorView gradient(const ParamRange& range) = 0;
  // Scratch of the range's size on the same device, for Communicator::sent_mask.
  virtual TensorView mask(const ParamRange& range) = 0;
  // The stream the backend's work is ordered on (cudaStream_t; null on the CPU).
  virtual void* stream() = 0;
  // The stream the allreduces run on (CompressOptions::stream). The CUDA backend has a
  // second one, so communication overlaps the backward of the layers below; the
  // trainer hands the gradient over with the two calls below. Null on the CPU.
  virtual void* comm_stream() { return stream(); }
  // Before a layer's allreduces: they start after the backend's work so far (the
  // layer's gradient, zero_nonfinite, dgc_accumulate). No-op with one stream.
  virtual void gradients_to_comm() {}
  // Before the update: the backend's next work starts after every allreduce issued.
  virtual void gradients_from_comm() {}
  // Inside layer_done: zeroes the range's non-finite elements before they leave (so
  // no NaN reaches a peer or a residual); forward_backward's *finite then says
  // whether there were any.
  virtual void zero_nonfinite(const ParamRange& range) = 0;

  // Optimizer steps over one range of the buffers (optimizer.h has the formulas).
  virtual void dgc_accumulate(const ParamRange& range, const SgdConfig& config) = 0;
  virtual void sgd_update(const ParamRange& range, const SgdConfig& config, float lr) = 0;
  // `masked`: mask(range) holds the range's sent mask (Communicator::sent_mask), 0
  // where this rank's allreduce sent; false masks nothing.
  virtual void dgc_update(const ParamRange& range, float lr, bool masked) = 0;
};

// `max_batch`: the largest batch forward_backward / evaluate chunks will see.
std::unique_ptr<Backend> make_cpu_backend(const MlpLayout& layout, int64_t max_batch);
// Unsupported ("no CUDA device", or "built without CUDA") when it cannot run here.
std::unique_ptr<Backend> make_cuda_backend(const MlpLayout& layout, int64_t max_batch, int device);

}  // namespace gradcomm::train
