#include "launch_config.h"

#include <fmt/format.h>

#include <optional>

#include "env.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

// A launcher's rank or size variable, checked; nullopt when unset.
std::optional<int> rank_var(const char* name) {
  auto v = env_int_if_set(name, 0, 1 << 24);
  if (!v) return std::nullopt;
  return static_cast<int>(*v);
}

}  // namespace

LaunchConfig resolve_launch_config(const InitOptions& options) {
  LaunchConfig config;

  // Rank and world size: InitOptions, then the launchers' variables in the order of docs/architecture.md.
  static constexpr const char* kRankSizeVars[][2] = {
      {"RANK", "WORLD_SIZE"},                                   // torchrun, gradcomm-run
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},         // mpirun (OpenMPI)
      {"PMI_RANK", "PMI_SIZE"},                                 // MPICH, Intel MPI
      {"SLURM_PROCID", "SLURM_NTASKS"},                         // srun
  };
  config.rank = options.rank;
  config.world_size = options.world_size;
  std::string source = "InitOptions";
  for (const auto& [rank_name, size_name] : kRankSizeVars) {
    if (config.rank >= 0 && config.world_size > 0) break;
    auto r = rank_var(rank_name);
    auto s = rank_var(size_name);
    if (r && s) {
      if (config.rank < 0) config.rank = *r;
      if (config.world_size <= 0) config.world_size = *s;
      source = fmt::format("{}/{}", rank_name, size_name);
    }
  }
  if (config.rank < 0 || config.world_size <= 0) {
    throw InvalidArgument(
        "gradcomm init: rank and world size unknown: set InitOptions::rank/world_size, or launch with "
        "gradcomm-run, torchrun (RANK/WORLD_SIZE), mpirun (OMPI_COMM_WORLD_RANK/SIZE), PMI_RANK/PMI_SIZE "
        "or srun (SLURM_PROCID/SLURM_NTASKS)");
  }
  if (config.rank >= config.world_size) {
    throw InvalidArgument(fmt::format("gradcomm init: rank {} is out of range for world size {} (from {})",
                                      config.rank, config.world_size, source));
  }

  // Store: InitOptions, GRADCOMM_STORE, then tcp://MASTER_ADDR:MASTER_PORT.
  config.store = options.store;
  if (config.store.empty()) config.store = env_string("GRADCOMM_STORE").value_or("");
  if (config.store.empty()) {
    auto addr = env_string("MASTER_ADDR");
    auto port = env_string("MASTER_PORT");
    if (addr && port) config.store = fmt::format("tcp://{}:{}", *addr, *port);
  }
  if (config.store.empty() && config.world_size > 1) {
    throw InvalidArgument(fmt::format(
        "gradcomm init (rank {}): no store: pass one (Python: gradcomm.init(store=\"tcp://host:port\"); C++: "
        "InitOptions::store), or set GRADCOMM_STORE=tcp://host:port or file:///dir, or MASTER_ADDR and MASTER_PORT",
        config.rank));
  }

  config.transport = options.transport.empty() ? "auto" : options.transport;
  if (config.transport == "auto") config.transport = env_string("GRADCOMM_TRANSPORT").value_or("auto");
  if (config.transport != "auto" && config.transport != "ucx" && config.transport != "nccl") {
    throw InvalidArgument(fmt::format("gradcomm init: transport '{}' unknown; accepted: auto, ucx, nccl",
                                      config.transport));
  }

  // GRADCOMM_TIMEOUT_S replaces the default timeout, never one the caller set.
  config.timeout = options.timeout;
  if (options.timeout == InitOptions{}.timeout) {
    config.timeout = std::chrono::seconds(env_int("GRADCOMM_TIMEOUT_S", options.timeout.count() / 1000, 1,
                                                  int64_t{30} * 24 * 3600));
  }
  if (config.timeout.count() <= 0) {
    throw InvalidArgument(fmt::format("gradcomm init: timeout must be positive, got {} ms", config.timeout.count()));
  }

  config.job_token = options.job_token.empty() ? env_string("GRADCOMM_JOB_TOKEN").value_or("") : options.job_token;
  return config;
}

}  // namespace gradcomm::detail
