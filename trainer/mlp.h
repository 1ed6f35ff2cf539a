// The model: an MLP 784 -> hidden... -> 10 with ReLU and softmax cross-entropy.
// Parameter layout (one allocation, one gradient buffer shaped the same), the
// seeded initialization, and the CPU reference forward/backward on OpenBLAS.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gradcomm::train {

// One linear layer's place in the parameter buffer. Row-major weights:
//   w = params + w_offset;  // (out, in)
//   b = params + b_offset;  // (out)
struct Layer {
  int64_t in = 0, out = 0;
  int64_t w_offset = 0, b_offset = 0;
};

// A named, contiguous piece of the parameter (and gradient) buffer: what one
// allreduce moves under one compression key ("fc1.weight", "fc1.bias", ...).
struct ParamRange {
  std::string name;
  int64_t offset = 0, numel = 0;
  std::vector<int64_t> shape;  // {out, in} for a weight (powersgd compresses it as a matrix), {out} for a bias
};

struct MlpLayout {
  std::vector<int64_t> sizes;  // {784, hidden..., 10}
  std::vector<Layer> layers;
  std::vector<ParamRange> ranges;  // fc1.weight, fc1.bias, fc2.weight, ... in buffer order
  int64_t num_params = 0;
  int64_t max_width = 0;  // widest activation (for workspaces)

  // InvalidArgument for an empty or non-positive hidden size.
  static MlpLayout make(int64_t inputs, const std::vector<int64_t>& hidden, int64_t classes);
  std::string describe() const;  // "784-512-256-10 (535818 parameters)"
};

// PyTorch's nn.Linear default: w, b ~ U(-1/sqrt(in), 1/sqrt(in)), from `seed` only.
void init_parameters(const MlpLayout& layout, uint64_t seed, float* params);

// Softmax cross-entropy over a batch of logits (batch, classes): returns the summed
// loss (double) and, when dlogits is not null, writes d(mean loss)/d(logits) =
// (softmax - onehot) / batch. `correct` (optional) counts argmax == label.
double softmax_cross_entropy(const float* logits, const uint8_t* labels, int64_t batch, int64_t classes,
                             float* dlogits, int64_t* correct);

// Called during backward as soon as layer l's gradient (its weight and bias) is
// complete, last layer first: the trainer starts that layer's allreduce there.
using LayerDone = std::function<void(size_t layer)>;

// CPU reference: OpenBLAS GEMMs plus plain loops. Holds the activation workspace
// for up to `max_batch` rows; not thread-safe (one per rank).
class CpuMlp {
 public:
  CpuMlp(const MlpLayout& layout, int64_t max_batch);

  // Mean loss of the batch; writes the gradient of the mean loss into `grads`
  // (num_params floats, every element overwritten). After `layer_done(l)` the
  // backward pass neither reads nor writes layer l's gradient again.
  double forward_backward(const float* params, const float* x, const uint8_t* y, int64_t batch, float* grads,
                          const LayerDone& layer_done = nullptr);
  // Forward only, in chunks of max_batch: adds to *correct and *loss_sum.
  void evaluate(const float* params, const float* x, const uint8_t* y, int64_t count, int64_t* correct,
                double* loss_sum);

 private:
  // Fills acts_[1..L] for rows [0, batch); acts_[0] points at the input.
  void forward(const float* params, const float* x, int64_t batch);

  const MlpLayout& layout_;
  int64_t max_batch_;
  std::vector<std::vector<float>> acts_;  // acts_[l]: (max_batch, sizes[l]) post-ReLU (logits for the last)
  std::vector<float> delta_, delta_prev_;  // (max_batch, max_width): d loss / d pre-activation
  const float* input_ = nullptr;
};

}  // namespace gradcomm::train
