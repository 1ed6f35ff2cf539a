// Ring allgather on device memory over NCCL, stream-ordered.
//
// Step k = 0..N-2: send block r-k to r+1 and receive block r-k-1 from r-1,
// straight into its place in the output: the ring driver with the allgather's forward
// steps (allgather_steps.h) over the stream channel. One NCCL group per step on the
// caller's stream: the steps depend on each other (a block received at step k is sent
// at step k+1), and with nothing to compute between them, cutting a step into chunks
// on one stream would only add launches; no side stream is involved.
#include <array>

#include "collectives/allgather_steps.h"
#include "collectives/gpu_collectives.h"
#include "collectives/nccl_ring_channel.h"
#include "cuda/check.h"

namespace gradcomm::detail {

void nccl_allgather(Op& op, GpuContext& gpu, const void* in, void* out, int64_t bytes_per_rank, cudaStream_t stream) {
  const int n = op.size();
  const int r = op.rank();
  if (bytes_per_rank == 0) return;
  auto* base = static_cast<uint8_t*>(out);
  uint8_t* mine = base + static_cast<int64_t>(r) * bytes_per_rank;
  if (mine != in) {
    GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(mine, in, static_cast<size_t>(bytes_per_rank), cudaMemcpyDeviceToDevice,
                                        stream));
  }
  if (n == 1) return;
  // Blocks of bytes_per_rank bytes, one chunk each: one NCCL group per step.
  std::vector<int64_t> offsets(n);
  for (int s = 0; s < n; ++s) offsets[s] = s * bytes_per_rank;
  AllgatherSteps steps(base, std::move(offsets), std::vector<int64_t>(n, bytes_per_rank), 1, r, n, 1);
  NcclRingStreams streams(op, gpu, stream, 0, "ring allgather step", "ring allgather step");
  StreamRingChannel<NcclRingStreams> channel(streams, steps.shape(), 0, /*side_work=*/false);
  drive_ring(steps.shape(), steps.units(), channel, steps);
}

}  // namespace gradcomm::detail
