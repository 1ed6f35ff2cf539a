// Compressed ring allreduce on device memory over NCCL, stream-ordered: the CPU
// algorithm of compressed_ring.cc with the GPU codecs, and its bytes. The ring driver
// (ring_driver.h) with the stream channel (stream_ring_channel.h: one NCCL group per
// unit on the caller's stream, every encode and decode on the side stream) and the
// decode-add-re-encode and forward steps below.
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
// Payload sizes are fixed (encoded_bytes), so nothing in the loop waits on the host.
// Only the side stream touches the tensor; the caller's stream finally waits for its
// last work. Every unit has its own payload region (the plan), so no buffer is reused
// within a call and consecutive calls are ordered by GpuContext::begin/end.
#include <algorithm>
#include <array>

#include "collectives/compressed_ring_plan.h"
#include "collectives/nccl_compressed.h"
#include "collectives/nccl_ring_channel.h"
#include "collectives/ring_driver.h"

namespace gradcomm::detail {
namespace {

// Preferred chunk in input elements (one NCCL group each), and at most this many
// chunks per segment: big enough that the group launch (microseconds) is amortized.
constexpr int64_t kChunkElems = int64_t{1} << 20;
constexpr int kMaxChunks = 8;

// The compressed ring's steps on the device: decode-add-re-encode through the
// reduce-scatter, forward (decode, pass the payload on unchanged) through the allgather,
// every codec call on the side stream. Payload regions are the plan's, as on the host.
class NcclCodecSteps {
 public:
  NcclCodecSteps(const CompressedRingPlan& plan, uint8_t* payloads, float* data, const GpuDenseCodec& codec,
                 const PhiloxStream& rng, float* residual, DeviceStatus* left_status, cudaStream_t side)
      : plan_(plan), base_(payloads), data_(data), codec_(codec), rng_(rng), residual_(residual),
        left_status_(left_status), side_(side) {}

  RingMessage send_message(int64_t u) const { return {base_ + plan_.send_offset(u), plan_.send_bytes(u)}; }
  RingMessage recv_message(int64_t u) const { return {base_ + plan_.recv_offset(u), plan_.recv_bytes(u)}; }
  int64_t recv_overwrites(int64_t) const { return -1; }
  int64_t recv_reuses(int64_t) const { return -1; }
  bool absorbs(int64_t) const { return true; }

  // Every encode adds its loss to the residual; the owner's final encode also writes the
  // decoded values over its own (EncodeFeedback::decoded may equal the input).
  void prepare(int64_t u) {
    if (u >= plan_.encoded_units()) return;  // forward: the received payload goes on unchanged
    const auto [b, e] = plan_.send_range(u);
    EncodeFeedback feedback;
    feedback.residual = residual_ != nullptr ? residual_ + b : nullptr;
    feedback.mode = ResidualMode::kAccumulate;
    feedback.decoded = plan_.final_encode(u) ? data_ + b : nullptr;
    codec_.encode(data_ + b, e - b, base_ + plan_.send_offset(u), rng_, b, feedback, side_);
  }
  // Reduce-scatter: the neighbour's partial sum onto ours (prepare(u + C) re-encodes it);
  // allgather: the owner's final bytes replace our values.
  void absorb(int64_t u) {
    const auto [b, e] = plan_.recv_range(u);
    const bool rs = plan_.reduce_scatter(u);
    codec_.decode(base_ + plan_.recv_offset(u), plan_.recv_bytes(u), e - b, data_ + b, /*add=*/rs, left_status_,
                  side_);
  }

 private:
  const CompressedRingPlan& plan_;
  uint8_t* base_;
  float* data_;
  const GpuDenseCodec& codec_;
  const PhiloxStream& rng_;
  float* residual_;
  DeviceStatus* left_status_;
  cudaStream_t side_;
};

}  // namespace

void nccl_compressed_ring(Op& op, GpuContext& gpu, float* data, int64_t numel, const GpuDenseCodec& codec,
                          const PhiloxStream& rng, float* residual, DeviceStatus* status, cudaStream_t stream) {
  const int n = op.size();
  const int left = (op.rank() + n - 1) % n;
  const CompressedRingPlan plan(n, op.rank(), numel, codec.alignment(), kChunkElems, kMaxChunks,
                                [&](int64_t m) { return codec.encoded_bytes(m); });
  const RingSchedule& ring = plan.schedule();
  NcclRingStreams streams(op, gpu, stream, StreamRingChannel<NcclRingStreams>::events_needed(ring.shape(), 0),
                          "compressed ring: reduce-scatter step", "compressed ring: allgather step");
  NcclCodecSteps steps(plan, gpu.payload_scratch(plan.buffer_bytes()).as<uint8_t>(), data, codec, rng, residual,
                       status + left, streams.side());
  StreamRingChannel<NcclRingStreams> channel(streams, ring.shape(), 0);
  drive_ring(ring.shape(), ring.units(), channel, steps);
}

}  // namespace gradcomm::detail
