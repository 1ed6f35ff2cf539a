// Ring allgather on device memory over NCCL, stream-ordered.
//
// Step k = 0..N-2: send block r-k to r+1 and receive block r-k-1 from r-1,
// straight into its place in the output (ring_allgather.cc's schedule). One NCCL
// group per step on the caller's stream: the steps depend on each other (a block
// received at step k is sent at step k+1), and with nothing to compute between
// them, cutting a step into chunks on one stream would only add launches.
#include <array>

#include "collectives/gpu_collectives.h"
#include "cuda/check.h"

namespace gradcomm::detail {

void nccl_allgather(Op& op, GpuContext& gpu, const void* in, void* out, int64_t bytes_per_rank, cudaStream_t stream) {
  const int n = op.size();
  const int r = op.rank();
  if (bytes_per_rank == 0) return;
  auto* base = static_cast<uint8_t*>(out);
  auto block = [&](int s) { return base + static_cast<int64_t>((s % n + n) % n) * bytes_per_rank; };
  if (block(r) != in) {
    GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(block(r), in, static_cast<size_t>(bytes_per_rank), cudaMemcpyDeviceToDevice,
                                        stream));
  }
  if (n == 1) return;
  const size_t bytes = static_cast<size_t>(bytes_per_rank);
  for (int k = 0; k < n - 1; ++k) {
    const std::array<P2pOp, 2> ops{P2pOp{P2pOp::kSend, (r + 1) % n, block(r - k), bytes},
                                   P2pOp{P2pOp::kRecv, (r + n - 1) % n, block(r - k - 1), bytes}};
    gpu.nccl()->group(ops, stream, "ring allgather step");
  }
  op.count_wire(bytes * (n - 1), bytes * (n - 1), static_cast<uint64_t>(n - 1));
}

}  // namespace gradcomm::detail
