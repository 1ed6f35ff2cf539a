// Ring allgather of variable-size byte blocks on device memory over NCCL (the
// sparse allgather of top-k payloads), stream-ordered.
//
// Step k = 0..N-2: send block r-k to r+1 and receive block r-k-1 from r-1 into its
// place: the ring driver with the allgather's forward steps (allgather_steps.h). The sizes are known to every rank before
// the call (exact top-k: a fixed count; select=sample: exchanged over the host
// transport first), so each group posts exactly the bytes that travel. Zero-byte
// blocks are skipped by NcclComm::group.
#include <array>

#include "collectives/allgather_steps.h"
#include "collectives/nccl_compressed.h"
#include "collectives/nccl_ring_channel.h"

namespace gradcomm::detail {

void nccl_allgatherv_blocks(Op& op, GpuContext& gpu, uint8_t* base, const std::vector<size_t>& offsets,
                            const std::vector<size_t>& sizes, cudaStream_t stream) {
  const int n = op.size();
  const int r = op.rank();
  if (n == 1) return;
  // One chunk a block: one NCCL group per step (zero-byte blocks are skipped by NcclComm::group).
  AllgatherSteps steps(base, std::vector<int64_t>(offsets.begin(), offsets.end()),
                       std::vector<int64_t>(sizes.begin(), sizes.end()), 1, r, n, 1);
  NcclRingStreams streams(op, gpu, stream, 0, "sparse allgather step", "sparse allgather step");
  StreamRingChannel<NcclRingStreams> channel(streams, steps.shape(), 0, /*side_work=*/false);
  drive_ring(steps.shape(), steps.units(), channel, steps);
}

}  // namespace gradcomm::detail
