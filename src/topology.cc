#include "topology.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "env.h"
#include "gradcomm/errors.h"
#include "store/store.h"

namespace gradcomm::detail {

namespace {

constexpr size_t kMaxNodeName = 64;

std::string host_identity() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '?';
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  return fmt::format("{}/{}", host, boot.empty() ? "?" : boot.substr(0, 36));
}

// A name as it travels and as messages show it: printable, no spaces, bounded.
std::optional<std::string> checked_name(const std::string& name) {
  if (name.empty() || name.size() > 2 * kMaxNodeName + 40) return std::nullopt;
  for (char c : name) {
    if (c <= 0x20 || c > 0x7E) return std::nullopt;
  }
  return name;
}

}  // namespace

NodeMap NodeMap::single(int size) { return from_names(std::vector<std::string>(static_cast<size_t>(size), "local")); }

NodeMap NodeMap::from_names(const std::vector<std::string>& names) {
  if (names.empty()) throw InvalidArgument("topology: no ranks");
  NodeMap map;
  std::map<std::string, int> index;
  for (size_t r = 0; r < names.size(); ++r) {
    auto [it, fresh] = index.emplace(names[r], static_cast<int>(map.members_.size()));
    if (fresh) {
      map.members_.emplace_back();
      map.names_.push_back(names[r]);
    }
    map.local_rank_.push_back(static_cast<int>(map.members_[static_cast<size_t>(it->second)].size()));
    map.members_[static_cast<size_t>(it->second)].push_back(static_cast<int>(r));
    map.node_of_.push_back(it->second);
  }
  return map;
}

int NodeMap::largest_node() const {
  size_t most = 0;
  for (const auto& m : members_) most = std::max(most, m.size());
  return static_cast<int>(most);
}

Topology NodeMap::view(int rank) const {
  Topology t;
  t.nodes = nodes();
  t.node = node_of(rank);
  t.local_rank = local_rank(rank);
  t.local_size = static_cast<int>(members(t.node).size());
  t.node_name = name(t.node);
  t.node_of_rank = node_of_;
  return t;
}

std::string NodeMap::describe() const {
  std::string out = fmt::format("{} node{}:", nodes(), nodes() == 1 ? "" : "s");
  for (int n = 0; n < std::min(nodes(), kDescribedNodes); ++n) {
    std::string ranks;
    const std::vector<int>& m = members(n);
    for (size_t i = 0; i < m.size() && i < static_cast<size_t>(kDescribedNodes); ++i) {
      ranks += fmt::format("{}{}", i == 0 ? "" : ", ", m[i]);
    }
    if (m.size() > static_cast<size_t>(kDescribedNodes)) ranks += fmt::format(", ... ({} in all)", m.size());
    out += fmt::format("{} {} (rank{} {})", n == 0 ? "" : ",", name(n), m.size() == 1 ? "" : "s", ranks);
  }
  if (nodes() > kDescribedNodes) out += fmt::format(", ... ({} more)", nodes() - kDescribedNodes);
  return out;
}

uint32_t NodeMap::digest() const {
  uint32_t h = 2166136261u;  // FNV-1a over every rank's node index
  for (int node : node_of_) {
    for (int i = 0; i < 4; ++i) {
      h ^= static_cast<uint8_t>(static_cast<uint32_t>(node) >> (8 * i));
      h *= 16777619u;
    }
  }
  return h;
}

bool node_named_by_user() { return env_string("GRADCOMM_NODE").has_value(); }

std::string this_node_name() {
  const std::optional<std::string> named = env_string("GRADCOMM_NODE");
  if (!named) return host_identity();
  bool ok = named->size() <= kMaxNodeName;
  for (char c : *named) ok &= c > 0x20 && c <= 0x7E;
  if (!ok) {
    throw InvalidArgument(fmt::format("GRADCOMM_NODE='{}': a node name is 1 to {} printable characters without "
                                      "spaces",
                                      named->substr(0, kMaxNodeName), kMaxNodeName));
  }
  return *named;
}

NodeMap exchange_node_names(Store& store, const std::string& prefix, int rank, int size, const std::string& name,
                            std::chrono::milliseconds timeout) {
  const auto key = [&](int r) { return fmt::format("{}/node/{}", prefix, r); };
  store.set(key(rank), std::vector<uint8_t>(name.begin(), name.end()));
  std::vector<std::string> names(static_cast<size_t>(size));
  const Deadline deadline = Deadline::after(timeout);
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      names[static_cast<size_t>(r)] = name;
      continue;
    }
    std::vector<uint8_t> bytes;
    try {
      bytes = store.get(key(r), deadline.remaining());
    } catch (const TimeoutError& e) {
      throw TimeoutError(fmt::format("topology: rank {} timed out after {} ms waiting for rank {} to publish its "
                                     "node (key {} in store {}): {}",
                                     rank, timeout.count(), r, key(r), store.address(), e.what()));
    }
    const auto theirs = checked_name(std::string(bytes.begin(), bytes.end()));
    if (!theirs) {
      throw CorruptPayload(fmt::format("topology: rank {} published a malformed node name ({} bytes, key {} in store "
                                       "{})",
                                       r, bytes.size(), key(r), store.address()));
    }
    names[static_cast<size_t>(r)] = *theirs;
  }
  return NodeMap::from_names(names);
}

void check_launcher_local_ranks(const NodeMap& map, int rank) {
  if (node_named_by_user()) return;
  // Per launcher: its local rank and size, and its global rank and size, which say whether
  // this communicator is the launcher's world (a subgroup, a torch.distributed new_group
  // say, holds some of a host's processes: their local numbers are not its own).
  static constexpr const char* kVars[][4] = {
      {"LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE"},  // torchrun, gradcomm-run
      {"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_RANK",
       "OMPI_COMM_WORLD_SIZE"},                                  // mpirun (OpenMPI)
      {"SLURM_LOCALID", nullptr, "SLURM_PROCID", "SLURM_NTASKS"},  // srun
  };
  const Topology t = map.view(rank);
  for (const auto& [rank_var, size_var, world_rank_var, world_size_var] : kVars) {
    const std::optional<int64_t> local = env_int_if_set(rank_var, 0, 1 << 24);
    const std::optional<int64_t> local_size = size_var != nullptr ? env_int_if_set(size_var, 1, 1 << 24) : std::nullopt;
    if (!local && !local_size) continue;
    const std::optional<int64_t> world_rank = env_int_if_set(world_rank_var, 0, 1 << 24);
    const std::optional<int64_t> world_size = env_int_if_set(world_size_var, 1, 1 << 24);
    if (world_rank != rank || world_size != map.size()) return;  // not the launcher's world: nothing to compare
    if ((local && *local != t.local_rank) || (local_size && *local_size != t.local_size)) {
      throw InvalidArgument(fmt::format(
          "topology: rank {}: the launcher says {}={}{} but the ranks that share this host ({}) make it local rank "
          "{} of {} ({}); start every rank of a host with the same launcher, or name the nodes with GRADCOMM_NODE",
          rank, rank_var, local ? std::to_string(*local) : "(unset)",
          size_var != nullptr ? fmt::format(", {}={}", size_var, local_size ? std::to_string(*local_size) : "(unset)")
                              : std::string(),
          t.node_name, t.local_rank, t.local_size, map.describe()));
    }
    return;  // the first launcher that says anything is the one that started us
  }
}

}  // namespace gradcomm::detail
