// gradcomm-train's pieces in-process: the MLP's gradients against finite
// differences, softmax cross-entropy and the optimizer against hand-computed
// values, the dataset reader's errors, and the checkpoint format's validation.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <system_error>

#include "gradcomm/errors.h"
#include "trainer/checkpoint.h"
#include "trainer/dataset.h"
#include "trainer/mlp.h"
#include "trainer/optimizer.h"
#include "trainer/train.h"

namespace gradcomm::train {
namespace {

namespace fs = std::filesystem;

// Every directory a test makes lives under one per-process root, removed when the
// test binary exits (ctest runs each test in its own process).
class TempRoot {
 public:
  TempRoot() : path_(fs::temp_directory_path() / ("gradcomm_trainer_unit_" + std::to_string(getpid()))) {}
  ~TempRoot() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

fs::path fresh_dir(const std::string& name) {
  static const TempRoot root;
  const fs::path dir = root.path() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// ---- model math ---------------------------------------------------------------

TEST(Mlp, LayoutPlacesEveryParameterOnce) {
  const MlpLayout m = MlpLayout::make(784, {512, 256}, 10);
  EXPECT_EQ(m.num_params, 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10);
  ASSERT_EQ(m.ranges.size(), 6u);
  int64_t at = 0;
  for (const ParamRange& r : m.ranges) {  // contiguous, in order, covering the buffer
    EXPECT_EQ(r.offset, at) << r.name;
    at += r.numel;
  }
  EXPECT_EQ(at, m.num_params);
  EXPECT_EQ(m.ranges[0].name, "fc1.weight");
  EXPECT_EQ(m.ranges[5].name, "fc3.bias");
  EXPECT_THROW(MlpLayout::make(784, {0}, 10), InvalidArgument);
}

TEST(Mlp, SoftmaxCrossEntropyOfEqualLogitsIsLogClasses) {
  const int64_t batch = 3, classes = 4;
  std::vector<float> logits(batch * classes, 2.5f), d(logits.size());
  const uint8_t labels[] = {0, 3, 1};
  int64_t correct = 0;
  const double loss = softmax_cross_entropy(logits.data(), labels, batch, classes, d.data(), &correct);
  EXPECT_NEAR(loss, batch * std::log(4.0), 1e-5);
  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t c = 0; c < classes; ++c) {
      const float expected = (0.25f - (c == labels[r] ? 1.0f : 0.0f)) / batch;
      EXPECT_NEAR(d[r * classes + c], expected, 1e-6);
    }
  }
}

// The analytic gradient of the mean loss against central differences of the loss
// computed by the forward pass alone (evaluate), for every parameter of a small
// network. Double-checked in float: eps and tolerance sized for float rounding.
TEST(Mlp, GradientsMatchFiniteDifferences) {
  const MlpLayout m = MlpLayout::make(6, {5, 4}, 3);
  const int64_t batch = 4;
  std::vector<float> params(m.num_params), grads(m.num_params);
  init_parameters(m, 7, params.data());
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  std::vector<float> x(batch * 6);
  for (float& v : x) v = normal(gen);
  const uint8_t y[] = {0, 2, 1, 2};
  CpuMlp model(m, batch);
  model.forward_backward(params.data(), x.data(), y, batch, grads.data());
  auto mean_loss = [&](const std::vector<float>& p) {
    int64_t correct = 0;
    double sum = 0;
    model.evaluate(p.data(), x.data(), y, batch, &correct, &sum);
    return sum / batch;
  };
  const float eps = 1e-3f;  // small enough that no ReLU input crosses 0 in this fixed setup
  int checked = 0;
  for (int64_t i = 0; i < m.num_params; ++i) {
    std::vector<float> plus = params, minus = params;
    plus[i] += eps;
    minus[i] -= eps;
    const double numeric = (mean_loss(plus) - mean_loss(minus)) / (2 * eps);
    EXPECT_NEAR(grads[i], numeric, 1e-3 + 1e-2 * std::abs(numeric)) << "parameter " << i;
    checked += std::abs(numeric) > 1e-3;
  }
  EXPECT_GT(checked, m.num_params / 2);  // the comparison was not between zeros
}

TEST(Mlp, InitializationIsSeededAndBounded) {
  const MlpLayout m = MlpLayout::make(784, {32}, 10);
  std::vector<float> a(m.num_params), b(m.num_params), c(m.num_params);
  init_parameters(m, 1, a.data());
  init_parameters(m, 1, b.data());
  init_parameters(m, 2, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  const float bound = 1.0f / std::sqrt(784.0f);
  for (int64_t i = 0; i < m.layers[0].in * m.layers[0].out; ++i) ASSERT_LE(std::abs(a[i]), bound);
}

// ---- optimizer ----------------------------------------------------------------

TEST(Optimizer, SgdMomentumAndNesterovByHand) {
  SgdConfig c;
  c.momentum = 0.5f;
  c.weight_decay = 0.1f;
  float w = 1.0f, v = 0.0f;
  const float g = 2.0f;
  sgd_update(c, 0.1f, &w, &g, &v, 1);  // d = 2.1, v = 2.1, w = 1 - 0.21
  EXPECT_FLOAT_EQ(v, 2.1f);
  EXPECT_FLOAT_EQ(w, 0.79f);
  sgd_update(c, 0.1f, &w, &g, &v, 1);  // d = 2.079, v = 1.05 + 2.079 = 3.129
  EXPECT_FLOAT_EQ(v, 3.129f);
  EXPECT_FLOAT_EQ(w, 0.79f - 0.3129f);
  c.nesterov = true;
  float wn = 1.0f, vn = 0.0f;
  sgd_update(c, 0.1f, &wn, &g, &vn, 1);  // d = 2.1, v = 2.1, step = d + 0.5 v = 3.15
  EXPECT_FLOAT_EQ(wn, 1.0f - 0.315f);
}

TEST(Optimizer, MomentumCorrectionAccumulatesAndMasksSentCoordinates) {
  SgdConfig c;
  c.momentum = 0.9f;
  float w[2] = {1.0f, 1.0f}, g[2] = {1.0f, 2.0f}, u[2] = {0.5f, 0.5f};
  dgc_accumulate(c, w, g, u, 2);  // u = 0.45 + g; what is sent is u
  EXPECT_FLOAT_EQ(u[0], 1.45f);
  EXPECT_FLOAT_EQ(g[1], 2.45f);
  const float r[2] = {0.0f, 3.0f};        // coordinate 1 was sent (its residual is 0)
  const float residual[2] = {1.45f, 0.0f};
  dgc_update(0.1f, w, r, u, residual, 2);
  EXPECT_FLOAT_EQ(w[1], 0.7f);
  EXPECT_FLOAT_EQ(u[0], 1.45f);  // kept: not sent
  EXPECT_FLOAT_EQ(u[1], 0.0f);   // masked
}

TEST(Optimizer, WarmupIsLinearThenCosineReachesZero) {
  SgdConfig c;
  c.lr = 0.4f;
  c.warmup_steps = 4;
  c.total_steps = 104;
  EXPECT_FLOAT_EQ(learning_rate(c, 0), 0.1f);
  EXPECT_FLOAT_EQ(learning_rate(c, 3), 0.4f);
  EXPECT_FLOAT_EQ(learning_rate(c, 4), 0.4f);
  EXPECT_NEAR(learning_rate(c, 54), 0.2f, 1e-6);  // half way: cos(pi/2)
  EXPECT_NEAR(learning_rate(c, 104), 0.0f, 1e-7);
  c.cosine = false;
  EXPECT_FLOAT_EQ(learning_rate(c, 90), 0.4f);
}

// ---- dataset ------------------------------------------------------------------

void write_gzip(const fs::path& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
}

std::vector<uint8_t> idx(uint32_t magic, std::vector<uint32_t> shape, size_t payload) {
  std::vector<uint8_t> out;
  for (uint32_t word : std::vector<uint32_t>{magic}) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(word >> s));
  }
  for (uint32_t d : shape) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(d >> s));
  }
  out.resize(out.size() + payload, 1);
  return out;
}

// A directory of four valid tiny files (n examples each split).
fs::path tiny_dataset(const std::string& name, uint32_t n) {
  const fs::path dir = fresh_dir(name);
  for (const char* split : {"train", "t10k"}) {
    write_gzip(dir / (std::string(split) + "-images-idx3-ubyte.gz"), idx(0x803, {n, 28, 28}, n * 784));
    write_gzip(dir / (std::string(split) + "-labels-idx1-ubyte.gz"), idx(0x801, {n}, n));
  }
  return dir;
}

void expect_dataset_error(const fs::path& dir, const std::string& fragment) {
  try {
    load_fashion_mnist(dir.string());
    FAIL() << "expected an error containing '" << fragment << "'";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fragment), std::string::npos) << what;
    EXPECT_NE(what.find("dataset-fashion-mnist"), std::string::npos) << what;  // names the package
  }
}

TEST(Dataset, TinyValidFilesLoad) {
  const fs::path dir = tiny_dataset("valid", 3);
  const FashionMnist d = load_fashion_mnist(dir.string());
  EXPECT_EQ(d.train.count, 3);
  EXPECT_EQ(d.test.images.size(), 3u * 784);
  EXPECT_EQ(d.train.labels[2], 1);
}

TEST(Dataset, MissingFileNamesFileAndPackage) {
  const fs::path dir = tiny_dataset("missing", 3);
  fs::remove(dir / "t10k-labels-idx1-ubyte.gz");
  expect_dataset_error(dir, "t10k-labels-idx1-ubyte.gz: cannot open");
}

TEST(Dataset, CorruptGzipIsAnError) {
  const fs::path dir = tiny_dataset("corrupt", 3);
  // A gzip header followed by garbage: zlib must report it, not return short data.
  std::ofstream(dir / "train-images-idx3-ubyte.gz", std::ios::binary | std::ios::trunc)
      << std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage-not-deflate-data", 34);
  expect_dataset_error(dir, "train-images-idx3-ubyte.gz");
}

TEST(Dataset, TruncatedIdxIsAnError) {
  const fs::path dir = tiny_dataset("truncated", 3);
  auto bytes = idx(0x803, {3, 28, 28}, 3 * 784 - 5);
  write_gzip(dir / "train-images-idx3-ubyte.gz", bytes);
  expect_dataset_error(dir, "truncated or corrupt");
}

TEST(Dataset, BadMagicAndLabelsAreErrors) {
  fs::path dir = tiny_dataset("magic", 3);
  write_gzip(dir / "train-labels-idx1-ubyte.gz", idx(0x803, {3}, 3));
  expect_dataset_error(dir, "idx magic");
  dir = tiny_dataset("label", 3);
  auto labels = idx(0x801, {3}, 3);
  labels.back() = 10;  // not a class
  write_gzip(dir / "train-labels-idx1-ubyte.gz", labels);
  expect_dataset_error(dir, "label 10");
  dir = tiny_dataset("count", 3);
  write_gzip(dir / "t10k-labels-idx1-ubyte.gz", idx(0x801, {2}, 2));
  expect_dataset_error(dir, "2 labels for 3 images");
}

TEST(Dataset, RealFashionMnistWhenInstalled) {
  if (!fs::exists(fs::path(FASHION_MNIST_DIR) / "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  const FashionMnist d = load_fashion_mnist(FASHION_MNIST_DIR);
  EXPECT_EQ(d.train.count, 60000);
  EXPECT_EQ(d.test.count, 10000);
  std::vector<int> per_class(10);
  for (uint8_t y : d.train.labels) per_class[y]++;
  for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], 6000) << "class " << c;  // balanced, as published
  double sum = 0;
  for (float v : d.train.images) sum += v;
  EXPECT_NEAR(sum / static_cast<double>(d.train.images.size()), 0.0, 1e-3);  // standardized
}

// ---- checkpoint format --------------------------------------------------------

TrainState sample_state() {
  TrainState s;
  s.config = "hidden=4 seed=1";
  s.epoch = 2;
  s.step_in_epoch = 5;
  s.global_step = 45;
  s.epoch_rng = {1, 2, 3, 4};
  s.loss_sum = 1.25;
  s.wire_bytes = 1000;
  s.params = {1.0f, -2.0f, 3.5f};
  s.momentum = {0.0f, 0.5f, 0.25f};
  s.comm_state = {9, 8, 7};
  return s;
}

TEST(Checkpoint, RoundTripIsExactAndDeterministic) {
  const TrainState s = sample_state();
  const auto bytes = serialize_checkpoint(s, 1, 2);
  EXPECT_EQ(bytes, serialize_checkpoint(s, 1, 2));
  const TrainState t = parse_checkpoint(bytes, "x", 1, 2);
  EXPECT_EQ(t.config, s.config);
  EXPECT_EQ(t.global_step, 45);
  EXPECT_EQ(t.epoch_rng, s.epoch_rng);
  EXPECT_EQ(t.params, s.params);
  EXPECT_EQ(t.momentum, s.momentum);
  EXPECT_EQ(t.comm_state, s.comm_state);
  EXPECT_EQ(serialize_checkpoint(t, 1, 2), bytes);
}

TEST(Checkpoint, EveryFlippedByteAndTruncationIsRefused) {
  const auto bytes = serialize_checkpoint(sample_state(), 0, 1);
  for (size_t i = 0; i < bytes.size(); ++i) {
    auto bad = bytes;
    bad[i] ^= 0x10;
    EXPECT_THROW(parse_checkpoint(bad, "x", 0, 1), CorruptPayload) << "byte " << i;
  }
  for (size_t n : {size_t{0}, size_t{7}, bytes.size() / 2, bytes.size() - 1}) {
    EXPECT_THROW(parse_checkpoint(std::span(bytes).first(n), "x", 0, 1), CorruptPayload) << n << " bytes";
  }
  try {
    parse_checkpoint(std::span(bytes).first(bytes.size() - 1), "/d/rank0.ckpt", 0, 1);
  } catch (const CorruptPayload& e) {
    EXPECT_NE(std::string(e.what()).find("/d/rank0.ckpt"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, OtherRankOrWorldIsRefused) {
  const auto bytes = serialize_checkpoint(sample_state(), 1, 2);
  EXPECT_THROW(parse_checkpoint(bytes, "x", 0, 2), InvalidArgument);
  EXPECT_THROW(parse_checkpoint(bytes, "x", 1, 4), InvalidArgument);
}

TEST(Checkpoint, WriteReplacesAtomicallyAndKeepsPrevious) {
  const fs::path dir = fresh_dir("write");
  TrainState s = sample_state();
  write_checkpoint(dir.string(), 3, serialize_checkpoint(s, 3, 4));
  s.global_step = 46;
  write_checkpoint(dir.string(), 3, serialize_checkpoint(s, 3, 4));
  const auto now = read_file_if_exists(checkpoint_path(dir.string(), 3));
  const auto prev = read_file_if_exists(checkpoint_path(dir.string(), 3) + ".prev");
  ASSERT_TRUE(now && prev);
  EXPECT_EQ(parse_checkpoint(*now, "now", 3, 4).global_step, 46);
  EXPECT_EQ(parse_checkpoint(*prev, "prev", 3, 4).global_step, 45);
  EXPECT_FALSE(fs::exists(checkpoint_path(dir.string(), 3) + ".tmp"));
  EXPECT_FALSE(read_file_if_exists((dir / "absent").string()).has_value());
}

// ---- what the trainer hands the communicator ------------------------------------

// Computes on the CPU (make_cpu_backend) but labels the gradient and mask views it
// hands out with `device`, and records them: what the CUDA backend hands the
// communicator, observable without a GPU.
class LabellingBackend final : public Backend {
 public:
  LabellingBackend(std::unique_ptr<Backend> inner, Device device, std::vector<TensorView>* handed)
      : inner_(std::move(inner)), device_(device), handed_(handed) {}
  const char* name() const override { return "labelling"; }
  void upload(const float* p, const float* m) override { inner_->upload(p, m); }
  void download(float* p, float* m) override { inner_->download(p, m); }
  double forward_backward(const float* x, const uint8_t* y, int64_t batch, bool* finite,
                          const LayerDone& layer_done) override {
    return inner_->forward_backward(x, y, batch, finite, layer_done);
  }
  void poison_gradient() override { inner_->poison_gradient(); }
  void evaluate(const float* x, const uint8_t* y, int64_t count, int64_t* correct, double* loss_sum) override {
    inner_->evaluate(x, y, count, correct, loss_sum);
  }
  TensorView gradient(const ParamRange& r) override { return label(inner_->gradient(r)); }
  TensorView mask(const ParamRange& r) override { return label(inner_->mask(r)); }
  void* stream() override { return nullptr; }
  void zero_nonfinite(const ParamRange& r) override { inner_->zero_nonfinite(r); }
  void dgc_accumulate(const ParamRange& r, const SgdConfig& c) override { inner_->dgc_accumulate(r, c); }
  void sgd_update(const ParamRange& r, const SgdConfig& c, float lr) override { inner_->sgd_update(r, c, lr); }
  void dgc_update(const ParamRange& r, float lr, bool masked) override { inner_->dgc_update(r, lr, masked); }

 private:
  TensorView label(TensorView v) {
    v.device = device_;
    handed_->push_back(v);
    return v;
  }
  std::unique_ptr<Backend> inner_;
  Device device_;
  std::vector<TensorView>* handed_;
};

// One rank, a tiny data set, one epoch of a small MLP on `device`.
void train_with_labels(const std::string& name, bool overlap, const std::string& device_flag, Device label,
                       std::vector<TensorView>* handed, std::vector<Device>* asked) {
  Config c;
  c.data_dir = tiny_dataset(name, 16).string();
  c.hidden = {8};
  c.epochs = 1;
  c.batch_size = 4;
  c.progress_s = 0;
  c.overlap = overlap;
  c.device = device_flag;
  c.compressor = "topk:ratio=0.25";
  InitOptions init;
  init.rank = 0;
  init.world_size = 1;
  auto comm = Communicator::create(init);
  run_training(c, *comm, [&](const MlpLayout& layout, int64_t max_batch, Device device) {
    asked->push_back(device);
    return std::make_unique<LabellingBackend>(make_cpu_backend(layout, max_batch), label, handed);
  });
}

// The control: labelled as host memory, the same backend trains to the end, and the
// communicator got the backend's own buffers (no copies) for every parameter.
TEST(TrainerViews, HostViewsTrainToTheEnd) {
  for (bool overlap : {true, false}) {
    std::vector<TensorView> handed;
    std::vector<Device> asked;
    ASSERT_NO_THROW(train_with_labels("views_cpu", overlap, "cpu", Device{DeviceType::kCpu, 0}, &handed, &asked));
    ASSERT_EQ(asked.size(), 1u);
    EXPECT_EQ(asked[0].type, DeviceType::kCpu);
    // 4 steps x 4 tensors (fc1/fc2 weight and bias), each handed once per step.
    EXPECT_EQ(handed.size(), 16u) << "overlap " << overlap;
  }
}

// --device cuda: the trainer asks for a CUDA backend and hands the communicator that
// backend's Device{kCuda} views, not host copies. This machine's communicator then
// refuses them (no CUDA device, or, on a GPU machine, host memory labelled as device
// memory), naming the allreduce and the device: proof of what it was handed.
TEST(TrainerViews, CudaTrainerHandsTheCommunicatorDeviceViews) {
  for (bool overlap : {true, false}) {
    std::vector<TensorView> handed;
    std::vector<Device> asked;
    try {
      train_with_labels("views_cuda", overlap, "cuda:0", Device{DeviceType::kCuda, 0}, &handed, &asked);
      FAIL() << "a CPU buffer labelled cuda:0 reached no allreduce";
    } catch (const Error& e) {
      std::string what = e.what();
      std::transform(what.begin(), what.end(), what.begin(), [](unsigned char ch) { return std::tolower(ch); });
      EXPECT_NE(what.find("allreduce"), std::string::npos) << e.what();
      EXPECT_NE(what.find("cuda"), std::string::npos) << e.what();
    }
    ASSERT_EQ(asked.size(), 1u);
    EXPECT_EQ(asked[0].type, DeviceType::kCuda);
    EXPECT_EQ(asked[0].index, 0);
    ASSERT_FALSE(handed.empty()) << "overlap " << overlap;
    for (const TensorView& v : handed) {
      EXPECT_EQ(v.device.type, DeviceType::kCuda);
      EXPECT_EQ(v.dtype, DType::kFloat32);
    }
  }
}

// ---- the two streams' hand-over (what the CUDA backend's events order) ----------

// Trains on the CPU but records, in order, what touches the gradient buffer: the
// backend's work on a range (zero_nonfinite, dgc_accumulate, the updates), the views
// handed to the communicator, and the two hand-overs. The CUDA backend turns the
// hand-overs into events between its two streams; here the order is what can be seen.
class HandoverBackend final : public Backend {
 public:
  HandoverBackend(std::unique_ptr<Backend> inner, std::vector<std::string>* log)
      : inner_(std::move(inner)), log_(log) {}
  const char* name() const override { return "handover"; }
  void upload(const float* p, const float* m) override { inner_->upload(p, m); }
  void download(float* p, float* m) override { inner_->download(p, m); }
  double forward_backward(const float* x, const uint8_t* y, int64_t batch, bool* finite,
                          const LayerDone& layer_done) override {
    log_->push_back("backward");
    return inner_->forward_backward(x, y, batch, finite, layer_done);
  }
  void poison_gradient() override { inner_->poison_gradient(); }
  void evaluate(const float* x, const uint8_t* y, int64_t count, int64_t* correct, double* loss_sum) override {
    inner_->evaluate(x, y, count, correct, loss_sum);
  }
  TensorView gradient(const ParamRange& r) override { return note("allreduce", r, inner_->gradient(r)); }
  TensorView mask(const ParamRange& r) override { return inner_->mask(r); }
  void* stream() override { return nullptr; }
  void gradients_to_comm() override { log_->push_back("to_comm"); }
  void gradients_from_comm() override { log_->push_back("from_comm"); }
  void zero_nonfinite(const ParamRange& r) override {
    note("compute", r);
    inner_->zero_nonfinite(r);
  }
  void dgc_accumulate(const ParamRange& r, const SgdConfig& c) override {
    note("compute", r);
    inner_->dgc_accumulate(r, c);
  }
  void sgd_update(const ParamRange& r, const SgdConfig& c, float lr) override {
    note("update", r);
    inner_->sgd_update(r, c, lr);
  }
  void dgc_update(const ParamRange& r, float lr, bool masked) override {
    note("update", r);
    inner_->dgc_update(r, lr, masked);
  }

 private:
  TensorView note(const char* what, const ParamRange& r, TensorView v = {}) {
    log_->push_back(std::string(what) + " " + r.name);
    return v;
  }
  std::unique_ptr<Backend> inner_;
  std::vector<std::string>* log_;
};

// Every allreduce of a range comes after a to_comm that comes after all of this
// step's compute on that range; every update after a from_comm that comes after all
// of the step's allreduces. (A stream that skipped either would race on the buffer.)
TEST(TrainerStreams, GradientsAreHandedToCommBeforeTheirAllreduceAndBackBeforeTheUpdate) {
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    Config c;
    c.data_dir = tiny_dataset("handover", 16).string();
    c.hidden = {8};
    c.epochs = 1;
    c.batch_size = 4;
    c.progress_s = 0;
    c.overlap = overlap;
    c.compressor = "topk:ratio=0.25";
    c.momentum_correction = true;  // dgc_accumulate before the allreduce, dgc_update after
    InitOptions init;
    init.rank = 0;
    init.world_size = 1;
    auto comm = Communicator::create(init);
    std::vector<std::string> log;
    run_training(c, *comm, [&](const MlpLayout& layout, int64_t max_batch, Device) {
      return std::make_unique<HandoverBackend>(make_cpu_backend(layout, max_batch), &log);
    });
    auto starts = [](const std::string& s, const char* p) { return s.rfind(p, 0) == 0; };
    size_t steps = 0, allreduces = 0, updates = 0;
    for (size_t step_begin = 0; step_begin < log.size();) {
      if (log[step_begin] != "backward") {  // before the first step
        ++step_begin;
        continue;
      }
      size_t end = step_begin + 1;
      while (end < log.size() && log[end] != "backward") ++end;
      ++steps;
      for (size_t i = step_begin; i < end; ++i) {
        if (starts(log[i], "allreduce ")) {
          ++allreduces;
          const std::string name = log[i].substr(10);
          size_t to_comm = i;
          while (to_comm > step_begin && log[to_comm] != "to_comm") --to_comm;
          ASSERT_EQ(log[to_comm], "to_comm") << "allreduce of " << name << " without a hand-over";
          for (size_t j = to_comm; j < end; ++j) {
            EXPECT_NE(log[j], "compute " + name) << name << ": computed on after its hand-over";
          }
        }
        if (starts(log[i], "update ")) {
          ++updates;
          size_t from_comm = i;
          while (from_comm > step_begin && log[from_comm] != "from_comm") --from_comm;
          ASSERT_EQ(log[from_comm], "from_comm") << log[i] << " without the hand-back";
          for (size_t j = from_comm; j < end; ++j) EXPECT_FALSE(starts(log[j], "allreduce ")) << log[j];
        }
      }
      step_begin = end;
    }
    EXPECT_EQ(steps, 4u);
    EXPECT_EQ(allreduces, 16u);  // 4 steps x 4 tensors
    EXPECT_EQ(updates, 16u);
  }
}

// ---- what a CPU run loads -----------------------------------------------------

// cuBLAS is opened when a CUDA backend is made (base/cublas_loader.h), not linked:
// linking it cost every trainer process 0.4 s and 215 MB at start. This binary links
// the trainer's core, CUDA backend included in a CUDA build, and has made none.
TEST(TrainerLoading, CublasIsNotMappedWithoutACudaBackend) {
  std::ifstream maps("/proc/self/maps");
  ASSERT_TRUE(maps.is_open());
  std::string line;
  while (std::getline(maps, line)) EXPECT_EQ(line.find("libcublas"), std::string::npos) << line;
}

}  // namespace
}  // namespace gradcomm::train
