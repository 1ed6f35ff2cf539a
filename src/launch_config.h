// Launch settings (rank, size, store, transport, timeout, job token): InitOptions
// first, then the launchers' variables, in the order docs/architecture.md
// ("Launching and rendezvous") gives.
#pragma once

#include <chrono>
#include <string>

#include "gradcomm/communicator.h"

namespace gradcomm::detail {

struct LaunchConfig {
  int rank = -1;
  int world_size = -1;
  std::string store;       // URL
  std::string transport;   // "ucx" | "nccl" | "auto"
  std::chrono::milliseconds timeout{300'000};
  std::string job_token;
};

// InitOptions first, then RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK/_SIZE, PMI_RANK/PMI_SIZE,
// SLURM_PROCID/SLURM_NTASKS; store from options, GRADCOMM_STORE, tcp://MASTER_ADDR:MASTER_PORT;
// GRADCOMM_TIMEOUT_S overrides a default timeout; GRADCOMM_TRANSPORT a default "auto".
// InvalidArgument saying what is missing or inconsistent.
LaunchConfig resolve_launch_config(const InitOptions& options);

}  // namespace gradcomm::detail
