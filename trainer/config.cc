// Command line of gradcomm-train (docs/architecture.md, "The trainer").
#include "trainer/config.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "cli_list.h"  // base/: lists on command lines
#include "gradcomm/errors.h"
#include "gradcomm/version.h"
#include "trainer/checkpoint.h"

namespace gradcomm::train {
namespace {

// Prints a usage error; parse_command_line returns false with exit code 2.
bool usage_error(int* exit_code, const std::string& message) {
  fmt::print(stderr, "gradcomm-train: {}\n", message);
  *exit_code = 2;
  return false;
}

}  // namespace

std::string Config::canonical() const {
  std::string h;
  for (int64_t w : hidden) h += (h.empty() ? "" : ",") + std::to_string(w);
  return fmt::format(
      "hidden={} epochs={} batch_size={} lr={} momentum={} weight_decay={} nesterov={} warmup_epochs={} "
      "warmup_steps={} lr_schedule={} seed={} compressor={} momentum_correction={} nan={} limit_train={} "
      "limit_test={}",
      h, epochs, batch_size, lr, momentum, weight_decay, nesterov, warmup_epochs, warmup_steps, lr_schedule, seed,
      compressor, momentum_correction, nan, limit_train, limit_test);
}

bool parse_command_line(int argc, char** argv, Config& c, int* exit_code) {
  CLI::App app{
      "gradcomm-train: data-parallel MLP on Fashion-MNIST with compressed gradient allreduce.\n"
      "Start ranks with gradcomm-run -n N (or mpirun/srun/torchrun); each rank trains on a disjoint shard."};
  app.option_defaults()->always_capture_default();
  app.add_option("--data", c.data_dir, "directory with the Fashion-MNIST *-ubyte.gz files");
  app.add_option("--limit-train", c.limit_train, "use only the first N training examples (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--limit-test", c.limit_test, "use only the first N test examples (0: all)")
      ->check(CLI::NonNegativeNumber);
  std::string hidden = fmt::format("{}", fmt::join(c.hidden, ","));
  app.add_option("--hidden", hidden, "hidden layer widths, e.g. 512,256")->type_name("INT,...");
  app.add_option("--epochs", c.epochs, "epochs")->check(CLI::Range(int64_t{1}, int64_t{100000}));
  app.add_option("--batch-size", c.batch_size, "examples per step per rank")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  app.add_option("--lr", c.lr, "peak learning rate")->check(CLI::PositiveNumber);
  app.add_option("--momentum", c.momentum, "momentum factor")->check(CLI::Range(0.0, 0.9999));
  app.add_flag("--nesterov", c.nesterov, "Nesterov momentum");
  app.add_option("--weight-decay", c.weight_decay, "L2 weight decay")->check(CLI::NonNegativeNumber);
  app.add_option("--warmup-epochs", c.warmup_epochs, "linear learning-rate warm-up, in epochs")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup-steps", c.warmup_steps, "warm-up in steps (overrides --warmup-epochs)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr-schedule", c.lr_schedule, "after warm-up: cosine decay to 0, or constant")
      ->check(CLI::IsMember({"cosine", "constant"}));
  app.add_option("--seed", c.seed, "seed of initialization and shuffling");
  app.add_option("--compressor", c.compressor, "compressor spec, e.g. topk:ratio=0.01,min_numel=1024");
  app.add_flag("--momentum-correction", c.momentum_correction,
               "DGC momentum correction and momentum-factor masking (sparsifiers with error feedback)");
  app.add_flag("--overlap,!--no-overlap", c.overlap,
               "start each layer's allreduce during backward (default), or only after it (--no-overlap)");
  app.add_option("--device", c.device, "cpu, cuda or cuda:N");
  app.add_option("--threads", c.threads, "OpenBLAS threads per rank")->check(CLI::Range(1, 256));
  app.add_option("--nan", c.nan, "non-finite loss or gradient: skip the step on every rank, or abort")
      ->check(CLI::IsMember({"abort", "skip"}));
  app.add_option("--log", c.log_path, "JSON lines, one per epoch (rank 0; '{rank}' in the path: every rank)");
  app.add_option("--checkpoint-dir", c.checkpoint_dir, "write DIR/rank<R>.ckpt");
  app.add_option("--checkpoint-every", c.checkpoint_every, "steps between checkpoints (and one at the end)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--resume", c.resume, "continue from the checkpoints in --checkpoint-dir");
  app.add_option("--progress", c.progress_s,
                 "rank 0 reports the epoch's progress every S seconds (a line on a pipe; 0: never)")
      ->check(CLI::NonNegativeNumber);
  app.set_version_flag("--version", std::string("gradcomm-train ") + GRADCOMM_VERSION_STRING);
  // Test hooks: accepted, but kept out of --help (an empty group hides an option).
  const char* hooks = "";
  app.add_option("--debug-kill-at-step", c.debug_kill_at_step, "raise SIGKILL before this global step")
      ->group(hooks);
  app.add_option("--debug-nan-at-step", c.debug_nan_at_step, "make the gradient NaN at this global step")
      ->group(hooks);
  app.add_option("--debug-rank", c.debug_rank, "the rank the debug hooks act on")->group(hooks);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    *exit_code = app.exit(e);
    return false;
  }
  if (c.resume && c.checkpoint_dir.empty()) return usage_error(exit_code, "--resume needs --checkpoint-dir");
  if (c.checkpoint_every > 0 && c.checkpoint_dir.empty()) {
    return usage_error(exit_code, "--checkpoint-every needs --checkpoint-dir");
  }
  try {
    // Not CLI11's delimiter, which drops empty elements ("512,,256" became 512,256).
    c.hidden = detail::parse_int_list("--hidden", hidden);
    // Every rank checks (with a probe of its own): a directory it cannot write is
    // refused now, not when the first checkpoint is due, an epoch or more in.
    if (!c.checkpoint_dir.empty()) check_checkpoint_dir(c.checkpoint_dir);
  } catch (const Error& e) {
    return usage_error(exit_code, e.what());
  }
  return true;
}

}  // namespace gradcomm::train
