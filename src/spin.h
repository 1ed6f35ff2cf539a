// How long a waiting thread polls before it sleeps: a caller in Work::wait, and, while
// a caller waits (Doorbell::waited_on), an Op waiting on its peers and the engine
// between calls. GRADCOMM_SPIN_US (default 50 us; 0 sleeps at once). Each poll yields
// the core, so a spinning thread gives way to any other runnable one (ranks often share
// cores). Nothing polls while no caller waits: a training step that overlaps its
// allreduces with backward needs the core for backward.
//
// Why spin at all: on the VMs measured here, waking a sleeping thread costs tens of
// microseconds (a futex or an event fd, then an idle virtual CPU woken by an
// interrupt), and a small allreduce does it several times: the caller hands the call
// to the engine, the engine sleeps until the peer's message arrives, the caller sleeps
// until the engine completes it. bench/results/latency-2026-11-26.md has the figures.
#pragma once

#include <chrono>

#include "env.h"

namespace gradcomm::detail {

inline std::chrono::microseconds spin_before_sleep() {
  static const std::chrono::microseconds spin{env_int("GRADCOMM_SPIN_US", 50, 0, 1'000'000)};
  return spin;
}

}  // namespace gradcomm::detail
