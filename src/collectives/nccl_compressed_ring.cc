// Compressed ring allreduce on device memory over NCCL, stream-ordered: the CPU
// algorithm of compressed_ring.cc with the GPU codecs, and its bytes.
//
// Reduce-scatter step k = 0..N-2: rank r sends the encoded partial sum of segment
// r-k, receives the left neighbour's (segment r-k-1), decodes it onto its own
// values and re-encodes the sum for the next step. After N-1 steps rank r holds
// the whole sum of segment r+1: it encodes it once (the final encode, whose
// decoded values replace its own, so the owner keeps what everyone decodes) and
// those exact bytes travel the allgather ring, each rank decoding and forwarding
// them unchanged. Segments are the CPU ring's (compressed_ring_plan.h), so the
// partial sums are formed in the same order with the same arithmetic: the result
// equals the CPU path's bit for bit.
//
// Streams. NCCL groups run on the caller's stream, one group per unit {send
// unit u, receive unit u}; encodes and decodes run on the context's side stream:
//   side:    encode u -> record ready[u]          (u < encoded_units)
//   caller:  wait ready[u] -> group u -> record `received`
//   side:    wait `received` -> decode u -> encode u + C (reduce-scatter)
// so the encode of chunk j+1 runs while chunk j is on the wire, and nothing in the
// loop waits on the host (payload sizes are fixed: encoded_bytes). Only the side
// stream touches the tensor; the caller's stream finally waits for its last work.
// Every unit has its own payload region (the plan), so no buffer is reused within
// a call and consecutive calls are ordered by GpuContext::begin/end.
#include <algorithm>
#include <array>

#include "collectives/nccl_compressed.h"
#include "collectives/compressed_ring_plan.h"

namespace gradcomm::detail {
namespace {

// Preferred chunk in input elements (one NCCL group each), and at most this many
// chunks per segment: big enough that the group launch (microseconds) is amortized.
constexpr int64_t kChunkElems = int64_t{1} << 20;
constexpr int kMaxChunks = 8;

}  // namespace

void nccl_compressed_ring(Op& op, GpuContext& gpu, float* data, int64_t numel, const GpuDenseCodec& codec,
                          const PhiloxStream& rng, float* residual, DeviceStatus* status, cudaStream_t stream) {
  const int n = op.size();
  const int r = op.rank();
  const int right = (r + 1) % n;
  const int left = (r + n - 1) % n;
  NcclComm& nccl = *gpu.nccl();

  // ---- plan and cached resources -------------------------------------------------------
  const CompressedRingPlan plan(n, r, numel, codec.alignment(), kChunkElems, kMaxChunks,
                                [&](int64_t m) { return codec.encoded_bytes(m); });
  const int64_t C = plan.chunks();
  uint8_t* base = gpu.payload_scratch(plan.buffer_bytes()).as<uint8_t>();
  const int64_t encoded = plan.encoded_units();
  std::vector<Event>& events = gpu.events(static_cast<size_t>(encoded) + 2);
  Event& received = events[encoded];  // re-recorded every unit: its wait is enqueued at once
  Event& side_done = events[encoded + 1];
  const cudaStream_t side = gpu.side_stream();

  // The side stream starts where the caller's stream is (the input, the EF fold).
  Event& entry = gpu.entry_event();
  entry.record(stream);
  entry.wait_on(side);

  // Encodes unit u's send range into its payload region (side stream). Every encode
  // adds its loss to the residual; the final encode also writes the decoded values
  // over the owner's own (EncodeFeedback::decoded may equal the input).
  auto encode = [&](int64_t u) {
    const auto [b, e] = plan.send_range(u);
    EncodeFeedback feedback;
    feedback.residual = residual != nullptr ? residual + b : nullptr;
    feedback.mode = ResidualMode::kAccumulate;
    feedback.decoded = plan.final_encode(u) ? data + b : nullptr;
    codec.encode(data + b, e - b, base + plan.send_offset(u), rng, b, feedback, side);
    events[u].record(side);
  };

  // ---- run -------------------------------------------------------------------------------
  uint64_t sent = 0, got = 0;
  for (int64_t j = 0; j < C; ++j) encode(j);  // step 0: our own segment
  for (int64_t u = 0; u < plan.units(); ++u) {
    const bool rs = plan.reduce_scatter(u);
    // A forwarded payload (u >= encoded) arrived in group u - C, earlier on this stream.
    if (u < encoded) events[u].wait_on(stream);
    const std::array<P2pOp, 2> ops{
        P2pOp{P2pOp::kSend, right, base + plan.send_offset(u), plan.send_bytes(u)},
        P2pOp{P2pOp::kRecv, left, base + plan.recv_offset(u), plan.recv_bytes(u)}};
    nccl.group(ops, stream, rs ? "compressed ring: reduce-scatter step" : "compressed ring: allgather step");
    sent += plan.send_bytes(u);
    got += plan.recv_bytes(u);
    received.record(stream);
    received.wait_on(side);
    // recvReduceSend: the neighbour's partial sum onto ours, then on to the right;
    // allgather: the owner's final bytes replace our values (recvCopySend).
    const auto [b, e] = plan.recv_range(u);
    codec.decode(base + plan.recv_offset(u), plan.recv_bytes(u), e - b, data + b, /*add=*/rs, status + left, side);
    if (rs) encode(u + C);
  }
  side_done.record(side);
  side_done.wait_on(stream);
  op.count_wire(sent, got, static_cast<uint64_t>(plan.units()));
}

}  // namespace gradcomm::detail
