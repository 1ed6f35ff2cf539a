// gradcomm-train: the reference data-parallel trainer (docs/architecture.md, "The trainer").
//   gradcomm-run -n 4 -- gradcomm-train --compressor topk:ratio=0.01 --log run.jsonl
// The loop is trainer/train.cc; the model trainer/mlp.cc; this file only parses
// the command line, joins the job and turns errors into an exit status.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <iterator>

#include "gradcomm/communicator.h"
#include "gradcomm/errors.h"
#include "trainer/config.h"
#include "trainer/train.h"

int main(int argc, char** argv) {
  gradcomm::train::Config config;
  int exit_code = 0;
  if (!gradcomm::train::parse_command_line(argc, argv, config, &exit_code)) return exit_code;
  try {
    // No fusion unless asked for: which calls fuse follows timing, and the trainer's
    // runs must be bitwise reproducible (train.cc); its per-layer calls gain little.
    ::setenv("GRADCOMM_FUSION_BYTES", "0", /*overwrite=*/0);
    // Started by hand (no launcher variables at all): a one-rank job, no store needed.
    gradcomm::InitOptions options;
    const char* launch_vars[] = {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
    if (std::none_of(std::begin(launch_vars), std::end(launch_vars), [](const char* v) { return std::getenv(v); })) {
      options.rank = 0;
      options.world_size = 1;
    }
    auto comm = gradcomm::Communicator::create(options);
    gradcomm::train::run_training(config, *comm);
  } catch (const gradcomm::Error& e) {
    fmt::print(stderr, "gradcomm-train: error ({}): {}\n", gradcomm::error_code_name(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "gradcomm-train: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
