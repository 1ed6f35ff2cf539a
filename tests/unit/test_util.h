// Helpers for thread-based tests: N ranks as N threads over the in-process
// transport, each with its own Communicator.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm_impl.h"
#include "gradcomm/gradcomm.h"
#include "common/closed_form.h"
#include "transport/inproc/inproc_transport.h"

namespace gradcomm::testing {

// Runs fn(rank, its in-process transport) on n threads; returns each rank's
// exception (null when it returned). The building block of the helpers below and
// of the CUDA tests' (which set a device and a transport preference first).
inline std::vector<std::exception_ptr> run_transport_threads(
    int n, const std::function<void(int rank, std::unique_ptr<detail::Transport>)>& fn) {
  auto transports = detail::create_inproc_transports(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r, std::move(transports[r]));
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Runs fn(comm) on n threads, each rank owning its communicator (to destroy it
// mid-test); returns each rank's exception.
inline std::vector<std::exception_ptr> run_ranks_owning(int n,
                                                        const std::function<void(std::unique_ptr<Communicator>&)>& fn,
                                                        std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  return run_transport_threads(n, [&](int, std::unique_ptr<detail::Transport> transport) {
    auto comm = std::make_unique<Communicator>(std::make_unique<detail::CommunicatorImpl>(std::move(transport), timeout));
    fn(comm);
  });
}

// The same over a topology: rank r on node nodes[r] (topology.h); the communicators
// decide GRADCOMM_HIERARCHY as created ones do.
inline std::vector<std::exception_ptr> run_ranks_on_nodes(const std::vector<std::string>& nodes,
                                                          const std::function<void(Communicator&)>& fn,
                                                          std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const detail::NodeMap map = detail::NodeMap::from_names(nodes);
  return run_transport_threads(static_cast<int>(nodes.size()), [&](int, std::unique_ptr<detail::Transport> transport) {
    Communicator comm(std::make_unique<detail::CommunicatorImpl>(std::move(transport), timeout, nullptr, map));
    fn(comm);
  });
}

// Runs fn(comm) on n threads; returns each rank's exception (null when it returned).
inline std::vector<std::exception_ptr> run_ranks_collect(int n, const std::function<void(Communicator&)>& fn,
                                                         std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  return run_ranks_owning(n, [&](std::unique_ptr<Communicator>& comm) { fn(*comm); }, timeout);
}

// Runs fn(comm) on n threads and rethrows the first rank's failure.
inline void run_ranks(int n, const std::function<void(Communicator&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  for (auto& e : run_ranks_collect(n, fn, timeout)) {
    if (e) std::rethrow_exception(e);
  }
}

// Sets an environment variable for a scope (the communicators created inside read
// it), restoring the previous value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A gradient-like input: n draws of N(0, 1), the same for a (rank, seed) on every call.
inline std::vector<float> normal_gradient(int rank, int64_t n, uint32_t seed = 1) {
  std::mt19937 rng(seed * 7919 + static_cast<uint32_t>(rank));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> g(static_cast<size_t>(n));
  for (auto& v : g) v = dist(rng);
  return g;
}

// memcmp that accepts empty ranges (whose pointers may be null).
inline bool same_bytes(const void* a, const void* b, size_t bytes) {
  return bytes == 0 || std::memcmp(a, b, bytes) == 0;
}

// A buffer with guard bytes on both sides, to catch writes outside the tensor.
class GuardedBuffer {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kPattern = 0xA5;
  explicit GuardedBuffer(size_t bytes) : bytes_(bytes), storage_(bytes + 2 * kGuard, kPattern) {}
  void* data() { return storage_.data() + kGuard; }
  const uint8_t* bytes() const { return storage_.data() + kGuard; }
  size_t size() const { return bytes_; }
  bool guards_intact() const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (storage_[i] != kPattern || storage_[kGuard + bytes_ + i] != kPattern) return false;
    }
    return true;
  }

 private:
  size_t bytes_;
  std::vector<uint8_t> storage_;
};

}  // namespace gradcomm::testing
