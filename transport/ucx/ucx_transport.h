// UCX transport: ucp tag API over whatever UCX picks (shared memory, TCP, RDMA).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "store/store.h"
#include "transport/transport.h"

namespace gradcomm::detail {

struct UcxOptions {
  std::chrono::milliseconds timeout{300'000};  // connection set-up deadline
  std::string key_prefix = "gradcomm";          // store keys: <prefix>/ucx/addr/<rank>, ...
};

// Creates the context and worker, publishes this rank's worker address in the
// store, reads every peer's, and connects endpoints with peer error handling.
// Returns once all endpoints are created (wire-up completes on first use).
// TransportError when UCX fails, TimeoutError when a peer never publishes.
std::unique_ptr<Transport> create_ucx_transport(int rank, int size, Store& store, const UcxOptions& options);

}  // namespace gradcomm::detail
