// Host reference of the optimizer (see optimizer.h for the formulas).
#include "trainer/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace gradcomm::train {

float learning_rate(const SgdConfig& c, int64_t step) {
  if (step < c.warmup_steps) {
    return c.lr * static_cast<float>(step + 1) / static_cast<float>(c.warmup_steps);
  }
  if (!c.cosine) return c.lr;
  const int64_t span = std::max<int64_t>(c.total_steps - c.warmup_steps, 1);
  const double t = std::clamp(static_cast<double>(step - c.warmup_steps) / static_cast<double>(span), 0.0, 1.0);
  return static_cast<float>(0.5 * c.lr * (1.0 + std::cos(std::numbers::pi * t)));
}

void sgd_update(const SgdConfig& c, float lr, float* w, const float* g, float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = g[i] + c.weight_decay * w[i];
    v[i] = c.momentum * v[i] + d;
    w[i] -= lr * (c.nesterov ? d + c.momentum * v[i] : v[i]);
  }
}

void dgc_accumulate(const SgdConfig& c, const float* w, float* g, float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = g[i] + c.weight_decay * w[i];
    u[i] = c.momentum * u[i] + d;
    g[i] = c.nesterov ? d + c.momentum * u[i] : u[i];
  }
}

void dgc_update(float lr, float* w, const float* r, float* u, std::span<const float> mask, int64_t n) {
  for (int64_t i = 0; i < n; ++i) w[i] -= lr * r[i];
  if (mask.empty()) return;
  for (int64_t i = 0; i < n; ++i) {
    if (mask[i] == 0.0f) u[i] = 0.0f;
  }
}

}  // namespace gradcomm::train
