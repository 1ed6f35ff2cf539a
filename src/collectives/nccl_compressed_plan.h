// Host-side schedule of the compressed ring on NCCL (nccl_compressed_ring.cc), free
// of CUDA headers so it is built and unit-tested in every configuration
// (tests/unit/test_nccl_compressed_plan.cc runs it on the host with the CPU codecs).
//
// Segments are exactly the CPU ring's (compressed_ring.cc): segment s is
// [seg(s), seg(s+1)) with seg(s) = min(numel, ceil(numel/A) * s / N * A) for the
// codec's alignment A. That matters: which rank starts a segment's partial sum and
// the order the hops add in decide the bits, so equal segments give the CPU path's
// bytes. Chunks within a segment do not change the arithmetic (every chunk starts
// at a multiple of A, and a run encodes exactly as inside the whole tensor), so
// the GPU is free to pick larger chunks than the host ring.
//
// Units as in the CPU ring: unit u = step * C + chunk, reduce-scatter units
// [0, (N-1)C), allgather units [(N-1)C, 2(N-1)C). Unit u sends send_range(u) to the
// right and receives recv_range(u) from the left. What unit u sends:
//   u < C                      this rank's own segment, encoded at the start;
//   C <= u < (N-1)C            the re-encoded partial sum after unit u - C's decode-add;
//   (N-1)C <= u < (N-1)C + C   the owner's final encode (after the last reduce-scatter hop);
//   u >= (N-1)C + C            unit u - C's received payload, forwarded unchanged.
// Payload memory (device, one block): an "out" region per encoded unit and an "in"
// region per unit, each 16-byte aligned, so no buffer is reused within a call and
// no event is needed to protect one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace gradcomm::detail {

class CompressedRingPlan {
 public:
  // `encoded_bytes(n)`: the codec's payload size for n values. `chunk_elems`: the
  // preferred chunk (rounded down to a multiple of `align`, at least `align`);
  // at most `max_chunks` chunks per segment. Requires size >= 2, numel >= 0, align >= 1.
  CompressedRingPlan(int size, int rank, int64_t numel, int64_t align, int64_t chunk_elems, int max_chunks,
                     const std::function<size_t(int64_t)>& encoded_bytes);

  int size() const { return size_; }
  int64_t chunks() const { return chunks_; }
  int64_t units() const { return 2 * rs_units_; }
  int64_t rs_units() const { return rs_units_; }
  bool reduce_scatter(int64_t u) const { return u < rs_units_; }
  // Sends of units [0, encoded_units()) come from an encode; later ones forward.
  int64_t encoded_units() const { return rs_units_ + chunks_; }
  // The owner's final encode (its output replaces the owner's own values).
  bool final_encode(int64_t u) const { return u >= rs_units_ && u < rs_units_ + chunks_; }

  int64_t segment_begin(int s) const;  // s in [0, size]
  std::pair<int64_t, int64_t> chunk(int s, int64_t j) const;
  std::pair<int64_t, int64_t> send_range(int64_t u) const;
  std::pair<int64_t, int64_t> recv_range(int64_t u) const;

  // Byte offsets into the payload block and sizes.
  size_t send_offset(int64_t u) const;  // out region, or the forwarded unit's in region
  size_t send_bytes(int64_t u) const { return send_bytes_[u]; }
  size_t recv_offset(int64_t u) const { return recv_offset_[u]; }
  size_t recv_bytes(int64_t u) const { return recv_bytes_[u]; }
  size_t buffer_bytes() const { return buffer_bytes_; }

 private:
  int wrap(int64_t v) const { return static_cast<int>(((v % size_) + size_) % size_); }

  int size_, rank_;
  int64_t numel_, align_;
  int64_t chunks_ = 1, rs_units_ = 0;
  std::vector<size_t> out_offset_, send_bytes_, recv_offset_, recv_bytes_;
  size_t buffer_bytes_ = 0;
};

}  // namespace gradcomm::detail
