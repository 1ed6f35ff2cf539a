// Dense ring allreduce on device memory over NCCL, stream-ordered: the ring driver
// (ring_driver.h) over the host ring's schedule (ring_allreduce.cc), with the stream
// channel (stream_ring_channel.h: one NCCL group per unit on the caller's stream, step
// work on a side stream, events between them) and the sum and forward steps below.
// Nothing in the loop waits on the host.
//
// A reduce-scatter receive lands in one of kSlots scratch slots and is folded into the
// data by a reduce kernel on the side stream (cuda/reduce.cuh; fp16/bf16 summed in fp32
// per hop, as on the CPU), while the next chunk is on the wire. An allgather receive
// lands in place.
//
// Determinism. The owner's last fold of a segment divides for kAvg, and the
// allgather then carries those exact bytes: every rank ends bitwise identical
// (and identical to the host ring, which uses the same element arithmetic).
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "collectives/gpu_collectives.h"
#include "collectives/nccl_ring_channel.h"
#include "collectives/ring_driver.h"
#include "collectives/ring_schedule.h"
#include "cuda/reduce.cuh"
#include "env.h"

namespace gradcomm::detail {
namespace {

// GRADCOMM_NCCL_CHUNK_BYTES: pipeline chunk of the NCCL ring. Each chunk costs
// one NCCL group launch (a few microseconds), so chunks are larger than the
// host ring's; at most kMaxChunks per segment (huge tensors get bigger chunks).
int64_t nccl_chunk_bytes() {
  return env_bytes("GRADCOMM_NCCL_CHUNK_BYTES", int64_t{4} << 20, 256, int64_t{1} << 30);
}
constexpr int kMaxChunks = 16;
constexpr int kSlots = 4;  // scratch slots: receives in flight ahead of the reduce

// The dense ring's steps on the device: sum through the reduce-scatter (a reduce kernel
// on the side stream folds the slot a unit landed in), forward through the allgather
// (the chunk lands in place and goes on from there).
class NcclSumSteps {
 public:
  NcclSumSteps(const RingSchedule& ring, GpuContext& gpu, uint8_t* data, DType dtype, ReduceOp reduce_op,
               cudaStream_t side)
      : ring_(ring), base_(data), dtype_(dtype), reduce_op_(reduce_op), elem_(dtype_size(dtype)),
        divisor_(reduce_op == ReduceOp::kAvg ? ring.size() : 1),
        slot_bytes_(static_cast<size_t>(ring.max_chunk_elems()) * elem_),
        scratch_(gpu.scratch(slot_bytes_ * kSlots).as<uint8_t>()), side_(side) {}

  RingMessage send_message(int64_t u) const { return range(ring_.send_range(u)); }
  RingMessage recv_message(int64_t u) const {
    if (!ring_.reduce_scatter(u)) return range(ring_.recv_range(u));
    const auto [b, e] = ring_.recv_range(u);
    return {slot(u), static_cast<size_t>(e - b) * elem_};
  }
  int64_t recv_overwrites(int64_t) const { return -1; }  // stream order: the send that read it went first
  int64_t recv_reuses(int64_t u) const { return ring_.reduce_scatter(u) && u >= kSlots ? u - kSlots : -1; }
  bool absorbs(int64_t u) const { return ring_.reduce_scatter(u); }

  void prepare(int64_t) {}
  void absorb(int64_t u) {
    if (!ring_.reduce_scatter(u)) return;
    // sum: the neighbour's partial sum into ours; the owner's last fold also divides an average.
    const auto [b, e] = ring_.recv_range(u);
    launch_reduce_inplace(base_ + b * elem_, slot(u), e - b, dtype_, reduce_op_,
                          ring_.last_reduce_step(u) ? divisor_ : 1, side_);
  }

 private:
  uint8_t* slot(int64_t u) const { return scratch_ + static_cast<size_t>(u % kSlots) * slot_bytes_; }
  RingMessage range(std::pair<int64_t, int64_t> r) const {
    return {base_ + r.first * elem_, static_cast<size_t>(r.second - r.first) * elem_};
  }

  const RingSchedule& ring_;
  uint8_t* base_;
  DType dtype_;
  ReduceOp reduce_op_;
  size_t elem_;
  int64_t divisor_;
  size_t slot_bytes_;
  uint8_t* scratch_;
  cudaStream_t side_;
};

}  // namespace

void nccl_ring_allreduce(Op& op, GpuContext& gpu, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                         cudaStream_t stream) {
  const int n = op.size();
  if (n == 1 || numel == 0) return;  // one rank: the sum is the input, the average divides by one
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  const RingSchedule ring(n, op.rank(), numel, /*align=*/1, std::max<int64_t>(1, nccl_chunk_bytes() / elem),
                          kMaxChunks);
  NcclRingStreams streams(op, gpu, stream, StreamRingChannel<NcclRingStreams>::events_needed(ring.shape(), kSlots),
                          "ring allreduce: reduce-scatter step", "ring allreduce: allgather step");
  NcclSumSteps steps(ring, gpu, static_cast<uint8_t*>(data), dtype, reduce_op, streams.side());
  StreamRingChannel<NcclRingStreams> channel(streams, ring.shape(), kSlots);
  drive_ring(ring.shape(), ring.units(), channel, steps);
}

}  // namespace gradcomm::detail
