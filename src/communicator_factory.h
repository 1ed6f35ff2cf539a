// Internal factory behind Communicator::create: builds a communicator whose
// rendezvous goes through a store the caller already holds (the Python bindings
// pass torch.distributed's own store, so a torch job needs no second port).
#pragma once

#include <memory>

#include "gradcomm/communicator.h"
#include "store/store.h"

namespace gradcomm::detail {

// With `store` null this is Communicator::create(options): the store comes from
// options/the environment (docs/architecture.md, "Launching and rendezvous"). With a store, rank and world size
// must still resolve (options or environment) but no store URL is needed; the
// store is used only during creation (transport address exchange, on the calling
// thread) and is owned, then destroyed, by the communicator. Its keys must not
// collide with other users of the same store: prefix them inside `store`.
// A world of one never touches any store.
std::unique_ptr<Communicator> create_communicator(const InitOptions& options, std::unique_ptr<Store> store);

}  // namespace gradcomm::detail
