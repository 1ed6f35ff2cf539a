// The UCX path for CUDA tensors: device memory staged through pinned host memory
// around the host algorithms, for jobs where NCCL cannot run (two ranks on one
// GPU, transport=ucx, mixed setups).
//
// Dense allreduce is chunked (staging_chunks(), GRADCOMM_STAGING_CHUNK_BYTES) over
// kStagingSlots pinned slots; chunk c lives in slot c mod 3:
//   copy stream:    wait entry; D2H 0 | wait up[c-2]; D2H c+1 -> record down[c+1]
//   host:           wait down[c]; dense_allreduce(slot c) over UCX
//   caller stream:  H2D c -> record up[c]
// While the host moves chunk c over the network, chunk c+1 is being copied down
// and chunk c-1 up. Slot reuse is ordered on the device (the D2H into a slot waits
// for the H2D that last read it), so the host only ever waits for "chunk c is
// down". Each chunk is its own host allreduce with the call's message units;
// successive chunks may reuse them because the transport matches messages of one
// peer and tag in order, and a rank finishes chunk c before it sends for c+1.
//
// Everything else (allgather, broadcast, the compressors through the CPU path)
// is staged whole: one copy down, the host algorithm, one copy up.
#include <fmt/format.h>

#include <algorithm>

#include "collectives/collectives.h"
#include "collectives/gpu_collectives.h"
#include "cuda/check.h"
#include "env.h"

namespace gradcomm::detail {
namespace {

// GRADCOMM_STAGING_CHUNK_BYTES: chunk of the staged dense allreduce. Large enough
// that the host ring pipelines inside it, small enough that three copies overlap.
int64_t staging_chunk_bytes() {
  return env_bytes("GRADCOMM_STAGING_CHUNK_BYTES", int64_t{4} << 20, 4096, int64_t{1} << 32);
}

}  // namespace

void staged_dense_allreduce(Op& op, GpuContext& gpu, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                            cudaStream_t stream) {
  // One rank: the sum is the input, and an average divides by one.
  if (numel == 0 || op.size() == 1) return;
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  const auto chunks = staging_chunks(numel, elem, staging_chunk_bytes());
  const size_t slot_bytes = static_cast<size_t>(chunks[0].second - chunks[0].first) * elem;
  const int slots = static_cast<int>(std::min<size_t>(kStagingSlots, chunks.size()));
  auto* pinned = gpu.pinned(slot_bytes * slots).as<uint8_t>();
  std::vector<Event>& events = gpu.events(2 * kStagingSlots);
  auto down = [&](size_t c) -> Event& { return events[c % kStagingSlots]; };
  auto up = [&](size_t c) -> Event& { return events[kStagingSlots + c % kStagingSlots]; };
  auto slot = [&](size_t c) { return pinned + (c % kStagingSlots) * slot_bytes; };
  auto* base = static_cast<uint8_t*>(data);
  const cudaStream_t copy = gpu.copy_stream();

  // The copies down start after the caller's earlier work on its stream.
  gpu.entry_event().record(stream);
  gpu.entry_event().wait_on(copy);
  auto copy_down = [&](size_t c) {
    if (c >= kStagingSlots) up(c - kStagingSlots).wait_on(copy);  // the slot's last copy up has read it
    const auto [b, e] = chunks[c];
    GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(slot(c), base + b * elem, static_cast<size_t>(e - b) * elem,
                                        cudaMemcpyDeviceToHost, copy));
    down(c).record(copy);
  };

  copy_down(0);
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (c + 1 < chunks.size()) copy_down(c + 1);
    gpu.wait_event(down(c).get(), Deadline::after(gpu.timeout()), "staging: copy to host");
    const auto [b, e] = chunks[c];
    dense_allreduce(op, slot(c), e - b, dtype, reduce_op);
    GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(base + b * elem, slot(c), static_cast<size_t>(e - b) * elem,
                                        cudaMemcpyHostToDevice, stream));
    up(c).record(stream);
  }
}

void staged_call(Op& op, GpuContext& gpu, const StagedCopy& copy, cudaStream_t stream,
                 const std::function<void(uint8_t* host)>& body) {
  (void)op;
  auto* host = gpu.pinned(static_cast<size_t>(copy.host_bytes)).as<uint8_t>();
  if (copy.down_bytes > 0) {
    GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(host + copy.down_offset, copy.down_src, static_cast<size_t>(copy.down_bytes),
                                        cudaMemcpyDeviceToHost, stream));
  }
  // Always waited for, even with nothing copied: the host may write the pinned
  // buffer only once the previous call's copy up (earlier on the stream) has read it.
  gpu.entry_event().record(stream);
  gpu.wait_event(gpu.entry_event().get(), Deadline::after(gpu.timeout()), "staging: copy to host");
  body(host);
  if (copy.up_bytes > 0) {
    GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(copy.up_dst, host + copy.up_offset, static_cast<size_t>(copy.up_bytes),
                                        cudaMemcpyHostToDevice, stream));
  }
}

}  // namespace gradcomm::detail
