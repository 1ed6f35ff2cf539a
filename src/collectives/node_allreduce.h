// The allreduce of the ranks of one node through a shared segment (issue 46): every rank
// reduces its own slice of each chunk straight from the others' copies, then copies the
// other slices' results out, instead of passing the data around a ring of messages.
//
// The segment (shm_segment.h) holds a header, three flags per rank and two chunk slots per
// rank. A call goes chunk by chunk (slot_bytes of the call's type each; sequence numbers
// count chunks over the communicator's life, the same on every rank as the calls are):
//   1. copy in    this rank's input chunk into its slot; ready[r] = s
//   2. reduce     once every ready[q] >= s: slice r of the chunk (elements [L r/N, L(r+1)/N))
//                 from every slot in rank order 0, 1, .., N-1 (reduce.h's kernels, the
//                 average divided in the last one) into the caller's buffer, then into
//                 slice r of this rank's slot; done[r] = s
//   3. copy out   once every done[q] >= s: the other slices from their owners' slots;
//                 consumed[r] = s
// A slot is written again two chunks later, once every consumed[q] >= s - 2: chunks
// alternate between a rank's two slots, so copy-in of one chunk overlaps the others'
// copy-out of the one before. Flags are released after the writes they publish and
// acquired before the reads that follow (std::atomic_ref on the segment's words).
//
// Results: every rank stores the same bytes (each slice is reduced once, by its owner, and
// copied); the order of the sum is rank order, not the ring's, so floating-point sums may
// differ from the ring's in the last bits (min, max and integer sums do not).
//
// Waiting: every wait calls `poll` between checks; poll throws to end the call (deadline,
// a dead peer); the call then leaves the segment in an unknown state, and the communicator
// must not use it again (as after any failed collective).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "gradcomm/types.h"

namespace gradcomm::detail {

// Bytes a segment for `ranks` ranks with slots of `slot_bytes` needs.
size_t node_segment_bytes(int ranks, size_t slot_bytes);
// Writes the header of a fresh (zeroed) segment: its creator, before any rank attaches.
void init_node_segment(uint8_t* segment, int ranks, size_t slot_bytes);

class NodeAllreduce {
 public:
  // CorruptPayload when the segment's header is not one for `ranks` and `slot_bytes` (a
  // stale segment, another job's, or one not initialized).
  NodeAllreduce(uint8_t* segment, int rank, int ranks, size_t slot_bytes);

  // data[0, numel) in place; every rank calls with the same numel, dtype and op.
  void allreduce(void* data, int64_t numel, DType dtype, ReduceOp op, const std::function<void()>& poll);

 private:
  uint64_t* flag(int rank, int which) const;
  uint8_t* slot(int rank, uint64_t seq) const;
  void wait_all(int which, uint64_t at_least, const std::function<void()>& poll) const;
  void publish(int which, uint64_t value) const;

  uint8_t* segment_;
  int rank_;
  int ranks_;
  size_t slot_bytes_;
  uint64_t seq_ = 0;  // the last chunk this rank started
};

}  // namespace gradcomm::detail
