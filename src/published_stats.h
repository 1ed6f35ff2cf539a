// Stats as the thread that runs calls last published them, for any thread to read without a
// lock: a sequence lock. A publisher makes the sequence odd while it writes the counters
// (publishers exclude each other on it: one compare-and-swap), a reader copies them and
// retries when it saw the sequence odd or changed meanwhile. Publishing costs a dozen
// stores, not a mutex and a copy of Stats: the small calls of a one-host job publish after
// every call (docs/shared-memory.md, "Small calls").
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "gradcomm/communicator.h"

namespace gradcomm::detail {

class PublishedStats {
 public:
  // Every field but auto_choices (which Communicator::stats reads from the chooser).
  void publish(const Stats& s) {
    uint64_t seq = seq_.load(std::memory_order_relaxed);
    while ((seq & 1) != 0 || !seq_.compare_exchange_weak(seq, seq + 1, std::memory_order_acquire)) {
      seq = seq_.load(std::memory_order_relaxed);
    }
    std::atomic_thread_fence(std::memory_order_release);  // the counters' stores after the odd sequence
    size_t i = 0;
    each_field(s, [&](const auto& field) {
      words_[i++].store(std::bit_cast<uint64_t>(field), std::memory_order_relaxed);
    });
    seq_.store(seq + 2, std::memory_order_release);
  }

  Stats read() const {
    Stats s;
    for (;;) {
      const uint64_t before = seq_.load(std::memory_order_acquire);
      size_t i = 0;
      each_field(s, [&](auto& field) {
        field = std::bit_cast<std::remove_reference_t<decltype(field)>>(words_[i++].load(std::memory_order_relaxed));
      });
      std::atomic_thread_fence(std::memory_order_acquire);
      if ((before & 1) == 0 && seq_.load(std::memory_order_relaxed) == before) return s;
    }
  }

 private:
  // The counters, in one order for both directions (S: Stats or const Stats).
  template <class S, class F>
  static void each_field(S& s, F&& f) {
    f(s.bytes_sent);
    f(s.bytes_received);
    f(s.messages_sent);
    f(s.ops);
    f(s.fused_calls);
    f(s.total_s);
    f(s.reduce_s);
    f(s.encode_s);
    f(s.decode_s);
    f(s.engine_cpu_s);
    f(s.node_shm_ops);
    f(s.inline_ops);
    f(s.node_shm_bytes);
  }
  static constexpr size_t kWords = 13;
  // A field added to Stats must be added to each_field (and kWords).
  static_assert(sizeof(Stats) == kWords * 8 + sizeof(std::vector<AutoChoice>));

  std::atomic<uint64_t> seq_{0};
  std::array<std::atomic<uint64_t>, kWords> words_{};
};

}  // namespace gradcomm::detail
