// Environment configuration. Launch settings (rank, size, store, token, timeout,
// transport) are resolved here, in the order docs/architecture.md ("Launching and rendezvous") gives. Tunables
// are declared next to their use with env_int/env_string, one variable each.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "gradcomm/communicator.h"

namespace gradcomm::detail {

// The variable's value, or nullopt when unset or empty.
std::optional<std::string> env_string(const char* name);
// Integer knob in [min, max]; InvalidArgument naming the variable on garbage or out of range.
int64_t env_int(const char* name, int64_t fallback, int64_t min, int64_t max);
// Byte-size knob: "4M", "256K", "1G" or plain bytes.
int64_t env_bytes(const char* name, int64_t fallback, int64_t min, int64_t max);
// Parses "8", "1K", "64M", "2G" (powers of 1024). nullopt on garbage.
std::optional<int64_t> parse_bytes(const std::string& text);

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

// Monotonic deadline.
using Clock = std::chrono::steady_clock;
struct Deadline {
  Clock::time_point at;
  static Deadline after(std::chrono::milliseconds d) { return {Clock::now() + d}; }
  bool expired() const { return Clock::now() >= at; }
  std::chrono::milliseconds remaining() const {
    auto r = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now());
    return r.count() > 0 ? r : std::chrono::milliseconds(0);
  }
};

}  // namespace gradcomm::detail
