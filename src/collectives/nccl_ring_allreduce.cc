// Dense ring allreduce on device memory over NCCL, stream-ordered.
//
// The schedule is the host ring's (ring_allreduce.cc: reduce-scatter then
// allgather over N segments, each cut into C chunks; unit u = step * C + chunk),
// laid out by GpuRingPlan (gpu_plan.h) and executed here as one NCCL group per
// unit on the caller's stream: {send this unit's chunk right, receive the left
// neighbour's chunk}. Nothing in the loop waits on the host.
//
// Overlap. A reduce-scatter receive lands in a scratch slot and is folded into
// the data by a reduce kernel on a side stream (cuda/reduce.cuh; fp16/bf16 summed
// in fp32 per hop, as on the CPU). Events chain the two streams:
//   caller stream:  group u  -> record `received`
//   side stream:    wait `received` -> reduce u -> record done[u mod E]
//   caller stream:  wait done[u - C] before group u (it sends what u - C reduced),
//                   wait done[u - S] before group u (it refills u - S's slot)
// so the reduce of chunk j runs on the side stream while chunk j+1 is on the
// wire. Every reduce feeds a later send, so the caller's stream ends after all of
// them: the next work on that stream sees the finished result.
//
// Determinism. The owner's last fold of a segment divides for kAvg, and the
// allgather then carries those exact bytes: every rank ends bitwise identical
// (and identical to the host ring, which uses the same element arithmetic).
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "collectives/gpu_collectives.h"
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

}  // namespace

void nccl_ring_allreduce(Op& op, GpuContext& gpu, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                         cudaStream_t stream) {
  const int n = op.size();
  const int r = op.rank();
  if (n == 1 || numel == 0) return;  // one rank: the sum is the input, the average divides by one
  NcclComm& nccl = *gpu.nccl();
  const int right = (r + 1) % n;
  const int left = (r + n - 1) % n;
  const size_t elem = dtype_size(dtype);
  auto* base = static_cast<uint8_t*>(data);
  const int64_t divisor = reduce_op == ReduceOp::kAvg ? n : 1;

  // ---- plan and cached resources -----------------------------------------------------
  const GpuRingPlan plan(n, r, numel, std::max<int64_t>(1, nccl_chunk_bytes() / static_cast<int64_t>(elem)),
                         kMaxChunks, kSlots);
  const size_t slot_bytes = static_cast<size_t>(plan.slot_elems()) * elem;
  auto* scratch = gpu.scratch(slot_bytes * plan.slots()).as<uint8_t>();
  const int event_slots = plan.event_slots();
  std::vector<Event>& events = gpu.events(event_slots + 1);
  Event& received = events[event_slots];  // re-recorded every unit: its wait is enqueued at once
  const cudaStream_t side = gpu.side_stream();

  // ---- run -------------------------------------------------------------------------------
  uint64_t sent = 0, got = 0;
  for (int64_t u = 0; u < plan.units(); ++u) {
    const RingUnit x = plan.unit(u);
    if (x.send_waits_for >= 0) events[x.send_waits_for % event_slots].wait_on(stream);
    if (x.slot_waits_for >= 0) events[x.slot_waits_for % event_slots].wait_on(stream);
    uint8_t* target = x.reduce ? scratch + static_cast<size_t>(x.slot) * slot_bytes : base + x.recv_begin * elem;
    const size_t send_bytes = static_cast<size_t>(x.send_end - x.send_begin) * elem;
    const size_t recv_bytes = static_cast<size_t>(x.recv_end - x.recv_begin) * elem;
    const std::array<P2pOp, 2> ops{P2pOp{P2pOp::kSend, right, base + x.send_begin * elem, send_bytes},
                                   P2pOp{P2pOp::kRecv, left, target, recv_bytes}};
    nccl.group(ops, stream, x.reduce ? "ring allreduce: reduce-scatter step" : "ring allreduce: allgather step");
    sent += send_bytes;
    got += recv_bytes;
    if (x.reduce) {
      // recvReduceSend: fold the neighbour's partial sum into ours on the side
      // stream; the owner's last fold also divides an average.
      received.record(stream);
      received.wait_on(side);
      launch_reduce_inplace(base + x.recv_begin * elem, target, x.recv_end - x.recv_begin, dtype, reduce_op,
                            x.last_step ? divisor : 1, side);
      events[x.event_slot].record(side);
    }
  }
  op.count_wire(sent, got, static_cast<uint64_t>(plan.units()));
}

}  // namespace gradcomm::detail
