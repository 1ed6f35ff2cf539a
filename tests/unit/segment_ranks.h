// Ranks as threads of this process on one node segment, as a one-host job's processes
// are: each rank's communicator (over the in-process transport) has a NodeShm over a
// mapping of its own of one real POSIX segment, as connect_node_shm gives each process.
#pragma once

#include <unistd.h>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/node_collectives.h"
#include "collectives/shm_segment.h"
#include "comm_impl.h"
#include "gradcomm/communicator.h"
#include "node_shm.h"
#include "transport/inproc/inproc_transport.h"

namespace gradcomm::detail {

inline constexpr size_t kTestSlotBytes = size_t{64} << 10;

// Runs fn(rank, comm) on n threads; returns each rank's failure (null where it returned).
inline std::vector<std::exception_ptr> run_on_segment_collect(int n,
                                                              const std::function<void(int, Communicator&)>& fn) {
  static std::atomic<int> counter{0};
  const std::string name =
      "/gradcomm-test-segment-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  const size_t bytes = node_segment_bytes(n, kTestSlotBytes);
  ShmSegment creator = ShmSegment::create(name, bytes);
  init_node_segment(creator.data(), n, kTestSlotBytes);
  std::vector<ShmSegment> mapped;
  for (int r = 0; r < n; ++r) mapped.push_back(ShmSegment::open(name, bytes));
  creator.unlink();
  std::vector<int> members(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) members[static_cast<size_t>(r)] = r;
  auto transports = create_inproc_transports(n);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto shm = std::make_unique<NodeShm>(std::move(mapped[static_cast<size_t>(r)]), r, members, kTestSlotBytes,
                                             std::vector<std::optional<ProcessIdentity>>(static_cast<size_t>(n)),
                                             name);
        Communicator comm(std::make_unique<CommunicatorImpl>(std::move(transports[static_cast<size_t>(r)]),
                                                             std::chrono::seconds(60), nullptr, NodeMap::single(n),
                                                             std::move(shm)));
        fn(r, comm);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// The same; rethrows the first rank's failure.
inline void run_on_segment(int n, const std::function<void(int, Communicator&)>& fn) {
  for (auto& e : run_on_segment_collect(n, fn)) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace gradcomm::detail
