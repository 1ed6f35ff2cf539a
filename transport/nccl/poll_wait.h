// Waiting for asynchronous GPU work with a deadline. The loop is generic over
// "is it done?" and "has something failed?" so the NCCL communicator, the
// staging path and the GPU-free unit tests (with fakes) share one implementation;
// this header needs no CUDA or NCCL header.
//
// Why poll instead of cudaEventSynchronize / cudaStreamSynchronize: a blocking
// CUDA wait cannot time out, and an NCCL kernel whose peer died spins forever, so
// a blocking wait would hang the process. Polling lets us check NCCL's
// asynchronous error state between queries and abort the communicator (which
// frees the stuck kernels) when the deadline passes.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

#include "env.h"

namespace gradcomm::detail {

// Backoff of the loop: spin (with a yield) for the first polls, then sleep in
// growing steps. Ranks often share cores; a rank that spins steals its peer's CPU.
struct PollBackoff {
  int spins = 64;
  std::chrono::microseconds first_sleep{20};
  std::chrono::microseconds max_sleep{1000};
};

// Polls `done()` until it returns true. Before every poll `check()` runs; it
// throws to end the wait (an NCCL asynchronous error, an abort from another
// rank). Once `deadline` has passed (and the last poll still said "not done"),
// `on_timeout()` runs; it must throw (if it returns, the wait simply ends, which
// is what a caller that wants to stop waiting without an error asks for).
// Returns the number of polls, for tests.
template <class Done, class Check, class OnTimeout>
int poll_with_deadline(Done&& done, Check&& check, const Deadline& deadline, OnTimeout&& on_timeout,
                       const PollBackoff& backoff = {}) {
  int polls = 0;
  auto sleep = backoff.first_sleep;
  while (true) {
    check();
    ++polls;
    if (done()) return polls;
    if (deadline.expired()) {
      on_timeout();
      return polls;
    }
    if (polls <= backoff.spins) {
      std::this_thread::yield();
    } else {
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline.at - Clock::now());
      std::this_thread::sleep_for(std::max(std::chrono::microseconds(1), std::min(sleep, left)));
      sleep = std::min(sleep * 2, backoff.max_sleep);
    }
  }
}

}  // namespace gradcomm::detail
