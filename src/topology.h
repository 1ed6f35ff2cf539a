// Which ranks share a node: learnt once at create, the same on every rank
// (docs/two-levels.md). Every rank publishes its node's name in the store and reads
// everyone's; the nodes are then numbered by their lowest rank, and each node's ranks
// keep rank order. The transports follow it (shared memory inside a node, never across:
// transport/ucx/ucx_transport.h, UcxOptions::same_node), and the hierarchical collectives
// (hierarchy.h) are built on it.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "gradcomm/communicator.h"

namespace gradcomm::detail {

class Store;

class NodeMap {
 public:
  // One node holding `size` ranks (a one-rank job, the in-process tests' default).
  static NodeMap single(int size);
  // From every rank's node name, in rank order. InvalidArgument for an empty list.
  static NodeMap from_names(const std::vector<std::string>& names);

  int size() const { return static_cast<int>(node_of_.size()); }
  int nodes() const { return static_cast<int>(members_.size()); }
  int node_of(int rank) const { return node_of_[static_cast<size_t>(rank)]; }
  const std::vector<int>& members(int node) const { return members_[static_cast<size_t>(node)]; }
  const std::string& name(int node) const { return names_[static_cast<size_t>(node)]; }
  int local_rank(int rank) const { return local_rank_[static_cast<size_t>(rank)]; }
  bool same_node(int a, int b) const { return node_of(a) == node_of(b); }
  int largest_node() const;
  // More than one node, and some node holds more than one rank: where two levels differ
  // from one (GRADCOMM_HIERARCHY=auto).
  bool two_levels() const { return nodes() > 1 && largest_node() > 1; }
  // The public view of it from `rank`.
  Topology view(int rank) const;
  // "2 nodes: node0 (ranks 0, 1), node1 (ranks 2, 3)" for logs and messages (at most
  // kDescribedNodes nodes and as many ranks each are listed).
  std::string describe() const;
  // A fingerprint of which rank is on which node (the connect barrier's header carries it).
  uint32_t digest() const;
  static constexpr int kDescribedNodes = 8;

 private:
  std::vector<int> node_of_;
  std::vector<int> local_rank_;
  std::vector<std::vector<int>> members_;
  std::vector<std::string> names_;
};

// This rank's node name: GRADCOMM_NODE (at most 64 printable characters without spaces;
// InvalidArgument otherwise), else the host's "hostname/boot id".
std::string this_node_name();
// Whether the name came from GRADCOMM_NODE (then launchers' local ranks describe hosts,
// not these nodes, and are not checked).
bool node_named_by_user();

// Publishes `name` for `rank` under `prefix` and reads every rank's (waiting up to
// `timeout` for each): the job's NodeMap.
NodeMap exchange_node_names(Store& store, const std::string& prefix, int rank, int size, const std::string& name,
                            std::chrono::milliseconds timeout);

// Where the launcher says how many ranks share this host and which this one is
// (LOCAL_RANK/LOCAL_WORLD_SIZE: torchrun, gradcomm-run; OMPI_COMM_WORLD_LOCAL_RANK/
// _LOCAL_SIZE: mpirun; SLURM_LOCALID: srun), they must match the map: InvalidArgument
// naming both otherwise. Skipped when GRADCOMM_NODE names the nodes, and for a communicator
// that is not the launcher's world (its rank and size are not the launcher's RANK and
// WORLD_SIZE, or their OpenMPI and Slurm forms): a subgroup's local numbers differ.
void check_launcher_local_ranks(const NodeMap& map, int rank);

}  // namespace gradcomm::detail
