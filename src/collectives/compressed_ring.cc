// Compressed ring allreduce (quantizers and casts), bandwidth-optimal like the
// dense ring but every message is a payload of a DenseCodec.
//
// Reduce-scatter, step k = 0..N-2: rank r sends the encoded partial sum of
// segment r-k; it receives the partial sum of segment r-k-1, decodes it, adds its
// own values and (at the next step) encodes the result again. After N-1 steps
// rank r holds the full sum of segment r+1, encodes it once, replaces its own
// copy by the decoded bytes, and those exact bytes travel the allgather ring:
// every rank decodes the same payloads, so all end bitwise identical.
//
// Pipelining as in ring_allreduce.cc: the ring driver (ring_driver.h) over the host
// channel, with the decode-add-re-encode and forward steps below. Chunk boundaries are
// multiples of the codec's alignment (its bucket), so a chunk encodes exactly as the
// same elements would inside the whole tensor.
//
// Error feedback: each encode this rank performs loses `value - decode(payload)`;
// with a residual buffer, that loss is added to it at the same positions, so the
// sum of all ranks' outputs plus all residuals equals the sum of their inputs.
//
// Reduce-scatter alone (RingPhases::kReduceScatter, reduce_scatter's compressed form):
// the loop's first phase with the schedule's ranks shifted by one (ring_allreduce.cc),
// segments of exactly numel / N (alignment 1); the owner's last fold is its result,
// exact in what it received, and nothing is encoded after it.
//
// The average (divisor > 1) divides each chunk as it becomes final: the owner's
// decoded copy, and each allgather chunk, in the decoder's own stores where it can
// (DenseCodec::decode_average: a power-of-two divisor) or right after, in cache.
// Every rank divides the same decoded sums, so results stay bitwise equal, and they
// are the bits of a pass over the whole output after the ring.
#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/compressed_ring_plan.h"
#include "collectives/host_ring_channel.h"
#include "collectives/ring_driver.h"
#include "compressors/codec.h"
#include "reduce.h"

namespace gradcomm::detail {
namespace {

// The compressed ring's steps: decode-add-re-encode through the reduce-scatter, forward
// (decode, pass the payload on unchanged) through the allgather. Payloads live in one
// block laid out by the plan (an out region per encoded unit, an in region per unit), so
// no buffer is reused within a call and a forwarded send is the in region it arrived in.
class CodecSteps {
 public:
  CodecSteps(Op& op, const CompressedRingPlan& plan, float* data, const DenseCodec& codec,
             const PhiloxStream& rng, float* residual, int divisor, bool allgather)
      : op_(op), plan_(plan), data_(data), codec_(codec), rng_(rng), residual_(residual),
        divisor_(divisor), allgather_(allgather),
        payloads_(std::make_unique_for_overwrite<uint8_t[]>(std::max<size_t>(plan.buffer_bytes(), 1))),
        scratch_(static_cast<size_t>(std::max<int64_t>(plan.max_chunk_elems(), 1))) {}

  RingMessage send_message(int64_t u) const { return {payloads_.get() + plan_.send_offset(u), plan_.send_bytes(u)}; }
  RingMessage recv_message(int64_t u) const { return {payloads_.get() + plan_.recv_offset(u), plan_.recv_bytes(u)}; }
  int64_t recv_overwrites(int64_t) const { return -1; }  // every unit has its own in region
  int64_t recv_reuses(int64_t) const { return -1; }
  bool absorbs(int64_t) const { return true; }

  // Unit u's payload: an encode of data[b, e) (our own segment, a re-encoded partial sum,
  // or the owner's final encode); an allgather forward is already in its in region.
  void prepare(int64_t u) {
    if (u >= plan_.encoded_units()) return;  // forward: the received bytes go on unchanged
    const auto [b, e] = plan_.send_range(u);
    const bool final_owner = plan_.final_encode(u);
    // The element index the codec's draws count from. An encode must start on its
    // alignment; the reduce-scatter's chunks need not, so theirs is b x alignment: still
    // distinct for every element of every chunk (a later chunk starts at least a chunk's
    // length of alignments further on).
    const int64_t first = allgather_ ? b : b * codec_.alignment();
    uint8_t* out = payloads_.get() + plan_.send_offset(u);
    float* values = data_ + b;
    Op::PhaseTimer timer(op_, &Stats::encode_s);
    if (residual_ != nullptr) {
      // What the peers will decode, from the encoder itself (encode_with_values); the
      // encode's loss goes to the residual.
      codec_.encode_with_values(values, e - b, out, rng_, first, scratch_.data(), 1);
      accumulate_loss(residual_ + b, values, scratch_.data(), e - b);
      if (final_owner) {  // the owner keeps what everyone decodes
        std::copy_n(scratch_.data(), e - b, values);
        divide_inplace(values, e - b, DType::kFloat32, divisor_);
      }
    } else if (final_owner) {
      // Nothing needs the sum any more: the decoded average replaces it in place.
      codec_.encode_with_values(values, e - b, out, rng_, first, values, divisor_);
    } else {
      codec_.encode(values, e - b, out, rng_, first);
    }
  }

  void absorb(int64_t u) {
    const auto [b, e] = plan_.recv_range(u);
    const std::span<const uint8_t> in(payloads_.get() + plan_.recv_offset(u), plan_.recv_bytes(u));
    if (plan_.reduce_scatter(u)) {
      {  // decode-add: our values plus the neighbour's decoded partial sum (re-encoded by prepare(u + C))
        Op::PhaseTimer timer(op_, &Stats::decode_s);
        codec_.decode_add(in, e - b, data_ + b);
      }
      if (!allgather_ && plan_.schedule().last_reduce_step(u)) {  // the reduce-scatter's result: exact, then the average
        Op::PhaseTimer timer(op_, &Stats::reduce_s);
        divide_inplace(data_ + b, e - b, DType::kFloat32, divisor_);
      }
      return;
    }
    Op::PhaseTimer timer(op_, &Stats::decode_s);  // forward: the owner's final bytes, decoded
    codec_.decode_average(in, e - b, data_ + b, divisor_);
  }

 private:
  Op& op_;
  const CompressedRingPlan& plan_;
  float* data_;
  const DenseCodec& codec_;
  const PhiloxStream& rng_;
  float* residual_;
  const int divisor_;
  const bool allgather_;
  std::unique_ptr<uint8_t[]> payloads_;
  std::vector<float> scratch_;
};

}  // namespace

void compressed_ring_allreduce(Op& op, float* data, int64_t numel, const DenseCodec& codec,
                               const PhiloxStream& rng, float* residual, int divisor, RingPhases phases) {
  const int n = op.size();
  // Segments and units shared with the NCCL ring (compressed_ring_plan.h); chunks
  // of chunk_bytes(), as the dense ring. The reduce-scatter alone: segments of exactly
  // numel / N (alignment 1: no bucket alignment to keep, as no payload of it is compared
  // with a whole-tensor encode) and the schedule's ranks shifted (ring_allreduce.cc).
  const bool allgather = phases == RingPhases::kAllreduce;
  const int64_t align = allgather ? codec.alignment() : 1;
  const int schedule_rank = allgather ? op.rank() : (op.rank() + n - 1) % n;
  const CompressedRingPlan plan(n, schedule_rank, numel, align, chunk_bytes() / 4, (1 << 30) / (n - 1),
                                [&](int64_t count) { return codec.encoded_bytes(count); });
  const int64_t units = allgather ? plan.units() : plan.rs_units();
  CodecSteps steps(op, plan, data, codec, rng, residual, divisor, allgather);
  HostRingChannel channel(op, plan.schedule().shape(), units, pipeline_depth(), /*unit_base=*/0,
                          "compressed reduce-scatter receive", "compressed allgather receive");
  drive_ring(plan.schedule().shape(), units, channel, steps);
}

}  // namespace gradcomm::detail
