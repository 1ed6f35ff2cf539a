// The shared segment of this rank's node (issue 46): made once at creation, used by the
// collectives whose group is exactly the node's ranks (Op::node_shm) instead of the
// transport: a one-host job's calls, and the level inside the nodes of two-level ones.
//
// Setup (connect_node_shm, over the rendezvous store, every rank of a node with two or
// more ranks): the node's first rank creates the segment (shm_segment.h; the name carries
// the job token's hash, the store generation, its pid and a counter, and is created
// O_EXCL, so no stale segment or other job's is ever mapped) and publishes its name; the
// others map it and say so; every rank reads every member's word and uses the segment
// only if all of them mapped it, so the node agrees. The first rank then unlinks the name:
// from then on the segment lives only in the mappings and goes with the last process,
// however it ends. GRADCOMM_SHM=off on any rank of a node turns it off for the node.
//
// Liveness: while a rank waits on the segment it checks, every kProcessPoll, that its
// peers' processes (published with their words) still run; a zombie or a vanished pid is
// PeerFailure at once. A stopped peer is left to the call's deadline, whose TimeoutError
// names it (Op's liveness check).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/node_collectives.h"
#include "collectives/shm_segment.h"
#include "process_identity.h"
#include "shared_blocks.h"
#include "store/store.h"
#include "topology.h"

namespace gradcomm::detail {

// GRADCOMM_SHM: "auto" (default: use the segment where a node holds two or more ranks) or
// "off"; InvalidArgument for anything else.
bool shm_enabled_from_env();

class NodeShm {
 public:
  static constexpr auto kProcessPoll = std::chrono::milliseconds(200);

  // `name_prefix`: "/gradcomm-<job token hash>-g<generation>", which the node's segment
  // and the blocks of Communicator::alloc_shared are named after.
  NodeShm(ShmSegment segment, int local_rank, std::vector<int> members, size_t slot_bytes,
          std::vector<std::optional<ProcessIdentity>> processes, std::string name_prefix);

  // The node's ranks (communicator ranks, in rank order).
  const std::vector<int>& members() const { return members_; }
  NodeCollectives& collectives() { return collectives_; }
  size_t slot_bytes() const { return slot_bytes_; }
  const std::string& name_prefix() const { return name_prefix_; }
  // What the node's ranks allocated together (shared_blocks.h); kept alive by the
  // SharedBuffers too, which may outlive the communicator.
  const std::shared_ptr<SharedBlocks>& blocks() const { return blocks_; }

  // PeerFailure naming the rank when a member's process has exited (or is a zombie);
  // reads /proc at most every kProcessPoll.
  void check_peers();
  // "rank 1 (pid 123) is stopped" for the members observed in a state other than running.
  std::string describe_peers() const;

 private:
  ShmSegment segment_;
  std::vector<int> members_;
  size_t slot_bytes_;
  NodeCollectives collectives_;
  std::vector<std::optional<ProcessIdentity>> processes_;  // by local rank; nullopt: not observable
  std::chrono::steady_clock::time_point next_poll_{};
  std::string name_prefix_;
  std::shared_ptr<SharedBlocks> blocks_ = std::make_shared<SharedBlocks>();
};

// Every rank calls it at creation (after the node names are known), in the same store
// generation. Returns the node's segment, or null where this rank's node has one rank,
// GRADCOMM_SHM=off somewhere on it, or a member could not map it (logged, never an error:
// the transport then carries the node's traffic). `tag` keeps two communicators of one
// job apart. Store errors (a member that never answers) are thrown.
std::unique_ptr<NodeShm> connect_node_shm(Store& store, const NodeMap& nodes, int rank, const std::string& job_token,
                                          uint64_t generation, std::chrono::milliseconds timeout);

}  // namespace gradcomm::detail
