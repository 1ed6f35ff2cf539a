// The collectives on CUDA tensors (CUDA builds only), one algorithm a file:
//   nccl_ring_allreduce.cc  dense ring allreduce, stream-ordered over NCCL
//   nccl_allgather.cc       ring allgather over NCCL
//   nccl_broadcast.cc       pipelined chain broadcast over NCCL
//   nccl_two_level.cc       the levels inside the nodes over NCCL (two levels, hierarchy.h)
//   staging.cc              the UCX path: device <-> pinned host copies around the
//                           host algorithms (chunked and overlapped for dense allreduce)
// Each runs inside the call's Op, after the call headers matched (the caller runs
// Op::finish() first, so nothing is enqueued for a call a peer did not make), with
// the context's device current. The NCCL ones only enqueue: they return before
// the GPU has done anything. The staging ones drive the host transport, so they
// return once the last host-to-device copy is enqueued.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

#include "op.h"
#include "gpu_context.h"
#include "gradcomm/types.h"

namespace gradcomm::detail {

// In place; any N (N = 1: only kAvg's divide by one, i.e. nothing), any numel.
// Every rank ends with the same bytes: the owner of a segment reduces it last
// (dividing for kAvg) and that exact segment travels the allgather ring.
void nccl_ring_allreduce(Op& op, GpuContext& gpu, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                         cudaStream_t stream);
// `in` (bytes_per_rank) to out[rank * bytes_per_rank], then the ring.
void nccl_allgather(Op& op, GpuContext& gpu, const void* in, void* out, int64_t bytes_per_rank, cudaStream_t stream);
void nccl_broadcast(Op& op, GpuContext& gpu, void* data, int64_t bytes, int root, cudaStream_t stream);

// Two levels (hierarchy.h) over NCCL: inside each node a direct reduce-scatter (each rank's
// copy of segment l to local rank l, summed there in local-rank order; kSum for kAvg), then
// `across(plan)` on this rank's segment, then an allgather inside the node; the plan's segments
// start at multiples of `align`. `across` must leave the segment's final values (divided for
// kAvg) on the device, ordered on `stream`.
struct TwoLevelPlan;
void nccl_two_level_allreduce(Op& op, GpuContext& gpu, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                              int64_t align, cudaStream_t stream,
                              const std::function<void(const TwoLevelPlan&)>& across);
// The dense call: across, each piece by the NCCL ring in a View of its owners, divided by
// the world size for kAvg.
void nccl_two_level_dense_allreduce(Op& op, GpuContext& gpu, void* data, int64_t numel, DType dtype,
                                    ReduceOp reduce_op, cudaStream_t stream);

// Dense allreduce through pinned host memory and the host ring (dense_allreduce),
// in chunks of GRADCOMM_STAGING_CHUNK_BYTES: the copy down of chunk i+1 and the
// copy up of chunk i-1 overlap the network work on chunk i.
void staged_dense_allreduce(Op& op, GpuContext& gpu, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                            cudaStream_t stream);

// Whole-buffer staging for everything else: copies `down_bytes` from `down_src`
// (device) to host offset `down_offset` of a pinned buffer of `host_bytes`, runs
// `body` on the host buffer, then copies `up_bytes` from host offset `up_offset`
// back to `up_dst` (device). Either copy may be zero bytes.
struct StagedCopy {
  const void* down_src = nullptr;
  int64_t down_bytes = 0, down_offset = 0;
  void* up_dst = nullptr;
  int64_t up_bytes = 0, up_offset = 0;
  int64_t host_bytes = 0;

  // `bytes` at `data` down, worked on in place, and back up.
  static StagedCopy round_trip(void* data, int64_t bytes) {
    StagedCopy copy;
    copy.down_src = data;
    copy.down_bytes = bytes;
    copy.up_dst = data;
    copy.up_bytes = bytes;
    copy.host_bytes = bytes;
    return copy;
  }
};
void staged_call(Op& op, GpuContext& gpu, const StagedCopy& copy, cudaStream_t stream,
                 const std::function<void(uint8_t* host)>& body);

}  // namespace gradcomm::detail
