#include "collectives/node_allreduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "gradcomm/errors.h"
#include "reduce.h"

namespace gradcomm::detail {
namespace {

constexpr uint64_t kMagic = 0x31524c4e4d434447ull;  // "GDCMNLR1"
constexpr size_t kLine = 64;                        // flags on their own cache lines
constexpr int kFlags = 3;                           // ready, done, consumed
enum Flag { kReady = 0, kDone = 1, kConsumed = 2 };

struct Header {
  uint64_t magic;
  uint64_t ranks;
  uint64_t slot_bytes;
};

size_t flags_offset() { return kLine; }
size_t slots_offset(int ranks) { return flags_offset() + static_cast<size_t>(ranks) * kFlags * kLine; }

}  // namespace

size_t node_segment_bytes(int ranks, size_t slot_bytes) {
  return slots_offset(ranks) + static_cast<size_t>(ranks) * 2 * slot_bytes;
}

void init_node_segment(uint8_t* segment, int ranks, size_t slot_bytes) {
  const Header h{kMagic, static_cast<uint64_t>(ranks), slot_bytes};
  std::memcpy(segment, &h, sizeof h);
}

NodeAllreduce::NodeAllreduce(uint8_t* segment, int rank, int ranks, size_t slot_bytes)
    : segment_(segment), rank_(rank), ranks_(ranks), slot_bytes_(slot_bytes) {
  Header h{};
  std::memcpy(&h, segment, sizeof h);
  if (h.magic != kMagic || h.ranks != static_cast<uint64_t>(ranks) || h.slot_bytes != slot_bytes) {
    throw CorruptPayload(fmt::format("node segment: header says {} ranks, slots of {} bytes (magic {:#x}); this "
                                     "rank expected {} ranks, {} bytes: not this communicator's segment",
                                     h.ranks, h.slot_bytes, h.magic, ranks, slot_bytes));
  }
  if (rank < 0 || rank >= ranks || slot_bytes < 64 || slot_bytes % 64 != 0) {
    throw InvalidArgument(fmt::format("node segment: rank {} of {}, slots of {} bytes", rank, ranks, slot_bytes));
  }
}

uint64_t* NodeAllreduce::flag(int rank, int which) const {
  return reinterpret_cast<uint64_t*>(segment_ + flags_offset() +
                                     (static_cast<size_t>(rank) * kFlags + static_cast<size_t>(which)) * kLine);
}

uint8_t* NodeAllreduce::slot(int rank, uint64_t seq) const {
  return segment_ + slots_offset(ranks_) + (static_cast<size_t>(rank) * 2 + seq % 2) * slot_bytes_;
}

void NodeAllreduce::publish(int which, uint64_t value) const {
  std::atomic_ref<uint64_t>(*flag(rank_, which)).store(value, std::memory_order_release);
}

void NodeAllreduce::wait_all(int which, uint64_t at_least, const std::function<void()>& poll) const {
  for (int q = 0; q < ranks_; ++q) {
    std::atomic_ref<uint64_t> f(*flag(q, which));
    for (uint32_t spins = 0; f.load(std::memory_order_acquire) < at_least; ++spins) {
      // Spin briefly (the peers are on this node and usually a few microseconds behind),
      // then yield the core, checking the deadline and the peers every so often.
      if (spins % 64 == 63) {
        poll();
        std::this_thread::yield();
      }
    }
  }
}

void NodeAllreduce::allreduce(void* data, int64_t numel, DType dtype, ReduceOp op,
                              const std::function<void()>& poll) {
  const size_t elem = dtype_size(dtype);
  const auto chunk = static_cast<int64_t>(slot_bytes_ / elem);
  auto* bytes = static_cast<uint8_t*>(data);
  const int64_t divisor = op == ReduceOp::kAvg ? ranks_ : 1;
  for (int64_t begin = 0; begin < numel; begin += chunk) {
    const int64_t len = std::min(chunk, numel - begin);
    const uint64_t s = ++seq_;
    uint8_t* const chunk_data = bytes + static_cast<size_t>(begin) * elem;
    // 1. Copy in, once every rank is done reading this slot's previous chunk (s - 2).
    if (s > 2) wait_all(kConsumed, s - 2, poll);
    std::memcpy(slot(rank_, s), chunk_data, static_cast<size_t>(len) * elem);
    publish(kReady, s);
    // 2. Reduce this rank's slice from every slot, in rank order.
    wait_all(kReady, s, poll);
    const auto slice = [&](int q) { return std::pair<int64_t, int64_t>{len * q / ranks_, len * (q + 1) / ranks_}; };
    const auto [b, e] = slice(rank_);
    if (e > b) {
      uint8_t* out = chunk_data + static_cast<size_t>(b) * elem;
      const size_t off = static_cast<size_t>(b) * elem, n = static_cast<size_t>(e - b);
      std::memcpy(out, slot(0, s) + off, n * elem);
      for (int q = 1; q < ranks_; ++q) {
        reduce_inplace(out, slot(q, s) + off, e - b, dtype, op, q == ranks_ - 1 ? divisor : 1);
      }
      std::memcpy(slot(rank_, s) + off, out, n * elem);
    }
    publish(kDone, s);
    // 3. Copy the other slices out of their owners' slots.
    wait_all(kDone, s, poll);
    for (int q = 0; q < ranks_; ++q) {
      if (q == rank_) continue;
      const auto [qb, qe] = slice(q);
      if (qe > qb) {
        std::memcpy(chunk_data + static_cast<size_t>(qb) * elem, slot(q, s) + static_cast<size_t>(qb) * elem,
                    static_cast<size_t>(qe - qb) * elem);
      }
    }
    publish(kConsumed, s);
  }
}

}  // namespace gradcomm::detail
