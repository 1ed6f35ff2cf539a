// CPU reference of the MLP: every GEMM is one cblas_sgemm, everything else a loop
// written the way the CUDA kernels (trainer/kernels.cu) compute it.
#include "trainer/mlp.h"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "gradcomm/errors.h"
#include "trainer/rng.h"

namespace gradcomm::train {

MlpLayout MlpLayout::make(int64_t inputs, const std::vector<int64_t>& hidden, int64_t classes) {
  MlpLayout m;
  m.sizes.push_back(inputs);
  for (size_t i = 0; i < hidden.size(); ++i) {
    if (hidden[i] <= 0 || hidden[i] > (int64_t{1} << 20)) {
      throw InvalidArgument(fmt::format("--hidden: layer {} has width {}; expected 1..{}", i + 1, hidden[i],
                                        int64_t{1} << 20));
    }
    m.sizes.push_back(hidden[i]);
  }
  m.sizes.push_back(classes);
  int64_t at = 0;
  for (size_t l = 0; l + 1 < m.sizes.size(); ++l) {
    Layer layer{m.sizes[l], m.sizes[l + 1], at, at + m.sizes[l] * m.sizes[l + 1]};
    m.ranges.push_back({fmt::format("fc{}.weight", l + 1), layer.w_offset, layer.in * layer.out, {layer.out, layer.in}});
    m.ranges.push_back({fmt::format("fc{}.bias", l + 1), layer.b_offset, layer.out, {layer.out}});
    at = layer.b_offset + layer.out;
    m.layers.push_back(layer);
  }
  m.num_params = at;
  m.max_width = *std::max_element(m.sizes.begin(), m.sizes.end());
  return m;
}

std::string MlpLayout::describe() const {
  std::string s;
  for (int64_t w : sizes) s += (s.empty() ? "" : "-") + std::to_string(w);
  return fmt::format("{} ({} parameters)", s, num_params);
}

void init_parameters(const MlpLayout& layout, uint64_t seed, float* params) {
  Rng rng(seed, /*stream=*/0x696e6974);  // "init": independent of the shuffling stream
  for (const Layer& layer : layout.layers) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(layer.in));
    for (int64_t i = 0; i < layer.in * layer.out; ++i) params[layer.w_offset + i] = rng.uniform(-bound, bound);
    for (int64_t i = 0; i < layer.out; ++i) params[layer.b_offset + i] = rng.uniform(-bound, bound);
  }
}

double softmax_cross_entropy(const float* logits, const uint8_t* labels, int64_t batch, int64_t classes,
                             float* dlogits, int64_t* correct) {
  double loss = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const float* z = logits + r * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c) best = z[c] > z[best] ? c : best;
    if (correct != nullptr && best == labels[r]) ++*correct;
    // log-sum-exp shifted by the max: exp never overflows.
    const float zmax = z[best];
    float sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(z[c] - zmax);
    const float log_sum = std::log(sum);
    loss += static_cast<double>(log_sum - (z[labels[r]] - zmax));
    if (dlogits != nullptr) {
      const float scale = 1.0f / static_cast<float>(batch);
      for (int64_t c = 0; c < classes; ++c) {
        const float p = std::exp(z[c] - zmax - log_sum);
        dlogits[r * classes + c] = (p - (c == labels[r] ? 1.0f : 0.0f)) * scale;
      }
    }
  }
  return loss;
}

CpuMlp::CpuMlp(const MlpLayout& layout, int64_t max_batch) : layout_(layout), max_batch_(max_batch) {
  acts_.resize(layout.sizes.size());
  for (size_t l = 1; l < layout.sizes.size(); ++l) acts_[l].resize(static_cast<size_t>(max_batch * layout.sizes[l]));
  delta_.resize(static_cast<size_t>(max_batch * layout.max_width));
  delta_prev_.resize(delta_.size());
}

void CpuMlp::forward(const float* params, const float* x, int64_t batch) {
  input_ = x;
  const size_t L = layout_.layers.size();
  for (size_t l = 0; l < L; ++l) {
    const Layer& layer = layout_.layers[l];
    const float* a = l == 0 ? x : acts_[l].data();  // (batch, in)
    float* z = acts_[l + 1].data();                 // (batch, out)
    // z = a . W^T + b (bias broadcast first, then GEMM accumulates onto it).
    for (int64_t r = 0; r < batch; ++r) std::copy_n(params + layer.b_offset, layer.out, z + r * layer.out);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(batch), static_cast<int>(layer.out),
                static_cast<int>(layer.in), 1.0f, a, static_cast<int>(layer.in), params + layer.w_offset,
                static_cast<int>(layer.in), 1.0f, z, static_cast<int>(layer.out));
    if (l + 1 < L) {
      for (int64_t i = 0; i < batch * layer.out; ++i) z[i] = std::max(z[i], 0.0f);
    }
  }
}

double CpuMlp::forward_backward(const float* params, const float* x, const uint8_t* y, int64_t batch, float* grads,
                                const LayerDone& layer_done) {
  if (batch <= 0 || batch > max_batch_) {
    throw InvalidArgument(fmt::format("CpuMlp: batch of {} rows, expected 1..{}", batch, max_batch_));
  }
  forward(params, x, batch);
  const size_t L = layout_.layers.size();
  const int64_t classes = layout_.sizes.back();
  const double loss = softmax_cross_entropy(acts_[L].data(), y, batch, classes, delta_.data(), nullptr);
  for (size_t l = L; l-- > 0;) {
    const Layer& layer = layout_.layers[l];
    const float* a = l == 0 ? input_ : acts_[l].data();  // (batch, in): this layer's input
    // dW = delta^T . a   (out, in);   db = column sums of delta   (out)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(layer.out), static_cast<int>(layer.in),
                static_cast<int>(batch), 1.0f, delta_.data(), static_cast<int>(layer.out), a,
                static_cast<int>(layer.in), 0.0f, grads + layer.w_offset, static_cast<int>(layer.in));
    float* db = grads + layer.b_offset;
    std::fill_n(db, layer.out, 0.0f);
    for (int64_t r = 0; r < batch; ++r) {
      for (int64_t o = 0; o < layer.out; ++o) db[o] += delta_[r * layer.out + o];
    }
    if (layer_done) layer_done(l);
    if (l == 0) break;
    // delta_prev = (delta . W) * relu'(a)   (batch, in)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(batch), static_cast<int>(layer.in),
                static_cast<int>(layer.out), 1.0f, delta_.data(), static_cast<int>(layer.out),
                params + layer.w_offset, static_cast<int>(layer.in), 0.0f, delta_prev_.data(),
                static_cast<int>(layer.in));
    for (int64_t i = 0; i < batch * layer.in; ++i) {
      if (a[i] <= 0.0f) delta_prev_[i] = 0.0f;
    }
    std::swap(delta_, delta_prev_);
  }
  return loss / static_cast<double>(batch);
}

void CpuMlp::evaluate(const float* params, const float* x, const uint8_t* y, int64_t count, int64_t* correct,
                      double* loss_sum) {
  const int64_t inputs = layout_.sizes.front();
  const int64_t classes = layout_.sizes.back();
  for (int64_t start = 0; start < count; start += max_batch_) {
    const int64_t rows = std::min(max_batch_, count - start);
    forward(params, x + start * inputs, rows);
    *loss_sum += softmax_cross_entropy(acts_.back().data(), y + start, rows, classes, nullptr, correct);
  }
}

}  // namespace gradcomm::train
