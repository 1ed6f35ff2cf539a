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
// Pipelining as in ring_allreduce.cc: segments are cut into C chunks, (step,
// chunk) is one message "unit", and a chunk goes on as soon as it is ready. Chunk
// boundaries are multiples of the codec's alignment (its bucket), so a chunk
// encodes exactly as the same elements would inside the whole tensor.
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
#include <vector>

#include "collectives/collectives.h"
#include "collectives/compressed_ring_plan.h"
#include "compressors/codec.h"
#include "reduce.h"

namespace gradcomm::detail {

void compressed_ring_allreduce(Op& op, float* data, int64_t numel, const DenseCodec& codec,
                               const PhiloxStream& rng, float* residual, int divisor, RingPhases phases) {
  const int n = op.size();
  const int right = (op.rank() + 1) % n;
  const int left = (op.rank() + n - 1) % n;
  const int depth = pipeline_depth();
  // Segments and units shared with the NCCL ring (compressed_ring_plan.h); chunks
  // of chunk_bytes(), as the dense ring. The reduce-scatter alone: segments of exactly
  // numel / N (alignment 1: no bucket alignment to keep, as no payload of it is compared
  // with a whole-tensor encode) and the schedule's ranks shifted (ring_allreduce.cc).
  const bool allgather = phases == RingPhases::kAllreduce;
  const int64_t align = allgather ? codec.alignment() : 1;
  const int schedule_rank = allgather ? op.rank() : (op.rank() + n - 1) % n;
  const CompressedRingPlan plan(n, schedule_rank, numel, align, chunk_bytes() / 4, (1 << 30) / (n - 1),
                                [&](int64_t count) { return codec.encoded_bytes(count); });
  const int64_t C = plan.chunks();
  const int64_t rs_units = plan.rs_units();
  const int64_t total_units = allgather ? plan.units() : rs_units;

  // Every unit has its own payload buffer: sends stay valid until they complete, and
  // allgather payloads are forwarded as received.
  std::vector<std::vector<uint8_t>> out(total_units), in(total_units);
  std::vector<RequestPtr> sends(total_units), recvs(total_units);
  std::vector<float> scratch(static_cast<size_t>(std::max<int64_t>(plan.max_chunk_elems(), 1)));

  // Encodes data[b, e) into out[u] and sends it; the loss goes to the residual.
  auto encode_and_send = [&](int64_t u, bool final_owner) {
    const auto [b, e] = plan.send_range(u);
    // The element index the codec's draws count from. An encode must start on its
    // alignment; the reduce-scatter's chunks need not, so theirs is b x alignment: still
    // distinct for every element of every chunk (a later chunk starts at least a chunk's
    // length of alignments further on).
    const int64_t first = allgather ? b : b * codec.alignment();
    out[u].resize(plan.send_bytes(u));
    {
      Op::PhaseTimer timer(op, &Stats::encode_s);
      if (residual != nullptr) {
        // What the peers will decode, from the encoder itself (encode_with_values).
        codec.encode_with_values(data + b, e - b, out[u].data(), rng, first, scratch.data(), 1);
        accumulate_loss(residual + b, data + b, scratch.data(), e - b);
        if (final_owner) {  // the owner keeps what everyone decodes
          std::copy_n(scratch.data(), e - b, data + b);
          divide_inplace(data + b, e - b, DType::kFloat32, divisor);
        }
      } else if (final_owner) {
        // Nothing needs the sum any more: the decoded average replaces it in place.
        codec.encode_with_values(data + b, e - b, out[u].data(), rng, first, data + b, divisor);
      } else {
        codec.encode(data + b, e - b, out[u].data(), rng, first);
      }
    }
    sends[u] = op.send(right, static_cast<uint32_t>(u), out[u].data(), out[u].size());
  };

  int64_t posted = 0;
  auto post_until = [&](int64_t limit) {
    for (limit = std::min(limit, total_units); posted < limit; ++posted) {
      in[posted].resize(plan.recv_bytes(posted));
      recvs[posted] = op.recv(left, static_cast<uint32_t>(posted), in[posted].data(), in[posted].size());
    }
  };

  for (int64_t j = 0; j < C; ++j) encode_and_send(j, false);  // step 0: our own segment
  for (int64_t u = 0; u < total_units; ++u) {
    post_until(u + depth);
    const bool reduce_scatter = u < rs_units;
    op.wait(*recvs[u], reduce_scatter ? "compressed reduce-scatter receive" : "compressed allgather receive");
    recvs[u].reset();
    const auto [b, e] = plan.recv_range(u);
    if (reduce_scatter) {
      // recvReduceSend: our values plus the neighbour's decoded partial sum.
      {
        Op::PhaseTimer timer(op, &Stats::decode_s);
        codec.decode_add(in[u], e - b, data + b);
      }
      if (!allgather && u / C == n - 2) {  // the reduce-scatter's result: exact, then the average
        Op::PhaseTimer timer(op, &Stats::reduce_s);
        divide_inplace(data + b, e - b, DType::kFloat32, divisor);
      } else {
        encode_and_send(u + C, /*final_owner=*/u / C == n - 2);
      }
    } else {
      {
        Op::PhaseTimer timer(op, &Stats::decode_s);
        codec.decode_average(in[u], e - b, data + b, divisor);
      }
      if (u + C < total_units) {  // recvCopySend: forward the exact bytes
        out[u + C] = std::move(in[u]);
        sends[u + C] = op.send(right, static_cast<uint32_t>(u + C), out[u + C].data(), out[u + C].size());
      }
    }
    in[u].clear();
  }
  for (auto& send : sends) {
    if (send) op.wait(*send, "compressed final send");
  }
}

}  // namespace gradcomm::detail
