// gradcomm-train's loop, top to bottom:
//   setup:   data, model, optimizer, backend, (resume from checkpoints)
//   epoch:   a permutation of the training set shared by all ranks; rank r takes
//            every N-th example from r (disjoint shards), in steps of batch_size
//   step:    forward/backward, each layer's allreduce_async(kAvg, {compressor,
//            key = "fc1.weight", ...}) issued as soon as backward has produced that
//            layer's gradient (last layer first) -> agree on finiteness (--nan) ->
//            wait, update. --no-overlap: backward, agree, then the allreduces one
//            by one, update. On a GPU the allreduces run on the backend's second
//            stream (backend.h: gradients_to_comm / gradients_from_comm), so they
//            overlap backward there too.
//   end:     sharded test evaluation, one JSON line, checkpoint
// Every rank runs the same number of steps and the same collectives in the same
// order, and the arithmetic depends only on the seed and the rank count: two runs
// with the same settings write byte-identical checkpoints. (Hence no fusion here,
// main.cc: which calls fuse follows timing. Each key's allreduce is independent of
// the others, so the two schedules compute the same bits.)
#include "trainer/train.h"

#include <cblas.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <cmath>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <numeric>

#include "gradcomm/errors.h"
#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "trainer/dataset.h"
#include "trainer/rng.h"

namespace gradcomm::train {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kEvalChunk = 1000;           // rows per evaluation forward pass
constexpr uint64_t kShuffleStream = 0x73687566;  // "shuf"

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The q-quantile of `v` (nearest rank); 0 for none.
double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t at = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(at), v.end());
  return v[at];
}

// The shuffled order of one epoch: Fisher-Yates driven by the shared generator,
// so every rank holds the same permutation and takes its own slice of it.
std::vector<uint32_t> epoch_permutation(Rng& rng, int64_t count) {
  std::vector<uint32_t> perm(static_cast<size_t>(count));
  std::iota(perm.begin(), perm.end(), 0u);
  for (int64_t i = count - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(static_cast<uint64_t>(i) + 1)]);
  return perm;
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return {DeviceType::kCpu, 0};
  if (text == "cuda") return {DeviceType::kCuda, 0};
  if (text.rfind("cuda:", 0) == 0) {
    const std::string index = text.substr(5);
    if (!index.empty() && index.size() < 4 && std::all_of(index.begin(), index.end(), ::isdigit)) {
      return {DeviceType::kCuda, std::stoi(index)};
    }
  }
  throw InvalidArgument(fmt::format("--device '{}': expected cpu, cuda or cuda:N", text));
}

// Whose turn it is to write the log, and where.
std::string log_path_for(const std::string& pattern, int rank) {
  const size_t at = pattern.find("{rank}");
  if (at != std::string::npos) {
    std::string p = pattern;
    return p.replace(at, 6, std::to_string(rank));
  }
  return rank == 0 ? pattern : std::string();
}

// On resume: keeps only the log lines of epochs the checkpoint has completed, so
// an epoch logged after the checkpoint (and then lost with the kill) is not
// logged twice when it is run again.
void trim_log(const std::string& path, int64_t completed_epochs) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("epoch") && j["epoch"].is_number_integer() &&
        j["epoch"].get<int64_t>() <= completed_epochs) {
      kept += line + '\n';
    }
  }
  in.close();
  std::ofstream(path, std::ios::trunc) << kept;
}

class Trainer {
 public:
  Trainer(const Config& config, Communicator& comm, const BackendFactory& make_backend)
      : c_(config), comm_(comm), make_backend_(make_backend) {}
  void run();

 private:
  void setup();
  bool resume();
  void begin_epoch();
  void step();
  void load_batch();
  // One step of each schedule; false when every rank skipped it (--nan skip).
  bool step_blocking(double& loss);
  bool step_overlapped(double& loss);
  void update();
  bool skip_nonfinite(const std::vector<uint8_t>& flags);
  void end_epoch();
  // The epoch line's parts: bytes against the dense ring, and the wall time split
  // into parts that add up to it (other_seconds: what no part accounts for).
  std::string describe_bytes() const;
  std::string describe_time(double time_s, double eval_s) const;
  double other_seconds(double time_s, double eval_s) const;
  // Rank 0: a line within the epoch every --progress seconds (in place on a terminal).
  void report_progress();
  void save_checkpoint();
  std::vector<uint8_t> agree_nonfinite(bool finite);
  // CUDA: a call on device tensors completes once enqueued, on the backend's
  // communication stream. Waiting for it here, through the communicator, before the
  // backend's own stream is made to follow it (gradients_from_comm), bounds the wait
  // by the deadline and raises a peer's failure, instead of blocking later in
  // cudaStreamSynchronize on NCCL work a dead peer never matches. CPU: nothing to do.
  void settle_device_work() {
    if (backend_->comm_stream() != nullptr) comm_.synchronize();
  }
  // The allreduce options of one parameter: the compressor, its key, and its shape.
  CompressOptions options_for(const ParamRange& r) const {
    CompressOptions o;
    o.compressor = c_.compressor;
    o.key = r.name;
    o.shape = r.shape;
    o.stream = backend_ ? backend_->comm_stream() : nullptr;  // CUDA: the backend's stream for communication
    return o;
  }

  const Config& c_;
  Communicator& comm_;
  const BackendFactory& make_backend_;
  int rank_ = 0, size_ = 1;
  FashionMnist data_;
  MlpLayout layout_;
  SgdConfig sgd_;
  std::unique_ptr<Backend> backend_;
  int64_t steps_per_epoch_ = 0;
  Rng shuffle_{0, 0};
  std::vector<uint32_t> perm_;
  TrainState s_;  // counters, accumulators and (at checkpoint time) the buffers
  std::vector<float> batch_x_;
  std::vector<uint8_t> batch_y_;
  std::vector<char> dgc_mode_;  // per range, decided before each allreduce
  std::string log_path_;
  // Time-dependent, never checkpointed: this epoch's split of wall time.
  Clock::time_point epoch_start_;
  Clock::time_point last_progress_;
  // compute: forward, backward, update; data: batch assembly; comm: time waiting on
  // communication (exposed); compress: encode + decode, inside comm's calls when
  // blocking, on the engine thread (overlapped, not part of the wall time) otherwise.
  double compute_s_ = 0, compress_s_ = 0, comm_s_ = 0, data_s_ = 0;
  std::vector<double> step_s_;  // wall time of each step this epoch
  int64_t last_checkpoint_step_ = -1;
};

void Trainer::setup() {
  rank_ = comm_.rank();
  size_ = comm_.size();
  const Device device = parse_device(c_.device);
  openblas_set_num_threads(c_.threads);
  data_ = load_fashion_mnist(c_.data_dir, c_.limit_train, c_.limit_test);
  layout_ = MlpLayout::make(kImagePixels, c_.hidden, kClasses);
  const int64_t per_rank = data_.train.count / size_;
  steps_per_epoch_ = per_rank / c_.batch_size;
  if (steps_per_epoch_ == 0) {
    throw InvalidArgument(fmt::format("rank {}: {} training examples give {} per rank, fewer than one batch of {}",
                                      rank_, data_.train.count, per_rank, c_.batch_size));
  }
  sgd_.lr = static_cast<float>(c_.lr);
  sgd_.momentum = static_cast<float>(c_.momentum);
  sgd_.weight_decay = static_cast<float>(c_.weight_decay);
  sgd_.nesterov = c_.nesterov;
  sgd_.total_steps = steps_per_epoch_ * c_.epochs;
  sgd_.warmup_steps = c_.warmup_steps >= 0 ? c_.warmup_steps
                                           : static_cast<int64_t>(c_.warmup_epochs * static_cast<double>(steps_per_epoch_));
  sgd_.cosine = c_.lr_schedule == "cosine";

  // Validate the compressor (and momentum correction's needs) before any step.
  for (const ParamRange& r : layout_.ranges) {
    const AllreducePlan plan = comm_.plan_allreduce(r.numel, options_for(r));
    // compressor=auto decides per step whether a layer sparsifies (step() asks each time).
    const bool chooses = c_.compressor == "auto" || c_.compressor.rfind("auto:", 0) == 0;
    if (c_.momentum_correction && !plan.sparse_with_feedback && !chooses) {
      throw InvalidArgument(fmt::format("--momentum-correction needs a sparsifier with error feedback (topk, randomk "
                                        "or sketch, ef=1); --compressor is '{}'",
                                        c_.compressor));
    }
  }
  const int64_t max_batch = std::max(c_.batch_size, kEvalChunk);
  if (make_backend_) {
    backend_ = make_backend_(layout_, max_batch, device);
  } else {
    backend_ = device.type == DeviceType::kCpu ? make_cpu_backend(layout_, max_batch)
                                               : make_cuda_backend(layout_, max_batch, device.index);
  }
  batch_x_.resize(static_cast<size_t>(c_.batch_size * kImagePixels));
  batch_y_.resize(static_cast<size_t>(c_.batch_size));
  dgc_mode_.assign(layout_.ranges.size(), 0);
  log_path_ = log_path_for(c_.log_path, rank_);

  s_.config = c_.canonical();
  if (!(c_.resume && resume())) {
    std::vector<float> params(static_cast<size_t>(layout_.num_params));
    std::vector<float> momentum(params.size(), 0.0f);
    init_parameters(layout_, c_.seed, params.data());
    backend_->upload(params.data(), momentum.data());
    shuffle_ = Rng(c_.seed, kShuffleStream);
    if (!log_path_.empty()) std::ofstream(log_path_, std::ios::trunc);  // a fresh run starts a fresh log
    begin_epoch();
  }
  if (rank_ == 0) {
    // The device as asked for ("cpu", "cuda:1"); the backend only where it says more.
    const std::string device = c_.device.starts_with(backend_->name()) ? c_.device
                                                            : fmt::format("{} ({} backend)", c_.device, backend_->name());
    fmt::print("gradcomm-train: {} rank{}, MLP {} on {}, {} steps/epoch of {} x {} examples, lr {} (warm-up {} "
               "steps, {}), compressor {}{}\n",
               size_, size_ == 1 ? "" : "s", layout_.describe(), device, steps_per_epoch_, size_, c_.batch_size, c_.lr,
               sgd_.warmup_steps, c_.lr_schedule, c_.compressor, c_.momentum_correction ? " + momentum correction" : "");
    std::fflush(stdout);
  }
}

// Loads this rank's checkpoint; every rank must resume from the same step. Each
// rank may hold two (rank<R>.ckpt and the one before, .prev): ranks killed at
// different moments can be one checkpoint apart, and the newest step every rank
// holds wins. Returns false (start fresh) only when no rank has any checkpoint.
bool Trainer::resume() {
  struct Candidate {
    std::string path;
    TrainState state;
  };
  std::vector<Candidate> mine;
  const std::string path = checkpoint_path(c_.checkpoint_dir, rank_);
  for (const std::string& p : {path, path + ".prev"}) {
    if (auto bytes = read_file_if_exists(p)) mine.push_back({p, parse_checkpoint(*bytes, p, rank_, size_)});
  }
  // Steps on offer: [newest, older], -1 for none; every rank sees every rank's.
  std::vector<int64_t> offer(2, -1), all(static_cast<size_t>(2 * size_));
  for (size_t i = 0; i < mine.size(); ++i) offer[i] = mine[i].state.global_step;
  comm_.allgather(TensorView::of(offer.data(), 2), TensorView::of(all.data(), 2 * size_));
  if (std::all_of(all.begin(), all.end(), [](int64_t s) { return s < 0; })) {
    if (rank_ == 0) fmt::print("gradcomm-train: --resume: no checkpoints in {}, starting fresh\n", c_.checkpoint_dir);
    return false;
  }
  int64_t chosen = -1;
  for (int64_t candidate : offer) {
    bool everywhere = candidate >= 0;
    for (int r = 0; r < size_ && everywhere; ++r) everywhere = all[2 * r] == candidate || all[2 * r + 1] == candidate;
    if (everywhere) chosen = std::max(chosen, candidate);
  }
  // A step held by every rank is among every rank's own offers, so all ranks
  // choose the same one without another exchange.
  if (chosen < 0) {
    std::string held;
    for (int r = 0; r < size_; ++r) held += fmt::format("{}rank {}: {}/{}", r ? "; " : "", r, all[2 * r], all[2 * r + 1]);
    throw InvalidArgument(fmt::format("rank {}: --resume: the ranks hold checkpoints of no common step in {} "
                                      "(steps newest/previous, -1 = none: {})",
                                      rank_, c_.checkpoint_dir, held));
  }
  auto it = std::find_if(mine.begin(), mine.end(), [&](const Candidate& k) { return k.state.global_step == chosen; });
  TrainState& st = it->state;
  if (st.config != s_.config) {
    throw InvalidArgument(fmt::format("rank {}: --resume: checkpoint {} was written with different settings:\n  "
                                      "checkpoint: {}\n  this run:   {}",
                                      rank_, it->path, st.config, s_.config));
  }
  if (st.params.size() != static_cast<size_t>(layout_.num_params) || st.epoch > c_.epochs ||
      st.step_in_epoch > steps_per_epoch_) {
    throw CorruptPayload(fmt::format("rank {}: checkpoint {}: {} parameters at epoch {} step {}, expected {} "
                                     "parameters and at most {} epochs of {} steps",
                                     rank_, it->path, st.params.size(), st.epoch, st.step_in_epoch,
                                     layout_.num_params, c_.epochs, steps_per_epoch_));
  }
  comm_.load_state(st.comm_state);
  backend_->upload(st.params.data(), st.momentum.data());
  s_ = std::move(st);
  s_.params.clear();
  s_.momentum.clear();
  s_.comm_state.clear();
  shuffle_ = Rng(s_.epoch_rng);
  perm_ = epoch_permutation(shuffle_, data_.train.count);
  epoch_start_ = Clock::now();
  last_checkpoint_step_ = s_.global_step;
  if (!log_path_.empty()) trim_log(log_path_, s_.epoch);
  if (rank_ == 0) {
    fmt::print("gradcomm-train: resumed from {} at epoch {} step {} (global step {})\n", it->path, s_.epoch + 1,
               s_.step_in_epoch, s_.global_step);
  }
  return true;
}

void Trainer::begin_epoch() {
  s_.epoch_rng = shuffle_.state();
  perm_ = epoch_permutation(shuffle_, data_.train.count);
  s_.step_in_epoch = 0;
  s_.loss_sum = 0;
  s_.loss_batches = 0;
  s_.wire_bytes = s_.dense_bytes = 0;
  s_.epoch_skipped = 0;
  epoch_start_ = Clock::now();
  compute_s_ = compress_s_ = comm_s_ = data_s_ = 0;
  step_s_.clear();
  last_progress_ = Clock::now();
}

// Every rank learns which ranks saw a non-finite loss or gradient this step, so
// all take the same decision (skip or abort) and the collectives stay matched.
std::vector<uint8_t> Trainer::agree_nonfinite(bool finite) {
  std::vector<uint8_t> flags(static_cast<size_t>(size_));
  uint8_t mine = finite ? 0 : 1;
  comm_.allgather(TensorView::of(&mine, 1), TensorView::of(flags.data(), size_));
  return flags;
}

void Trainer::load_batch() {
  // This rank's batch: examples perm[(step * B + j) * N + rank].
  for (int64_t j = 0; j < c_.batch_size; ++j) {
    const uint32_t example = perm_[static_cast<size_t>(((s_.step_in_epoch * c_.batch_size + j) * size_) + rank_)];
    std::copy_n(data_.train.images.data() + static_cast<size_t>(example) * kImagePixels, kImagePixels,
                batch_x_.data() + j * kImagePixels);
    batch_y_[static_cast<size_t>(j)] = data_.train.labels[example];
  }
}

void Trainer::step() {
  if (s_.global_step == c_.debug_kill_at_step && rank_ == c_.debug_rank) {
    std::fflush(nullptr);
    std::raise(SIGKILL);  // test hook: die as abruptly as a killed process does
  }
  const auto start = Clock::now();
  load_batch();
  data_s_ += seconds_since(start);
  const Stats before = comm_.stats();
  double loss = 0;
  const bool stepped = c_.overlap ? step_overlapped(loss) : step_blocking(loss);
  const Stats after = comm_.stats();
  // What this rank gave the others: on the transport, and into its node's shared segment
  // (docs/shared-memory.md), where ranks of one host meet without the transport.
  s_.wire_bytes += (after.bytes_sent - before.bytes_sent) + (after.node_shm_bytes - before.node_shm_bytes);
  compress_s_ += (after.encode_s - before.encode_s) + (after.decode_s - before.decode_s);
  if (stepped) {
    s_.loss_sum += loss;
    s_.loss_batches += 1;
  }
  step_s_.push_back(seconds_since(start));
}

// Every rank learned which ranks saw a non-finite loss or gradient: all skip the
// step (or all abort), so the collectives stay matched. True when skipped.
bool Trainer::skip_nonfinite(const std::vector<uint8_t>& flags) {
  if (std::none_of(flags.begin(), flags.end(), [](uint8_t f) { return f != 0; })) return false;
  std::string ranks;
  for (int r = 0; r < size_; ++r) {
    if (flags[static_cast<size_t>(r)]) ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", r);
  }
  if (c_.nan == "abort") {
    throw InvalidArgument(fmt::format("rank {}: non-finite loss or gradient at epoch {} step {} (global step {}) "
                                      "on rank(s) {}; aborting (--nan abort; --nan skip drops such steps)",
                                      rank_, s_.epoch + 1, s_.step_in_epoch, s_.global_step, ranks));
  }
  if (rank_ == 0) {
    fmt::print("gradcomm-train: skipping global step {}: non-finite loss or gradient on rank(s) {}\n", s_.global_step,
               ranks);
  }
  ++s_.skipped_steps;
  ++s_.epoch_skipped;
  return true;
}

// Backward first; then every rank agrees on finiteness; then the allreduces, one
// by one, blocking; then the update. A skipped step runs no allreduce at all.
bool Trainer::step_blocking(double& loss) {
  auto t0 = Clock::now();
  bool finite = true;
  loss = backend_->forward_backward(batch_x_.data(), batch_y_.data(), c_.batch_size, &finite);
  if (s_.global_step == c_.debug_nan_at_step && rank_ == c_.debug_rank) {
    backend_->poison_gradient();
    loss = NAN;
    finite = false;
  }
  compute_s_ += seconds_since(t0);

  t0 = Clock::now();
  const std::vector<uint8_t> flags = agree_nonfinite(finite);
  comm_s_ += seconds_since(t0);
  if (skip_nonfinite(flags)) return false;

  t0 = Clock::now();
  for (size_t i = 0; i < layout_.ranges.size(); ++i) {
    const ParamRange& r = layout_.ranges[i];
    // Momentum correction only where the allreduce really sparsifies; dense keys
    // (min_numel, warm-up) use plain momentum on the averaged gradient.
    dgc_mode_[i] = c_.momentum_correction && comm_.plan_allreduce(r.numel, options_for(r)).sparse_with_feedback;
    if (dgc_mode_[i]) backend_->dgc_accumulate(r, sgd_);
  }
  compute_s_ += seconds_since(t0);

  t0 = Clock::now();
  const Stats before = comm_.stats();
  backend_->gradients_to_comm();
  for (const ParamRange& r : layout_.ranges) {
    comm_.allreduce(backend_->gradient(r), ReduceOp::kAvg, options_for(r));
    // What the dense ring sends for this tensor: 2(N-1)/N of its bytes.
    s_.dense_bytes += static_cast<uint64_t>(2 * (size_ - 1) * r.numel * 4 / size_);
  }
  settle_device_work();
  backend_->gradients_from_comm();
  const Stats after = comm_.stats();
  // Blocking: the calls' encode and decode are inside them; comm is the rest.
  comm_s_ += seconds_since(t0) - ((after.encode_s - before.encode_s) + (after.decode_s - before.decode_s));

  t0 = Clock::now();
  update();
  compute_s_ += seconds_since(t0);
  return true;
}

// Each layer's allreduces start from backward's callback, while the layers below
// are still being differentiated. A non-finite local gradient is zeroed before it
// leaves (so no NaN reaches a peer or a residual) and flagged; the flags are agreed
// after backward, and a skipped step's allreduces have then already run (their
// results are dropped; error-feedback residuals have taken the step).
bool Trainer::step_overlapped(double& loss) {
  const bool poison = s_.global_step == c_.debug_nan_at_step && rank_ == c_.debug_rank;
  std::vector<std::shared_ptr<Work>> works(layout_.ranges.size());
  const LayerDone layer_done = [&](size_t layer) {
    if (poison && layer == 0) backend_->poison_gradient();  // the first element of fc1.weight
    const size_t ranges[] = {2 * layer, 2 * layer + 1};
    for (size_t i : ranges) {
      const ParamRange& r = layout_.ranges[i];
      dgc_mode_[i] = c_.momentum_correction && comm_.plan_allreduce(r.numel, options_for(r)).sparse_with_feedback;
      if (dgc_mode_[i]) backend_->dgc_accumulate(r, sgd_);
      backend_->zero_nonfinite(r);  // no NaN leaves; forward_backward's finite says if there was one
    }
    backend_->gradients_to_comm();
    for (size_t i : ranges) {
      const ParamRange& r = layout_.ranges[i];
      works[i] = comm_.allreduce_async(backend_->gradient(r), ReduceOp::kAvg, options_for(r));
      s_.dense_bytes += static_cast<uint64_t>(2 * (size_ - 1) * r.numel * 4 / size_);
    }
  };
  auto t0 = Clock::now();
  bool finite = true;  // the loss, and what zero_nonfinite zeroed
  loss = backend_->forward_backward(batch_x_.data(), batch_y_.data(), c_.batch_size, &finite, layer_done);
  if (poison) loss = NAN;
  finite = finite && std::isfinite(loss);
  compute_s_ += seconds_since(t0);

  // Exposed communication: whatever of the allreduces backward did not hide. The
  // flags' allgather queues behind them, so it returns once they are all done (on
  // a GPU: enqueued; settle_device_work waits for the device's part).
  t0 = Clock::now();
  const std::vector<uint8_t> flags = agree_nonfinite(finite);
  for (auto& work : works) work->wait();
  settle_device_work();
  backend_->gradients_from_comm();
  comm_s_ += seconds_since(t0);
  if (skip_nonfinite(flags)) return false;

  t0 = Clock::now();
  update();
  compute_s_ += seconds_since(t0);
  return true;
}

void Trainer::update() {
  const float lr = learning_rate(sgd_, s_.global_step);
  for (size_t i = 0; i < layout_.ranges.size(); ++i) {
    const ParamRange& r = layout_.ranges[i];
    if (dgc_mode_[i]) {
      const bool masked = comm_.sent_mask(r.name, backend_->mask(r), backend_->stream());
      backend_->dgc_update(r, lr, masked);
    } else {
      backend_->sgd_update(r, sgd_, lr);
    }
  }
}

std::string Trainer::describe_bytes() const {
  if (size_ == 1) return "wire 0 MB (one rank: nothing to send)";
  const double fewer = s_.wire_bytes > 0 ? static_cast<double>(s_.dense_bytes) / static_cast<double>(s_.wire_bytes) : 0;
  return fmt::format("wire {:.1f} MB (dense ring {:.1f} MB, {:.1f}x fewer)", s_.wire_bytes / 1e6, s_.dense_bytes / 1e6,
                     fewer);
}

// Blocking steps hold their encode and decode inside the calls, so compress is a
// part of the wall time; overlapped, it runs on the engine thread during compute
// and is shown beside the sum, not in it.
double Trainer::other_seconds(double time_s, double eval_s) const {
  const double parts = compute_s_ + comm_s_ + data_s_ + eval_s + (c_.overlap ? 0.0 : compress_s_);
  return std::max(0.0, time_s - parts);
}

std::string Trainer::describe_time(double time_s, double eval_s) const {
  const std::string compress =
      c_.overlap ? "" : fmt::format(" + compress {:.1f}", compress_s_);
  std::string line = fmt::format("{:.1f} s = compute {:.1f} + comm {:.1f} exposed{} + data {:.1f} + eval {:.1f} + other {:.1f}",
                                 time_s, compute_s_, comm_s_, compress, data_s_, eval_s, other_seconds(time_s, eval_s));
  if (c_.overlap) line += fmt::format(" (compress {:.1f} overlapped)", compress_s_);
  return line;
}

void Trainer::report_progress() {
  if (rank_ != 0 || c_.progress_s <= 0 || s_.step_in_epoch == steps_per_epoch_) return;
  const bool tty = isatty(STDOUT_FILENO);
  // A terminal gets an in-place line often; a pipe or a file a full line now and then.
  const double every = tty ? std::min(c_.progress_s, 0.5) : c_.progress_s;
  if (seconds_since(last_progress_) < every) return;
  last_progress_ = Clock::now();
  const double loss = s_.loss_batches ? s_.loss_sum / static_cast<double>(s_.loss_batches) : 0.0;
  const std::string text =
      fmt::format("epoch {}/{} step {}/{} ({:.0f} %)  train_loss {:.4f}  {:.1f} s", s_.epoch + 1, c_.epochs,
                  s_.step_in_epoch, steps_per_epoch_, 100.0 * static_cast<double>(s_.step_in_epoch) /
                  static_cast<double>(steps_per_epoch_), loss, seconds_since(epoch_start_));
  if (tty) {
    fmt::print("\r\033[K{}", text);
  } else {
    fmt::print("{}\n", text);
  }
  std::fflush(stdout);
}

void Trainer::end_epoch() {
  // Test set split by rank (contiguous), summed with the training loss.
  const int64_t lo = data_.test.count * rank_ / size_, hi = data_.test.count * (rank_ + 1) / size_;
  int64_t correct = 0;
  double test_loss = 0;
  auto t0 = Clock::now();
  backend_->evaluate(data_.test.images.data() + lo * kImagePixels, data_.test.labels.data() + lo, hi - lo, &correct,
                     &test_loss);
  const double eval_s = seconds_since(t0);
  std::vector<double> sums{s_.loss_sum, static_cast<double>(s_.loss_batches), static_cast<double>(correct),
                           test_loss};
  comm_.allreduce(TensorView::of(sums.data(), static_cast<int64_t>(sums.size())), ReduceOp::kSum);
  const double train_loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
  const double accuracy = sums[2] / static_cast<double>(data_.test.count);
  const double time_s = seconds_since(epoch_start_);
  nlohmann::json line = {
      {"epoch", s_.epoch + 1},
      {"train_loss", train_loss},
      {"test_accuracy", accuracy},
      {"test_loss", sums[3] / static_cast<double>(data_.test.count)},
      {"wire_bytes", s_.wire_bytes},
      {"dense_bytes", s_.dense_bytes},
      {"steps", s_.step_in_epoch},
      {"skipped_steps", s_.epoch_skipped},
      {"lr", learning_rate(sgd_, std::max<int64_t>(s_.global_step - 1, 0))},
      {"time_s", time_s},
      {"compute_s", compute_s_},
      {"eval_s", eval_s},
      {"compress_s", compress_s_},
      {"data_s", data_s_},
      {"other_s", other_seconds(time_s, eval_s)},
      {"comm_s", comm_s_},
      {"step_s_median", percentile(step_s_, 0.5)},
      {"step_s_p90", percentile(step_s_, 0.9)},
      {"overlap", c_.overlap},
      {"rank", rank_},
      {"world_size", size_},
      {"compressor", c_.compressor},
      {"momentum_correction", c_.momentum_correction},
      // What the run trains, for plots' titles (gradcomm-plot).
      {"model", "MLP " + fmt::format("{}", fmt::join(layout_.sizes, "-"))},
      {"dataset", "Fashion-MNIST"},
      {"batch_size", c_.batch_size},
      {"device", c_.device},
  };
  if (std::isnan(train_loss)) line["train_loss"] = nullptr;  // every step of the epoch skipped
  // compressor=auto: what each layer's allreduce runs now (Stats::auto_choices).
  const Stats now = comm_.stats();
  if (!now.auto_choices.empty()) {
    nlohmann::json chosen = nlohmann::json::object();
    for (const AutoChoice& a : now.auto_choices) chosen[a.key] = a.chosen;
    line["auto_choices"] = chosen;
  }
  if (!log_path_.empty()) {
    std::ofstream out(log_path_, std::ios::app);
    out << line.dump() << '\n';
    if (!out) throw InvalidArgument(fmt::format("rank {}: cannot append to --log {}", rank_, log_path_));
  }
  if (rank_ == 0) {
    if (isatty(STDOUT_FILENO)) fmt::print("\r\033[K");
    fmt::print("epoch {:>3}/{}: train_loss {:.4f}  test_accuracy {:.4f}  {}  {}, step {:.1f} ms median\n", s_.epoch + 1,
               c_.epochs, train_loss, accuracy, describe_bytes(), describe_time(time_s, eval_s),
               1e3 * percentile(step_s_, 0.5));
    if (!now.auto_choices.empty()) {
      std::string chosen;
      for (const AutoChoice& a : now.auto_choices) {
        chosen += fmt::format(" {}={}", a.key, a.chosen);
      }
      fmt::print("  auto:{}\n", chosen);
    }
    std::fflush(stdout);
  }
  s_.epoch += 1;
  if (s_.epoch < c_.epochs) begin_epoch();
}

void Trainer::save_checkpoint() {
  s_.params.resize(static_cast<size_t>(layout_.num_params));
  s_.momentum.resize(s_.params.size());
  backend_->download(s_.params.data(), s_.momentum.data());
  s_.comm_state = comm_.save_state();
  write_checkpoint(c_.checkpoint_dir, rank_, serialize_checkpoint(s_, rank_, size_));
  s_.params = {};
  s_.momentum = {};
  s_.comm_state = {};
  last_checkpoint_step_ = s_.global_step;
}

void Trainer::run() {
  setup();
  while (s_.epoch < c_.epochs) {
    step();
    s_.step_in_epoch += 1;
    s_.global_step += 1;
    report_progress();
    // The epoch's end is handled before the checkpoint, so a checkpoint never
    // sits between a finished epoch and its log line.
    if (s_.step_in_epoch == steps_per_epoch_) end_epoch();
    if (c_.checkpoint_every > 0 && s_.global_step % c_.checkpoint_every == 0) save_checkpoint();
  }
  if (!c_.checkpoint_dir.empty() && last_checkpoint_step_ != s_.global_step) save_checkpoint();
}

}  // namespace

void run_training(const Config& config, Communicator& comm, const BackendFactory& make_backend) {
  Trainer(config, comm, make_backend).run();
}

}  // namespace gradcomm::train
