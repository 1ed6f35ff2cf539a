// SGD with momentum (optionally Nesterov), weight decay, linear warm-up then
// cosine (or constant) learning rate; and DGC's momentum correction with
// momentum-factor masking (Lin et al. 2018, "Deep Gradient Compression").
//
// Plain mode (dense keys, non-sparsifying compressors): the allreduce averages the
// raw gradient g; then, identically on every rank,
//   d = g + wd * w;  v = m * v + d;  w -= lr * (nesterov ? d + m * v : v).
// Momentum correction (sparsifiers with error feedback): momentum is accumulated
// locally *before* compression, so error feedback accumulates velocity, not
// gradient (otherwise delayed coordinates lose their momentum):
//   d = g + wd * w;  u = m * u + d;  send = nesterov ? d + m * u : u
//   allreduce(send, avg, EF) -> r   (EF inside: acc = send + residual; residual = acc minus what was sent)
//   w -= lr * r;  u[i] = 0 wherever i was sent (momentum-factor masking: its
//   momentum was applied through r; keeping it would apply it again).
// These host loops are the reference; trainer/kernels.cu computes the same.
#pragma once

#include <cstdint>
#include <span>

namespace gradcomm::train {

struct SgdConfig {
  float lr = 0.1f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  int64_t warmup_steps = 0;  // linear from lr/warmup_steps to lr
  int64_t total_steps = 1;   // cosine decays to 0 at the last step
  bool cosine = true;
};

// Learning rate at 0-based `step`.
float learning_rate(const SgdConfig& config, int64_t step);

// Plain mode, over one parameter range: `g` is the averaged gradient.
void sgd_update(const SgdConfig& config, float lr, float* w, const float* g, float* v, int64_t n);

// Momentum correction, before the allreduce: updates u and overwrites g with what to send.
void dgc_accumulate(const SgdConfig& config, const float* w, float* g, float* u, int64_t n);
// After the allreduce: w -= lr * r; u[i] = 0 where mask[i] == 0 (sent: Communicator::
// sent_mask). An empty mask masks nothing.
void dgc_update(float lr, float* w, const float* r, float* u, std::span<const float> mask, int64_t n);

}  // namespace gradcomm::train
