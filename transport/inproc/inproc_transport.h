// In-process transport: N ranks as N threads of one process, for unit tests of
// the algorithms. Rendezvous semantics: a send completes when a receive has taken
// its bytes, so nothing is copied twice.
#pragma once

#include <memory>
#include <vector>

#include "transport/transport.h"

namespace gradcomm::detail {

// N transports sharing one in-memory fabric; hand transport r to rank r's thread.
std::vector<std::unique_ptr<Transport>> create_inproc_transports(int world_size);

}  // namespace gradcomm::detail
