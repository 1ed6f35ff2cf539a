// Pipelined chain broadcast on device memory over NCCL, stream-ordered.
//
// The chain follows the ring from the root (root, root+1, ..., root-1), as the
// host chain_broadcast does. The buffer is cut into C chunks; the rank at chain
// position p runs C+1 groups, group t = {receive chunk t from the left (t < C),
// send chunk t-1 to the right (t >= 1)}: a chunk moves on one group after it
// arrived, so the chain holds up to N-1 chunks in flight and the time is about
// (N-1+C) chunk transfers, not (N-1)·C. The root sends chunk t in group t; the
// end of the chain only receives. Every send's receiver reaches the matching
// group while the sender is in it, so the chain cannot deadlock.
#include <algorithm>
#include <array>

#include "collectives/gpu_collectives.h"
#include "env.h"

namespace gradcomm::detail {

void nccl_broadcast(Op& op, GpuContext& gpu, void* data, int64_t bytes, int root, cudaStream_t stream) {
  const int n = op.size();
  const int r = op.rank();
  if (n == 1 || bytes == 0) return;
  const int position = (r - root + n) % n;
  const bool receives = position > 0;
  const bool forwards = position < n - 1;
  auto* base = static_cast<uint8_t*>(data);
  // Same knob as the ring: one NCCL launch per chunk and hop.
  const int64_t chunk = env_bytes("GRADCOMM_NCCL_CHUNK_BYTES", int64_t{4} << 20, 256, int64_t{1} << 30);
  const int64_t C = std::clamp<int64_t>((bytes + chunk - 1) / chunk, 1, 16);
  auto range = [&](int64_t j) {
    const int64_t b = bytes * j / C;
    return std::pair<uint8_t*, size_t>(base + b, static_cast<size_t>(bytes * (j + 1) / C - b));
  };
  uint64_t sent = 0, got = 0;
  for (int64_t t = 0; t <= C; ++t) {
    std::array<P2pOp, 2> ops{};
    size_t count = 0;
    if (receives && t < C) {
      const auto [at, len] = range(t);
      ops[count++] = P2pOp{P2pOp::kRecv, (r + n - 1) % n, at, len};
      got += len;
    }
    // The root has chunk t already; the others forward what arrived one group ago.
    const int64_t forward = position == 0 ? t : t - 1;
    if (forwards && forward >= 0 && forward < C) {
      const auto [at, len] = range(forward);
      ops[count++] = P2pOp{P2pOp::kSend, (r + 1) % n, at, len};
      sent += len;
    }
    if (count > 0) gpu.nccl()->group(std::span(ops.data(), count), stream, "chain broadcast step");
  }
  op.count_wire(sent, got, forwards ? static_cast<uint64_t>(C) : 0);
}

}  // namespace gradcomm::detail
