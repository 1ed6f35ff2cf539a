// UCX transport: ucp tag API over whatever UCX picks (shared memory, TCP, RDMA).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "store/store.h"
#include "transport/transport.h"

namespace gradcomm::detail {

struct UcxOptions {
  std::chrono::milliseconds timeout{300'000};  // connection set-up deadline
  std::string key_prefix = "gradcomm";          // store keys: <prefix>/ucx/addr/<rank>, ...
  // Per rank: whether it shares this rank's node (src/topology.h). Peers of this node
  // may talk over shared memory; peers of other nodes never do, even on one host (an
  // emulated cluster), so that their bytes cross the network between the nodes. Empty:
  // every rank shares the node.
  std::vector<bool> same_node;
};

// Creates the context and worker, publishes this rank's worker address in the
// store, reads every peer's, and connects endpoints with peer error handling.
// Returns once all endpoints are created (wire-up completes on first use).
// TransportError when UCX fails, TimeoutError when a peer never publishes.
std::unique_ptr<Transport> create_ucx_transport(int rank, int size, Store& store, const UcxOptions& options);

}  // namespace gradcomm::detail
