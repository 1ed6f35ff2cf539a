// The compressed ring's schedule, one copy for both rings that run it: the CPU ring
// (compressed_ring.cc, over the host transport) and the NCCL ring
// (nccl_compressed_ring.cc). Free of CUDA headers, so it is built and unit-tested in
// every configuration (tests/unit/test_compressed_ring_plan.cc executes it on the host
// with the CPU codecs, in the NCCL ring's order, against the CPU ring's bytes).
//
// Segments and units are RingSchedule's (ring_schedule.h) at the codec's alignment A:
// which rank starts a segment's partial sum and the order the hops add in decide the
// bits, so both rings sharing one schedule is what makes their results equal. Chunks
// do not change the arithmetic (every chunk starts at a multiple of A, and a run
// encodes exactly as inside the whole tensor), so each ring picks its own chunk size.
//
// What unit u sends:
//   u < C                      this rank's own segment, encoded at the start;
//   C <= u < (N-1)C            the re-encoded partial sum after unit u - C's decode-add;
//   (N-1)C <= u < (N-1)C + C   the owner's final encode (after the last reduce-scatter hop);
//   u >= (N-1)C + C            unit u - C's received payload, forwarded unchanged.
// Payload layout (the NCCL ring's one device block; the CPU ring sizes its buffers
// from send_bytes/recv_bytes): an "out" region per encoded unit and an "in" region
// per unit, each 16-byte aligned, so no buffer is reused within a call and no event
// is needed to protect one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "collectives/ring_schedule.h"

namespace gradcomm::detail {

class CompressedRingPlan {
 public:
  // `encoded_bytes(n)`: the codec's payload size for n values. `chunk_elems`: the
  // preferred chunk (rounded down to a multiple of `align`, at least `align`);
  // at most `max_chunks` chunks per segment. Requires size >= 2, numel >= 0, align >= 1.
  CompressedRingPlan(int size, int rank, int64_t numel, int64_t align, int64_t chunk_elems, int max_chunks,
                     const std::function<size_t(int64_t)>& encoded_bytes);

  const RingSchedule& schedule() const { return schedule_; }
  int size() const { return schedule_.size(); }
  int64_t chunks() const { return schedule_.chunks(); }
  int64_t units() const { return schedule_.units(); }
  int64_t rs_units() const { return schedule_.rs_units(); }
  bool reduce_scatter(int64_t u) const { return schedule_.reduce_scatter(u); }
  // Sends of units [0, encoded_units()) come from an encode; later ones forward.
  int64_t encoded_units() const { return rs_units() + chunks(); }
  // The owner's final encode (its output replaces the owner's own values).
  bool final_encode(int64_t u) const { return u >= rs_units() && u < encoded_units(); }

  int64_t segment_begin(int s) const { return schedule_.segment_begin(s); }  // s in [0, size]
  std::pair<int64_t, int64_t> chunk(int s, int64_t j) const { return schedule_.chunk(s, j); }
  std::pair<int64_t, int64_t> send_range(int64_t u) const { return schedule_.send_range(u); }
  std::pair<int64_t, int64_t> recv_range(int64_t u) const { return schedule_.recv_range(u); }
  int64_t max_chunk_elems() const { return schedule_.max_chunk_elems(); }  // bounds every unit's range

  // Byte offsets into the payload block and sizes.
  size_t send_offset(int64_t u) const;  // out region, or the forwarded unit's in region
  size_t send_bytes(int64_t u) const { return send_bytes_[u]; }
  size_t recv_offset(int64_t u) const { return recv_offset_[u]; }
  size_t recv_bytes(int64_t u) const { return recv_bytes_[u]; }
  size_t buffer_bytes() const { return buffer_bytes_; }

 private:
  RingSchedule schedule_;
  std::vector<size_t> out_offset_, send_bytes_, recv_offset_, recv_bytes_;
  size_t buffer_bytes_ = 0;
};

}  // namespace gradcomm::detail
