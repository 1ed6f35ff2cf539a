// The collectives of the ranks of one node through a shared segment (issue 46): every rank
// reduces its own piece of each chunk straight from the others' copies and the others copy
// the result out, instead of passing the data around a ring of messages.
//
// The segment (shm_segment.h) holds a header, flags per rank (ready, with a line per parity
// of the round that also carries the round's digest and a payload of up to kNodeLineBytes;
// done; consumed) and two chunk slots per rank. Every collective goes in rounds of at most
// one slot per rank; rounds are numbered over the communicator's life, the same on every
// rank as its calls are. A round s:
//   1. copy in    once every consumed[q] >= s - 2 (slots alternate, so a slot is written
//                 again two rounds later, once every rank is done reading it): this rank's
//                 part into its slot s % 2, the call's digest beside ready; ready[r] = s
//   2. reduce     once every ready[q] >= s, and every digest is this call's (otherwise
//                 NodeWait::disagree): piece r of the round from every slot, in rank order
//                 0, 1, .., N-1 (reduce.h's kernels, the average divided in the last one);
//                 done[r] = s
//   3. copy out   once every done[q] >= s: the other pieces from their owners' slots;
//                 consumed[r] = s
// Every rank waits in step 2 for every other's `ready` (but a broadcast's non-roots, for the
// root's alone), so no rank finishes a round another rank is in with another call.
// Allreduce runs all three, its pieces the N slices of a chunk: a rank copies in every
// slice but its own, reads its own from its buffer when it reduces, and puts the result in
// the free place in its slot (each byte of its buffer is read once and written once; the
// other passes are over the slots, in cache). A chunk of at most kNodeSmallBytes skips
// step 3: every rank copies in all of it and reduces all of it, in the same order, so the
// bytes are the same (one of at most kNodeLineBytes goes in the ready line, not the slot:
// a cache line from each rank to the others, not two). Reduce-scatter has no step 3: piece
// p of a round is the next part of segment p, and its owner reduces it into its output. Allgather and broadcast copy in
// and out; a barrier is a round with no data. Flags are released after the writes they
// publish and acquired before the reads that follow (std::atomic_ref on the segment).
//
// Results: every rank stores the same bytes (each element is reduced by one sum in rank
// order). The ring sums in ring order, so at N >= 3 floating-point sums may differ from the
// ring's in the last bits; at N = 2, and for min, max and integer sums, they are equal.
//
// Waiting: a wait spins, then calls NodeWait::poll between checks (which throws to end the
// call: the deadline, an abort, a dead peer). A call that threw leaves the segment in an
// unknown state: the communicator must not use it again (as after any failed collective).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <atomic>
#include <chrono>
#include <span>
#include <vector>

#include "gradcomm/types.h"

namespace gradcomm::detail {

// An allreduce chunk of at most this many bytes is reduced whole by every rank.
inline constexpr size_t kNodeSmallBytes = size_t{16} << 10;
// One of at most this many bytes travels in the ready line itself, beside the flag and the
// digest (one cache line from each rank to the others, not two).
inline constexpr size_t kNodeLineBytes = 48;

// Bytes a segment for `ranks` ranks with slots of `slot_bytes` needs.
size_t node_segment_bytes(int ranks, size_t slot_bytes);
// Writes the header of a fresh (zeroed) segment: its creator, before any rank attaches.
void init_node_segment(uint8_t* segment, int ranks, size_t slot_bytes);

// How long a wait spins before it starts yielding the core (NodeCollectives::await):
// GRADCOMM_SHM_SPIN_US, else 20 us while the node's `ranks` have a core each, and none when
// they do not (a spinning rank then holds the core the rank it waits for needs).
// InvalidArgument for a value out of range.
std::chrono::microseconds node_spin_alone(int ranks);

// A call record of at most this many bytes goes beside each round's digest.
inline constexpr size_t kNodeRecordBytes = 119;

struct NodeWait {
  // Called between checks of a wait on rank `rank` (a place in the node); throws to end it.
  std::function<void(int rank)> poll;
  // Rank `rank` (a place in the node) published another call's digest in this round, with
  // `theirs`, its call record: must throw (the caller names both calls).
  std::function<void(int rank, std::span<const uint8_t> theirs)> disagree;
  // Writes this rank's call record (what `disagree` gets on the other ranks) into `into`
  // and returns its length (at most into.size()); called in each round just after the flag
  // is raised, while it travels. Empty: no record.
  std::function<size_t(std::span<uint8_t> into)> record;
};

class NodeCollectives {
 public:
  // CorruptPayload when the segment's header is not one for `ranks` and `slot_bytes` (a
  // stale segment, another job's, or one not initialized).
  NodeCollectives(uint8_t* segment, int rank, int ranks, size_t slot_bytes);

  int rank() const { return rank_; }
  int size() const { return ranks_; }
  // Bytes this rank has copied into its slots so far: what it gave its node's peers.
  uint64_t bytes_written() const { return written_; }
  // Rounds this rank has started so far (a collective with no data may run none).
  uint64_t rounds() const { return round_; }

  // `digest` names the call (every rank of the node passes the same for the same call).
  // data[0, numel) in place.
  void allreduce(void* data, int64_t numel, DType dtype, ReduceOp op, uint64_t digest, const NodeWait& wait);
  // The same, where every rank's buffer is mapped here (Communicator::alloc_shared):
  // buffers[q] is rank q's data for this call (buffers[rank()] == data). No slots: in a
  // round per chunk of a slot's size, each rank reduces its slice of the chunk from the
  // others' buffers into its own, in rank order (the same bytes as allreduce), then
  // copies the others' slices from their owners' buffers; it returns once every rank has
  // finished reading its buffer.
  void allreduce_direct(void* data, int64_t numel, DType dtype, ReduceOp op, std::span<const uint8_t* const> buffers,
                        uint64_t digest, const NodeWait& wait);
  // `in` holds segment p at [starts[p], starts[p + 1]) (N + 1 entries): this rank's segment,
  // reduced over the node, goes to `out` (which may be that segment of `in`; `in` is
  // otherwise left as it was).
  void reduce_scatter(const void* in, void* out, std::span<const int64_t> starts, DType dtype, ReduceOp op,
                      uint64_t digest, const NodeWait& wait);
  // Block p of `out` is bytes [offsets[p], offsets[p + 1]) (N + 1 entries); this rank's own
  // block is in place; every other block is copied from its rank.
  void allgather(uint8_t* out, std::span<const int64_t> offsets, uint64_t digest, const NodeWait& wait);
  // data[0, bytes) of rank `root` to every rank.
  void broadcast(void* data, size_t bytes, int root, uint64_t digest, const NodeWait& wait);
  void barrier(uint64_t digest, const NodeWait& wait);

 private:
  enum Flag { kReady = 0, kDone = 1, kConsumed = 2 };
  uint8_t* line(int rank, int index) const;  // rank's index-th cache line of flags
  // Rank's flag `which` for `round` (ready has a line per parity of the round).
  uint64_t* flag(int rank, int which, uint64_t round) const;
  uint64_t* digest_word(int rank, uint64_t round) const;
  uint8_t* payload(int rank, uint64_t round) const;  // kNodeLineBytes in the ready line
  // [the round it is for][length][bytes], kNodeRecordBytes at most: written after ready.
  uint8_t* record(int rank, uint64_t round) const;
  uint8_t* slot(int rank, uint64_t round) const;
  // Steps of a round (see above).
  uint64_t begin_round(const NodeWait& wait);
  void publish_ready(uint64_t round, uint64_t digest, const NodeWait& wait) const;
  void wait_ready(uint64_t round, uint64_t digest, const NodeWait& wait, int only = -1);
  // Rank q published another call's digest in `round`: once its record for the round is
  // there, NodeWait::disagree with it (which throws).
  [[noreturn]] void named_by_record(int q, uint64_t round, const NodeWait& wait);
  // Until rank q's flag `which` reaches `at_least` (spin, then yield; NodeWait::poll between).
  void await(int q, int which, uint64_t at_least, const NodeWait& wait);
  void await_slow(std::atomic_ref<uint64_t> f, uint64_t at_least, const NodeWait& wait, int q) const;
  void wait_all(int which, uint64_t at_least, const NodeWait& wait);
  void publish(int which, uint64_t round) const;
  void put(uint8_t* slot_bytes, const void* from, size_t bytes);  // a copy into this rank's slot
  // Piece q of a chunk of n elements: [begin, end), 64-byte aligned boundaries.
  std::pair<int64_t, int64_t> slice(int64_t n, size_t elem, int q) const;
  // out = the rank-order reduction of `count` elements at byte `offset` of every slot of
  // round s (`in_line`: of every ready line's payload instead); this rank's term from `own`
  // instead when given. `out` aliases no source.
  void reduce_from_slots(void* out, size_t offset, int64_t count, DType dtype, ReduceOp op, uint64_t s,
                         const void* own = nullptr, bool in_line = false) const;

  uint8_t* flags_;  // the ranks' flag lines
  uint8_t* slots_;  // the ranks' slots
  int rank_;
  int ranks_;
  size_t slot_bytes_;
  std::chrono::microseconds spin_alone_;  // a wait spins this long before it yields (await)
  uint64_t round_ = 0;  // the last round this rank started
  std::vector<uint64_t> seen_ready_;  // by rank: the highest ready flag this rank has read
  uint64_t written_ = 0;
};

}  // namespace gradcomm::detail
