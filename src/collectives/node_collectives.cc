#include "collectives/node_collectives.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <atomic>
#include <optional>
#include <cstring>
#include <thread>

#include <unistd.h>

#include "gradcomm/errors.h"
#include "env.h"
#include "reduce.h"

namespace gradcomm::detail {
namespace {

constexpr uint64_t kMagic = 0x33524c4e4d434447ull;  // "GDCMNLR3"
constexpr size_t kLine = 64;                        // flags on their own cache lines
// A rank's lines: ready for even rounds, for odd rounds (each with the round's digest and
// inline payload), done, consumed, then a call record per parity.
constexpr int kDoneLine = 2;
constexpr int kConsumedLine = 3;
constexpr int kRecordLines = 2;  // a call record per parity
constexpr int kFirstRecordLine = 4;
constexpr int kLinesPerRank = kFirstRecordLine + 2 * kRecordLines;
// A record: the round it is for (a word, released last), its length (a byte), its bytes.
constexpr size_t kRecordLengthAt = 8;
constexpr size_t kRecordBytesAt = 9;
static_assert(kRecordBytesAt + kNodeRecordBytes == kRecordLines * kLine);
constexpr uint32_t kSpinsPerPoll = 64;
}  // namespace

std::chrono::microseconds node_spin_alone(int ranks) {
  static const std::optional<int64_t> set = env_int_if_set("GRADCOMM_SHM_SPIN_US", 0, 1'000'000);
  if (set) return std::chrono::microseconds(*set);
  static const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return std::chrono::microseconds(cores > 0 && ranks <= cores ? 20 : 0);
}

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

struct Header {
  uint64_t magic;
  uint64_t ranks;
  uint64_t slot_bytes;
};

size_t flags_offset() { return kLine; }
size_t slots_offset(int ranks) { return flags_offset() + static_cast<size_t>(ranks) * kLinesPerRank * kLine; }

// out = from(0) op from(1) op ... op from(ranks - 1), in rank order (the average divided in
// the last step): what every path of the segment reduces with, so that they give the same
// bytes. `out` may be from(0), never another source.
template <typename From>
void reduce_in_rank_order(void* out, int ranks, const From& from, int64_t count, DType dtype, ReduceOp op) {
  if (ranks == 1) {
    std::memcpy(out, from(0), static_cast<size_t>(count) * dtype_size(dtype));
    return;
  }
  const int64_t divisor = op == ReduceOp::kAvg ? ranks : 1;
  reduce_into(out, from(0), from(1), count, dtype, op, ranks == 2 ? divisor : 1);
  for (int q = 2; q < ranks; ++q) reduce_inplace(out, from(q), count, dtype, op, q == ranks - 1 ? divisor : 1);
}

}  // namespace

size_t node_segment_bytes(int ranks, size_t slot_bytes) {
  return slots_offset(ranks) + static_cast<size_t>(ranks) * 2 * slot_bytes;
}

void init_node_segment(uint8_t* segment, int ranks, size_t slot_bytes) {
  const Header h{kMagic, static_cast<uint64_t>(ranks), slot_bytes};
  std::memcpy(segment, &h, sizeof h);
}

NodeCollectives::NodeCollectives(uint8_t* segment, int rank, int ranks, size_t slot_bytes)
    : flags_(segment + flags_offset()),
      slots_(segment + slots_offset(ranks)),
      rank_(rank),
      ranks_(ranks),
      slot_bytes_(slot_bytes),
      spin_alone_(node_spin_alone(ranks)),
      seen_ready_(static_cast<size_t>(std::max(ranks, 0)), 0) {
  Header h{};
  std::memcpy(&h, segment, sizeof h);
  if (h.magic != kMagic || h.ranks != static_cast<uint64_t>(ranks) || h.slot_bytes != slot_bytes) {
    throw CorruptPayload(fmt::format("node segment: header says {} ranks, slots of {} bytes (magic {:#x}); this "
                                     "rank expected {} ranks, {} bytes: not this communicator's segment",
                                     h.ranks, h.slot_bytes, h.magic, ranks, slot_bytes));
  }
  if (rank < 0 || rank >= ranks || slot_bytes < 64 * static_cast<size_t>(ranks) || slot_bytes % 64 != 0) {
    throw InvalidArgument(fmt::format("node segment: rank {} of {}, slots of {} bytes", rank, ranks, slot_bytes));
  }
}

inline uint8_t* NodeCollectives::line(int rank, int index) const {
  return flags_ + (static_cast<size_t>(rank) * kLinesPerRank + static_cast<size_t>(index)) * kLine;
}

// Ready has a line per parity of the round: a rank can be at most one round ahead of
// another's reads (it waits for every consumed >= s - 2 before round s), so round s's
// line (its digest and payload) stays until that rank has read it.
inline uint64_t* NodeCollectives::flag(int rank, int which, uint64_t round) const {
  const int index = which == kReady ? static_cast<int>(round % 2) : which == kDone ? kDoneLine : kConsumedLine;
  return reinterpret_cast<uint64_t*>(line(rank, index));
}

inline uint64_t* NodeCollectives::digest_word(int rank, uint64_t round) const { return flag(rank, kReady, round) + 1; }

inline uint8_t* NodeCollectives::payload(int rank, uint64_t round) const {
  return reinterpret_cast<uint8_t*>(flag(rank, kReady, round) + 2);
}

// Like the digest: round s's record stays until every rank is done with round s.
inline uint8_t* NodeCollectives::record(int rank, uint64_t round) const {
  return line(rank, kFirstRecordLine + static_cast<int>(round % 2) * kRecordLines);
}

inline uint8_t* NodeCollectives::slot(int rank, uint64_t round) const {
  return slots_ + (static_cast<size_t>(rank) * 2 + round % 2) * slot_bytes_;
}

inline void NodeCollectives::put(uint8_t* slot_bytes, const void* from, size_t bytes) {
  std::memcpy(slot_bytes, from, bytes);
  written_ += bytes;
}

inline void NodeCollectives::publish(int which, uint64_t round) const {
  std::atomic_ref<uint64_t>(*flag(rank_, which, round)).store(round, std::memory_order_release);
}

inline void NodeCollectives::await(int q, int which, uint64_t at_least, const NodeWait& wait) {
  std::atomic_ref<uint64_t> f(*flag(q, which, at_least));
  if (f.load(std::memory_order_acquire) < at_least) await_slow(f, at_least, wait, q);
  // Remembered for begin_round: what q has started, it has finished the round before.
  if (which == kReady) seen_ready_[static_cast<size_t>(q)] = f.load(std::memory_order_acquire);
}

void NodeCollectives::await_slow(std::atomic_ref<uint64_t> f, uint64_t at_least, const NodeWait& wait, int q) const {
  // Spin (the peers are on this node and usually a microsecond or two behind), checking in
  // with the caller (deadline, aborts, the peers' lives) every kSpinsPerPoll; after
  // spin_alone_, yield the core at each check: the peer may need it (more ranks than cores).
  // The clock is read from the first check on (a reading costs ~17 ns; most waits end
  // before the first check).
  std::chrono::steady_clock::time_point alone_until{};
  bool alone = true;
  for (uint32_t spins = 1; f.load(std::memory_order_acquire) < at_least; ++spins) {
    cpu_relax();
    if (spins % kSpinsPerPoll != 0) continue;
    wait.poll(q);
    if (alone) {
      const auto now = std::chrono::steady_clock::now();
      if (spins == kSpinsPerPoll) alone_until = now + spin_alone_;
      alone = now < alone_until;
    }
    if (!alone) std::this_thread::yield();
  }
}

inline void NodeCollectives::wait_all(int which, uint64_t at_least, const NodeWait& wait) {
  for (int q = 0; q < ranks_; ++q) {
    if (q != rank_) await(q, which, at_least, wait);
  }
}

uint64_t NodeCollectives::begin_round(const NodeWait& wait) {
  const uint64_t s = ++round_;
  if (s > 2) {
    // Everyone is done reading slot s % 2: a rank seen in round s - 1 or later has
    // finished round s - 2 (rounds run in order), so only the others are asked (their
    // consumed flag: one cache line less to fetch per round in a run of small calls).
    for (int q = 0; q < ranks_; ++q) {
      if (q != rank_ && seen_ready_[static_cast<size_t>(q)] < s - 1) await(q, kConsumed, s - 2, wait);
    }
  }
  return s;
}

void NodeCollectives::publish_ready(uint64_t round, uint64_t digest, const NodeWait& wait) const {
  std::atomic_ref<uint64_t>(*digest_word(rank_, round)).store(digest, std::memory_order_relaxed);
  publish(kReady, round);
  // The record after the flag, while the flag travels: a peer reads it only when the
  // digests disagree, and then waits for its stamp (named_by_record).
  uint8_t* mine = record(rank_, round);
  const size_t length =
      wait.record ? std::min(wait.record(std::span(mine + kRecordBytesAt, kNodeRecordBytes)), kNodeRecordBytes) : 0;
  mine[kRecordLengthAt] = static_cast<uint8_t>(length);
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(mine)).store(round, std::memory_order_release);
}

void NodeCollectives::named_by_record(int q, uint64_t round, const NodeWait& wait) {
  std::atomic_ref<uint64_t> stamp(*reinterpret_cast<uint64_t*>(record(q, round)));
  if (stamp.load(std::memory_order_acquire) < round) await_slow(stamp, round, wait, q);
  const uint8_t* theirs = record(q, round);
  wait.disagree(q, std::span<const uint8_t>(theirs + kRecordBytesAt,
                                            std::min<size_t>(theirs[kRecordLengthAt], kNodeRecordBytes)));
  throw std::logic_error("NodeWait::disagree returned");
}

void NodeCollectives::wait_ready(uint64_t round, uint64_t digest, const NodeWait& wait, int only) {
  for (int q = 0; q < ranks_; ++q) {
    if (q == rank_ || (only >= 0 && q != only)) continue;  // `only`: a broadcast's root, for the others
    await(q, kReady, round, wait);
    if (std::atomic_ref<uint64_t>(*digest_word(q, round)).load(std::memory_order_relaxed) != digest) {
      named_by_record(q, round, wait);
    }
  }
}

std::pair<int64_t, int64_t> NodeCollectives::slice(int64_t n, size_t elem, int q) const {
  const int64_t align = std::max<int64_t>(1, static_cast<int64_t>(64 / elem));
  const auto edge = [&](int p) {
    if (p >= ranks_) return n;
    const int64_t raw = n * p / ranks_;
    return std::min(n, (raw + align - 1) / align * align);
  };
  return {edge(q), edge(q + 1)};
}

void NodeCollectives::reduce_from_slots(void* out, size_t offset, int64_t count, DType dtype, ReduceOp op,
                                        uint64_t s, const void* own, bool in_line) const {
  if (count <= 0) return;
  const auto from = [&](int q) -> const void* {
    if (q == rank_ && own != nullptr) return own;
    return in_line ? payload(q, s) + offset : slot(q, s) + offset;
  };
  reduce_in_rank_order(out, ranks_, from, count, dtype, op);
}

void NodeCollectives::allreduce(void* data, int64_t numel, DType dtype, ReduceOp op, uint64_t digest,
                                const NodeWait& wait) {
  const size_t elem = dtype_size(dtype);
  const auto chunk = static_cast<int64_t>(slot_bytes_ >> std::countr_zero(elem));  // elem: a power of two
  auto* bytes = static_cast<uint8_t*>(data);
  for (int64_t begin = 0; begin < numel; begin += chunk) {
    const int64_t len = std::min(chunk, numel - begin);
    uint8_t* const chunk_data = bytes + static_cast<size_t>(begin) * elem;
    const uint64_t s = begin_round(wait);
    uint8_t* const mine = slot(rank_, s);
    if (static_cast<size_t>(len) * elem <= kNodeSmallBytes) {
      // Small: every rank reduces the whole chunk, in the same order, from the slots (or,
      // at most kNodeLineBytes, from the ready lines: no other line to move).
      const bool in_line = static_cast<size_t>(len) * elem <= kNodeLineBytes;
      put(in_line ? payload(rank_, s) : mine, chunk_data, static_cast<size_t>(len) * elem);
      publish_ready(s, digest, wait);
      wait_ready(s, digest, wait);
      reduce_from_slots(chunk_data, 0, len, dtype, op, s, nullptr, in_line);
      publish(kDone, s);
      publish(kConsumed, s);
      continue;
    }
    // The others' slices into this rank's slot (its own slice stays in its buffer: it is
    // read once, by the reduction), then this rank's slice, reduced from the slots and its
    // own buffer, into the free place in its slot, and from there into its buffer. Each
    // byte of the buffer is read once and written once; every other pass is over the
    // slots, which stay in cache.
    const auto [b, e] = slice(len, elem, rank_);
    const size_t lo = static_cast<size_t>(b) * elem;
    const size_t hi = static_cast<size_t>(e) * elem;
    put(mine, chunk_data, lo);
    put(mine + hi, chunk_data + hi, static_cast<size_t>(len) * elem - hi);
    publish_ready(s, digest, wait);
    wait_ready(s, digest, wait);
    // In blocks that stay in the first-level cache between the reduction and the copy.
    for (size_t at = lo; at < hi; at += kNodeSmallBytes) {
      const size_t n = std::min(kNodeSmallBytes, hi - at);
      reduce_from_slots(mine + at, at, static_cast<int64_t>(n / elem), dtype, op, s, chunk_data + at);
      std::memcpy(chunk_data + at, mine + at, n);
    }
    written_ += hi - lo;
    publish(kDone, s);
    wait_all(kDone, s, wait);
    for (int q = 0; q < ranks_; ++q) {
      if (q == rank_) continue;
      const auto [qb, qe] = slice(len, elem, q);
      if (qe > qb) {
        const size_t off = static_cast<size_t>(qb) * elem;
        std::memcpy(chunk_data + off, slot(q, s) + off, static_cast<size_t>(qe - qb) * elem);
      }
    }
    publish(kConsumed, s);
  }
}

void NodeCollectives::allreduce_direct(void* data, int64_t numel, DType dtype, ReduceOp op,
                                       std::span<const uint8_t* const> buffers, uint64_t digest,
                                       const NodeWait& wait) {
  if (ranks_ < 2 || buffers.size() != static_cast<size_t>(ranks_) || buffers[static_cast<size_t>(rank_)] != data) {
    throw std::logic_error("NodeCollectives::allreduce_direct: one buffer per rank, this rank's its own");
  }
  const size_t elem = dtype_size(dtype);
  const auto chunk = static_cast<int64_t>(slot_bytes_ >> std::countr_zero(elem));  // elem: a power of two
  const auto block_elems = static_cast<int64_t>(kNodeSmallBytes / elem);
  alignas(64) uint8_t block[kNodeSmallBytes];
  uint64_t s = 0;
  // A round per chunk (a slot's worth), so that a slice is copied while it is still in
  // its owner's cache.
  for (int64_t begin = 0; begin < numel; begin += chunk) {
    const int64_t len = std::min(chunk, numel - begin);
    const size_t base = static_cast<size_t>(begin) * elem;
    uint8_t* const mine = static_cast<uint8_t*>(data) + base;
    s = begin_round(wait);
    publish_ready(s, digest, wait);
    wait_ready(s, digest, wait);
    // This rank's slice, reduced in rank order from every rank's buffer into its own, in
    // blocks. Rank 0's own term is the first operand, read before it is overwritten: in
    // place. The others go through a block that stays in the first-level cache.
    const auto [b, e] = slice(len, elem, rank_);
    for (int64_t at = b; at < e; at += block_elems) {
      const int64_t n = std::min(block_elems, e - at);
      const size_t off = base + static_cast<size_t>(at) * elem;
      uint8_t* out = rank_ == 0 ? mine + (off - base) : block;
      reduce_in_rank_order(out, ranks_, [&](int q) { return buffers[static_cast<size_t>(q)] + off; }, n, dtype, op);
      if (out == block) std::memcpy(mine + (off - base), block, static_cast<size_t>(n) * elem);
    }
    publish(kDone, s);
    // The other slices from their owners' buffers, each once its owner has reduced it
    // (and so has finished reading this rank's copy of it).
    for (int q = 0; q < ranks_; ++q) {
      if (q == rank_) continue;
      const auto [qb, qe] = slice(len, elem, q);
      await(q, kDone, s, wait);
      if (qe > qb) {
        const size_t off = static_cast<size_t>(qb) * elem;
        std::memcpy(mine + off, buffers[static_cast<size_t>(q)] + base + off, static_cast<size_t>(qe - qb) * elem);
      }
    }
    publish(kConsumed, s);
  }
  // No rank returns (and lets its caller write its buffer) while another still reads it.
  if (s != 0) wait_all(kConsumed, s, wait);
}

void NodeCollectives::reduce_scatter(const void* in, void* out, std::span<const int64_t> starts, DType dtype,
                                     ReduceOp op, uint64_t digest, const NodeWait& wait) {
  if (starts.size() != static_cast<size_t>(ranks_) + 1) {
    throw std::logic_error("NodeCollectives::reduce_scatter: starts must have ranks + 1 entries");
  }
  const size_t elem = dtype_size(dtype);
  // Each round carries up to `per` elements of every segment; piece p sits at p * per.
  const int64_t align = std::max<int64_t>(1, static_cast<int64_t>(64 / elem));
  const int64_t per = static_cast<int64_t>(slot_bytes_ / elem) / ranks_ / align * align;
  int64_t longest = 0;
  for (int p = 0; p < ranks_; ++p) longest = std::max(longest, starts[p + 1] - starts[p]);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  const int64_t mine = starts[rank_ + 1] - starts[rank_];
  for (int64_t at = 0; at < longest; at += per) {
    const uint64_t s = begin_round(wait);
    uint8_t* my_slot = slot(rank_, s);
    for (int p = 0; p < ranks_; ++p) {
      const int64_t n = std::clamp<int64_t>(starts[p + 1] - starts[p] - at, 0, per);
      if (n > 0) {
        put(my_slot + static_cast<size_t>(p * per) * elem, src + static_cast<size_t>(starts[p] + at) * elem,
                    static_cast<size_t>(n) * elem);
      }
    }
    publish_ready(s, digest, wait);
    wait_ready(s, digest, wait);
    const int64_t n = std::clamp<int64_t>(mine - at, 0, per);
    reduce_from_slots(dst + static_cast<size_t>(at) * elem, static_cast<size_t>(rank_ * per) * elem, n, dtype, op, s);
    publish(kDone, s);
    publish(kConsumed, s);
  }
}

void NodeCollectives::allgather(uint8_t* out, std::span<const int64_t> offsets, uint64_t digest,
                                const NodeWait& wait) {
  if (offsets.size() != static_cast<size_t>(ranks_) + 1) {
    throw std::logic_error("NodeCollectives::allgather: offsets must have ranks + 1 entries");
  }
  const auto per = static_cast<int64_t>(slot_bytes_);
  int64_t longest = 0;
  for (int p = 0; p < ranks_; ++p) longest = std::max(longest, offsets[p + 1] - offsets[p]);
  const auto block = [&](int p, int64_t at) { return std::clamp<int64_t>(offsets[p + 1] - offsets[p] - at, 0, per); };
  for (int64_t at = 0; at < longest; at += per) {
    const uint64_t s = begin_round(wait);
    if (const int64_t n = block(rank_, at); n > 0) {
      put(slot(rank_, s), out + offsets[rank_] + at, static_cast<size_t>(n));
    }
    publish_ready(s, digest, wait);
    wait_ready(s, digest, wait);
    for (int q = 0; q < ranks_; ++q) {
      if (q == rank_) continue;
      if (const int64_t n = block(q, at); n > 0) std::memcpy(out + offsets[q] + at, slot(q, s), static_cast<size_t>(n));
    }
    publish(kDone, s);
    publish(kConsumed, s);
  }
}

void NodeCollectives::broadcast(void* data, size_t bytes, int root, uint64_t digest, const NodeWait& wait) {
  auto* p = static_cast<uint8_t*>(data);
  for (size_t at = 0; at < bytes; at += slot_bytes_) {
    const size_t n = std::min(slot_bytes_, bytes - at);
    const uint64_t s = begin_round(wait);
    if (rank_ == root) put(slot(rank_, s), p + at, n);
    publish_ready(s, digest, wait);
    // The root waits for every rank (it needs no one's data, but must not call a round
    // done that another rank is in with another call); the others for the root alone.
    wait_ready(s, digest, wait, rank_ == root ? -1 : root);
    if (rank_ != root) std::memcpy(p + at, slot(root, s), n);
    publish(kDone, s);
    publish(kConsumed, s);
  }
}

void NodeCollectives::barrier(uint64_t digest, const NodeWait& wait) {
  const uint64_t s = begin_round(wait);
  publish_ready(s, digest, wait);
  wait_ready(s, digest, wait);
  publish(kDone, s);
  publish(kConsumed, s);
}

}  // namespace gradcomm::detail
