// The CPU backend: parameters, gradients and momentum as three host buffers of
// num_params floats (one allocation each: the gradient is one buffer to allreduce).
#include <cmath>
#include <span>
#include <vector>

#include "trainer/backend.h"

namespace gradcomm::train {
namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const MlpLayout& layout, int64_t max_batch)
      : layout_(layout),
        model_(layout, max_batch),
        params_(static_cast<size_t>(layout.num_params)),
        grads_(params_.size()),
        momentum_(params_.size()),
        mask_(params_.size()) {}

  const char* name() const override { return "cpu"; }

  void upload(const float* params, const float* momentum) override {
    params_.assign(params, params + layout_.num_params);
    momentum_.assign(momentum, momentum + layout_.num_params);
  }
  void download(float* params, float* momentum) override {
    std::copy(params_.begin(), params_.end(), params);
    std::copy(momentum_.begin(), momentum_.end(), momentum);
  }

  double forward_backward(const float* x, const uint8_t* y, int64_t batch, bool* finite,
                          const LayerDone& layer_done) override {
    found_nonfinite_ = false;  // zero_nonfinite, from layer_done, sets it
    const double loss = model_.forward_backward(params_.data(), x, y, batch, grads_.data(), layer_done);
    bool ok = std::isfinite(loss) && !found_nonfinite_;
    if (!layer_done) {  // else the gradient is already being reduced: zero_nonfinite checked each layer
      for (float g : grads_) ok = ok && std::isfinite(g);
    }
    *finite = ok;
    return loss;
  }
  void poison_gradient() override { grads_[0] = NAN; }
  void evaluate(const float* x, const uint8_t* y, int64_t count, int64_t* correct, double* loss_sum) override {
    model_.evaluate(params_.data(), x, y, count, correct, loss_sum);
  }

  TensorView gradient(const ParamRange& r) override { return TensorView::of(grads_.data() + r.offset, r.numel); }
  TensorView mask(const ParamRange& r) override { return TensorView::of(mask_.data() + r.offset, r.numel); }
  void* stream() override { return nullptr; }
  void zero_nonfinite(const ParamRange& r) override {
    for (float& g : std::span(grads_).subspan(static_cast<size_t>(r.offset), static_cast<size_t>(r.numel))) {
      if (!std::isfinite(g)) {
        g = 0.0f;
        found_nonfinite_ = true;
      }
    }
  }

  void dgc_accumulate(const ParamRange& r, const SgdConfig& config) override {
    train::dgc_accumulate(config, params_.data() + r.offset, grads_.data() + r.offset, momentum_.data() + r.offset,
                          r.numel);
  }
  void sgd_update(const ParamRange& r, const SgdConfig& config, float lr) override {
    train::sgd_update(config, lr, params_.data() + r.offset, grads_.data() + r.offset, momentum_.data() + r.offset,
                      r.numel);
  }
  void dgc_update(const ParamRange& r, float lr, bool masked) override {
    const std::span<const float> mask =
        masked ? std::span<const float>(mask_).subspan(static_cast<size_t>(r.offset), static_cast<size_t>(r.numel))
               : std::span<const float>();
    train::dgc_update(lr, params_.data() + r.offset, grads_.data() + r.offset, momentum_.data() + r.offset, mask,
                      r.numel);
  }

 private:
  const MlpLayout& layout_;
  CpuMlp model_;
  std::vector<float> params_;    // (num_params): fc1.weight (512, 784), fc1.bias (512), ... (mlp.h)
  std::vector<float> grads_;     // (num_params), same layout
  std::vector<float> momentum_;  // (num_params): v (plain) or u (momentum correction)
  std::vector<float> mask_;      // (num_params): DGC's sent masks, written by the communicator
  bool found_nonfinite_ = false;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const MlpLayout& layout, int64_t max_batch) {
  return std::make_unique<CpuBackend>(layout, max_batch);
}

}  // namespace gradcomm::train
