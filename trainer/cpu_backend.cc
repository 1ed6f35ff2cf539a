// The CPU backend: parameters, gradients and momentum as three host buffers of
// num_params floats (one allocation each: the gradient is one buffer to allreduce).
#include <cmath>
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
        momentum_(params_.size()) {}

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
    const double loss = model_.forward_backward(params_.data(), x, y, batch, grads_.data(), layer_done);
    bool ok = std::isfinite(loss);
    if (!layer_done) {  // else the gradient is already being reduced: the caller checked each layer
      for (float g : grads_) ok = ok && std::isfinite(g);
    }
    *finite = ok;
    return loss;
  }
  void poison_gradient() override { grads_[0] = NAN; }
  void evaluate(const float* x, const uint8_t* y, int64_t count, int64_t* correct, double* loss_sum) override {
    model_.evaluate(params_.data(), x, y, count, correct, loss_sum);
  }

  float* gradients_to_host() override { return grads_.data(); }
  void gradients_from_host() override {}
  float* range_to_host(const ParamRange& r) override { return grads_.data() + r.offset; }
  void range_from_host(const ParamRange&) override {}

  void dgc_accumulate(const ParamRange& r, const SgdConfig& config) override {
    train::dgc_accumulate(config, params_.data() + r.offset, grads_.data() + r.offset, momentum_.data() + r.offset,
                          r.numel);
  }
  void sgd_update(const ParamRange& r, const SgdConfig& config, float lr) override {
    train::sgd_update(config, lr, params_.data() + r.offset, grads_.data() + r.offset, momentum_.data() + r.offset,
                      r.numel);
  }
  void dgc_update(const ParamRange& r, float lr, std::span<const float> mask) override {
    train::dgc_update(lr, params_.data() + r.offset, grads_.data() + r.offset, momentum_.data() + r.offset, mask,
                      r.numel);
  }

 private:
  const MlpLayout& layout_;
  CpuMlp model_;
  std::vector<float> params_;    // (num_params): fc1.weight (512, 784), fc1.bias (512), ... (mlp.h)
  std::vector<float> grads_;     // (num_params), same layout
  std::vector<float> momentum_;  // (num_params): v (plain) or u (momentum correction)
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const MlpLayout& layout, int64_t max_batch) {
  return std::make_unique<CpuBackend>(layout, max_batch);
}

}  // namespace gradcomm::train
