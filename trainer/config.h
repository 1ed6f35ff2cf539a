// gradcomm-train's settings: the command line (CLI11) into one struct.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradcomm::train {

struct Config {
  // data
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t limit_train = 0, limit_test = 0;  // > 0: first N examples only (tests)
  // model and optimizer
  std::vector<int64_t> hidden = {512, 256};
  int64_t epochs = 10;
  int64_t batch_size = 32;  // per rank: the effective batch is world_size times this
  double lr = 0.1, momentum = 0.9, weight_decay = 0.0;
  bool nesterov = false;
  double warmup_epochs = 0.5;
  int64_t warmup_steps = -1;  // >= 0 overrides warmup_epochs
  std::string lr_schedule = "cosine";  // cosine | constant
  uint64_t seed = 1;
  // communication
  std::string compressor = "none";
  bool momentum_correction = false;
  // Each layer's allreduce starts as soon as backward has produced its gradient
  // (last layer first) and the step waits before the update; false: backward
  // first, then the allreduces one by one (the schedule before overlap existed).
  // Either way the same calls with the same keys: the same bits, unless a step is
  // skipped for a non-finite gradient (train.cc).
  bool overlap = true;
  // execution
  std::string device = "cpu";  // cpu | cuda[:N]
  int threads = 1;             // OpenBLAS threads per rank
  std::string nan = "abort";   // abort | skip
  // output and checkpoints
  double progress_s = 10;  // rank 0: a progress line within the epoch this often (0: never)
  std::string log_path;  // JSON lines, rank 0 (or every rank when it contains "{rank}")
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  bool resume = false;
  // test hooks
  int64_t debug_kill_at_step = -1;  // rank debug_rank raises SIGKILL before this global step
  int64_t debug_nan_at_step = -1;   // rank debug_rank's gradient becomes NaN at this global step
  int debug_rank = 0;

  // The settings a checkpoint must agree with to be resumed: everything that
  // changes the arithmetic (not output paths, device, threads or test hooks).
  std::string canonical() const;
};

// Parses argv. Returns false when the program should exit with *exit_code
// (--help, or a usage error already printed).
bool parse_command_line(int argc, char** argv, Config& config, int* exit_code);

}  // namespace gradcomm::train
