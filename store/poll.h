// Waiting for a key in a store that cannot wait safely with a short deadline.
//
// torch's TCPStore (1.13) implements wait(keys, timeout) as a WAIT request whose
// reply is read under a socket timeout. When that timeout fires, the server still
// owes the client a STOP_WAITING byte, which it sends once the key appears; the
// client then reads it as the reply to its next request, and the connection is out
// of step from there on (a later wait "succeeds" for a key nobody set, and the get
// after it blocks for the store's whole timeout). It also leaves the socket's
// timeout at the short value. So the adapter over torch's C++ stores
// (python_bindings/torch_backend/c10d_store.cc) never calls wait(): it polls
// check(keys), which answers at once, and get()s only a key that is there.
// (torch 1.13's Python Store has no check(); python_store.cc polls compare_set.)
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

#include "env.h"

namespace gradcomm::detail {

// Calls ready() until it returns true or `timeout` has passed (ready() is called at
// least once, and once more at the deadline). Sleeps between calls, 1 ms doubling to
// 50 ms. Returns whether it became ready. The file store polls with it too.
template <class Ready>
bool poll_until_ready(Ready&& ready, std::chrono::milliseconds timeout) {
  const auto deadline = Deadline::after(timeout);
  auto pause = std::chrono::milliseconds(1);
  while (!ready()) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::min(pause, deadline.remaining()));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  return true;
}

}  // namespace gradcomm::detail
