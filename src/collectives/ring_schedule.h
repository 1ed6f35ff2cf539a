// The ring allreduce's schedule: which elements every message of the ring carries.
// One copy for every ring the library runs, so that rings meant to agree bit for bit
// cannot drift apart: the dense rings, CPU and NCCL (ring_allreduce.cc,
// nccl_ring_allreduce.cc) and the compressed rings, CPU and NCCL (CompressedRingPlan,
// compressed_ring_plan.h). One loop runs them all: drive_ring (ring_driver.h). Pure
// integer arithmetic, no CUDA.
//
// The textbook ring (Patarasuk and Yuan; NCCL's runRing). The tensor is cut into N
// segments. Reduce-scatter step k = 0..N-2: rank r sends segment r-k to the right and
// receives segment r-k-1 from the left, folding it into its own; after N-1 steps it
// holds segment r+1 fully reduced. Allgather step k: it sends segment r+1-k and
// receives segment r-k. Every segment is cut into the same number C of chunks, and
// one (step, chunk) pair is one message, a "unit": u = step * C + chunk, numbered
// through the reduce-scatter [0, (N-1)C) and then the allgather [(N-1)C, 2(N-1)C).
//
// Segments and chunks start at multiples of `align` (a codec's bucket, so a chunk
// encodes exactly as inside the whole tensor; 1 for the dense ring). With U =
// ceil(numel / align) alignment units, segment s starts at
//   min(numel, floor(U * s / N) * align),
// balanced to within one unit, and chunk j of a segment of V units starts at
// floor(V * j / C) * align from the segment's start (clipped to its end).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

namespace gradcomm::detail {

// What a ring runs: both phases (allreduce), or the reduce-scatter alone, with the
// schedule's ranks shifted by one so that rank r ends holding segment r
// (ring_allreduce.cc, compressed_ring.cc).
enum class RingPhases : uint8_t { kAllreduce, kReduceScatter };

// What the driver and its channels know of a ring: C chunks per step, and which units
// belong to the reduce-scatter (the first rs_units; an allgather alone has none).
// RingSchedule::shape() for the allreduce rings; the allgather makes its own.
struct RingShape {
  int64_t chunks = 1;
  int64_t rs_units = 0;
  bool reduce_scatter(int64_t u) const { return u < rs_units; }
};

class RingSchedule {
 public:
  // `chunk_elems`: the preferred chunk (rounded down to a multiple of `align`, at
  // least `align`); at most `max_chunks` chunks per segment. size >= 1, 0 <= rank <
  // size, numel >= 0, align >= 1 (callers check what they take from users).
  RingSchedule(int size, int rank, int64_t numel, int64_t align, int64_t chunk_elems, int64_t max_chunks)
      : size_(size), rank_(rank), numel_(numel), align_(align) {
    const int64_t units = (numel + align - 1) / align;
    max_segment_ = (units + size - 1) / size * align;
    const int64_t chunk = std::max(align, chunk_elems / align * align);
    chunks_ = std::clamp<int64_t>((max_segment_ + chunk - 1) / chunk, 1, std::max<int64_t>(max_chunks, 1));
    rs_units_ = int64_t{size - 1} * chunks_;
  }

  int size() const { return size_; }
  int rank() const { return rank_; }
  int64_t chunks() const { return chunks_; }
  int64_t rs_units() const { return rs_units_; }
  int64_t units() const { return 2 * rs_units_; }
  // What the ring driver needs (ring_driver.h).
  RingShape shape() const { return {chunks_, rs_units_}; }
  bool reduce_scatter(int64_t u) const { return u < rs_units_; }
  // The owner's last fold (reduce-scatter step N-2): where an average divides.
  bool last_reduce_step(int64_t u) const { return u < rs_units_ && u / chunks_ == size_ - 2; }
  // The longest segment, and a bound on every chunk's length (a multiple of align).
  int64_t max_segment() const { return max_segment_; }
  int64_t max_chunk_elems() const { return (max_segment_ / align_ + chunks_ - 1) / chunks_ * align_; }

  int64_t segment_begin(int s) const {  // s in [0, size]; U*s/N without the overflow of U*s
    const int64_t units = (numel_ + align_ - 1) / align_;
    return std::min(numel_, (units / size_ * s + units % size_ * s / size_) * align_);
  }
  std::pair<int64_t, int64_t> chunk(int s, int64_t j) const {
    const int64_t b = segment_begin(s), e = segment_begin(s + 1);
    const int64_t units = (e - b + align_ - 1) / align_;
    return {std::min(e, b + units * j / chunks_ * align_), std::min(e, b + units * (j + 1) / chunks_ * align_)};
  }
  // Unit u sends send_range(u) to the right and receives recv_range(u) from the left.
  std::pair<int64_t, int64_t> send_range(int64_t u) const {
    const bool rs = u < rs_units_;
    const int64_t k = (rs ? u : u - rs_units_) / chunks_;
    return chunk(rs ? wrap(rank_ - k) : wrap(rank_ + 1 - k), u % chunks_);
  }
  std::pair<int64_t, int64_t> recv_range(int64_t u) const {
    const bool rs = u < rs_units_;
    const int64_t k = (rs ? u : u - rs_units_) / chunks_;
    return chunk(rs ? wrap(rank_ - k - 1) : wrap(rank_ - k), u % chunks_);
  }

 private:
  int wrap(int64_t v) const { return static_cast<int>(((v % size_) + size_) % size_); }

  int size_, rank_;
  int64_t numel_, align_;
  int64_t max_segment_ = 0, chunks_ = 1, rs_units_ = 0;
};

}  // namespace gradcomm::detail
