// Ring allgather of variable-size byte blocks on device memory over NCCL (the
// sparse allgather of top-k payloads), stream-ordered.
//
// Step k = 0..N-2: send block r-k to r+1 and receive block r-k-1 from r-1 into its
// place (ring_allgather.cc's schedule). The sizes are known to every rank before
// the call (exact top-k: a fixed count; select=sample: exchanged over the host
// transport first), so each group posts exactly the bytes that travel. Zero-byte
// blocks are skipped by NcclComm::group.
#include <array>

#include "collectives/nccl_compressed.h"

namespace gradcomm::detail {

void nccl_allgatherv_blocks(Op& op, GpuContext& gpu, uint8_t* base, const std::vector<size_t>& offsets,
                            const std::vector<size_t>& sizes, cudaStream_t stream) {
  const int n = op.size();
  const int r = op.rank();
  if (n == 1) return;
  auto block = [&](int s) { return static_cast<size_t>((s % n + n) % n); };
  uint64_t sent = 0, got = 0;
  for (int k = 0; k < n - 1; ++k) {
    const size_t out = block(r - k), in = block(r - k - 1);
    const std::array<P2pOp, 2> ops{P2pOp{P2pOp::kSend, (r + 1) % n, base + offsets[out], sizes[out]},
                                   P2pOp{P2pOp::kRecv, (r + n - 1) % n, base + offsets[in], sizes[in]}};
    gpu.nccl()->group(ops, stream, "sparse allgather step");
    sent += sizes[out];
    got += sizes[in];
  }
  op.count_wire(sent, got, static_cast<uint64_t>(n - 1));
}

}  // namespace gradcomm::detail
