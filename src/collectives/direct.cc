// The direct schedule: every rank's copy of segment s goes straight to s's owner, rank s,
// which sums them; for an allreduce the owners' sums then go straight to every rank.
// The ring's bytes (each rank sends (N-1)/N of the buffer per phase) in N-1 messages per
// phase, sent at once instead of step after step.
//
// Compressed (GRADCOMM_SCHEDULE, codec_schedule in compression.h): the compressed ring re-encodes a
// partial sum at every hop, so an element is rounded N times and the error grows with N
// (bench/results/requant-2026-11-27.md: quant:bits=4, relative error 0.27 at N = 4, 0.36 at
// 8, 0.51 at 16). Here an element is rounded once on its way to the owner (each rank's own
// value, encoded once), summed in fp32 there in rank order, and rounded once more by the
// owner's final encode, whose bytes every rank decodes: two roundings per element at any N,
// as DeepSpeed's ZeRO++ all-to-all and BytePS's colocated servers do. (This is the
// parameter-server architecture in its sharded, colocated form: each rank serves 1/N of the
// tensor.) Every rank decodes the same payloads, and the owner replaces its own sum with
// the decoded bytes, so all ranks end bitwise identical. Error feedback: each encode's loss
// goes to the residual at its positions, as in the ring.
#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "collectives/collectives.h"
#include "compressors/codec.h"
#include "reduce.h"

namespace gradcomm::detail {
namespace {

int64_t length(const std::vector<int64_t>& starts, int s) {
  return starts[static_cast<size_t>(s) + 1] - starts[static_cast<size_t>(s)];
}

}  // namespace

void direct_reduce_scatter(Op& op, void* data, const std::vector<int64_t>& starts, DType dtype, ReduceOp reduce_op,
                           uint32_t unit_base) {
  const int n = op.size(), me = op.rank();
  const size_t elem = dtype_size(dtype);
  auto* base = static_cast<uint8_t*>(data);
  if (NodeShm* shm = op.node_shm()) {
    return shm_reduce_scatter(op, *shm, data, base + static_cast<size_t>(starts[static_cast<size_t>(me)]) * elem,
                              starts, dtype, reduce_op);
  }
  const int64_t mine = length(starts, me);
  const auto inbox = std::make_unique_for_overwrite<uint8_t[]>(std::max<size_t>(1, static_cast<size_t>(mine) * elem *
                                                                                       static_cast<size_t>(n)));
  std::vector<RequestPtr> recvs(static_cast<size_t>(n)), sends;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    recvs[static_cast<size_t>(p)] =
        op.recv(p, unit_base, inbox.get() + static_cast<size_t>(p) * static_cast<size_t>(mine) * elem,
                static_cast<size_t>(mine) * elem);
    sends.push_back(op.send(p, unit_base, base + static_cast<size_t>(starts[static_cast<size_t>(p)]) * elem,
                            static_cast<size_t>(length(starts, p)) * elem));
  }
  uint8_t* own = base + static_cast<size_t>(starts[static_cast<size_t>(me)]) * elem;
  for (int p = 0; p < n; ++p) {  // in rank order, as they come
    if (p == me) continue;
    op.wait(*recvs[static_cast<size_t>(p)], "direct reduce-scatter receive");
    const bool last = p == (me == n - 1 ? n - 2 : n - 1);
    Op::PhaseTimer timer(op, &Stats::reduce_s);
    reduce_inplace(own, inbox.get() + static_cast<size_t>(p) * static_cast<size_t>(mine) * elem, mine, dtype,
                   reduce_op, last && reduce_op == ReduceOp::kAvg ? n : 1);
  }
  op.wait_all(sends, "direct reduce-scatter send");
}

void compressed_direct_reduce_scatter(Op& op, float* data, const std::vector<int64_t>& starts,
                                      const DenseCodec& codec, const PhiloxStream& rng, float* residual,
                                      bool aligned) {
  const int n = op.size(), me = op.rank();
  const auto first = [&](int64_t b) { return aligned ? b : b * codec.alignment(); };
  const int64_t mine = length(starts, me);
  float* own = data + starts[static_cast<size_t>(me)];
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n)), in(static_cast<size_t>(n));
  std::vector<RequestPtr> recvs(static_cast<size_t>(n)), sends;
  int64_t longest = 1;
  for (int s = 0; s < n; ++s) longest = std::max(longest, length(starts, s));
  std::vector<float> decoded(static_cast<size_t>(longest));  // an encode's values, for its loss
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    in[static_cast<size_t>(p)].resize(codec.encoded_bytes(mine));
    recvs[static_cast<size_t>(p)] = op.recv(p, 0, in[static_cast<size_t>(p)].data(), in[static_cast<size_t>(p)].size());
  }
  for (int k = 1; k < n; ++k) {  // me + 1, me + 2, ...: the owners do not all hear from rank 0 first
    const int p = (me + k) % n;
    const int64_t b = starts[static_cast<size_t>(p)], len = length(starts, p);
    std::vector<uint8_t>& payload = out[static_cast<size_t>(p)];
    payload.resize(codec.encoded_bytes(len));
    {
      Op::PhaseTimer timer(op, &Stats::encode_s);
      if (residual != nullptr) {
        codec.encode_with_values(data + b, len, payload.data(), rng, first(b), decoded.data(), 1);
        accumulate_loss(residual + b, data + b, decoded.data(), len);
      } else {
        codec.encode(data + b, len, payload.data(), rng, first(b));
      }
    }
    sends.push_back(op.send(p, 0, payload.data(), payload.size()));
  }
  for (int p = 0; p < n; ++p) {  // the owner's sum: its own values, then the others' in rank order
    if (p == me) continue;
    op.wait(*recvs[static_cast<size_t>(p)], "direct compressed reduce-scatter receive");
    Op::PhaseTimer timer(op, &Stats::decode_s);
    codec.decode_add(in[static_cast<size_t>(p)], mine, own);
  }
  op.wait_all(sends, "direct compressed reduce-scatter send");
}

void compressed_direct_allreduce(Op& op, float* data, int64_t numel, const DenseCodec& codec, const PhiloxStream& rng,
                                 float* residual, int divisor, RingPhases phases) {
  const int n = op.size(), me = op.rank();
  // Owners' segments at the codec's alignment, so each encodes exactly as inside the
  // whole tensor (its buckets and draws are positions in it). The reduce-scatter alone
  // keeps the call's blocks (numel = N x count, alignment 1); its encodes then draw at
  // position x alignment, as the ring's reduce-scatter chunks do, distinct for every element.
  const bool allgather = phases == RingPhases::kAllreduce;
  const std::vector<int64_t> starts = ring_segments(numel, n, allgather ? codec.alignment() : 1);
  const int64_t mine = length(starts, me);
  float* own = data + starts[static_cast<size_t>(me)];

  // 1. Every other owner's segment, encoded once, to its owner; ours stays exact.
  compressed_direct_reduce_scatter(op, data, starts, codec, rng, residual, allgather);
  if (!allgather) {  // the owner's sum is its share, exact in what it received
    Op::PhaseTimer timer(op, &Stats::reduce_s);
    divide_inplace(own, mine, DType::kFloat32, divisor);
    return;
  }

  // 2. The owner's sum, encoded once; every rank decodes those bytes, the owner too.
  std::vector<uint8_t> final_payload(codec.encoded_bytes(mine));
  {
    Op::PhaseTimer timer(op, &Stats::encode_s);
    const int64_t b = starts[static_cast<size_t>(me)];
    if (residual != nullptr) {
      std::vector<float> decoded(static_cast<size_t>(std::max<int64_t>(mine, 1)));
      codec.encode_with_values(own, mine, final_payload.data(), rng, b, decoded.data(), 1);
      accumulate_loss(residual + b, own, decoded.data(), mine);
      std::copy_n(decoded.data(), mine, own);
      divide_inplace(own, mine, DType::kFloat32, divisor);
    } else {
      codec.encode_with_values(own, mine, final_payload.data(), rng, b, own, divisor);
    }
  }
  std::vector<std::vector<uint8_t>> in(static_cast<size_t>(n));
  std::vector<RequestPtr> recvs(static_cast<size_t>(n)), sends;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    in[static_cast<size_t>(p)].resize(codec.encoded_bytes(length(starts, p)));
    recvs[static_cast<size_t>(p)] = op.recv(p, 1, in[static_cast<size_t>(p)].data(), in[static_cast<size_t>(p)].size());
  }
  for (int k = 1; k < n; ++k) sends.push_back(op.send((me + k) % n, 1, final_payload.data(), final_payload.size()));
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    op.wait(*recvs[static_cast<size_t>(p)], "direct compressed allgather receive");
    Op::PhaseTimer timer(op, &Stats::decode_s);
    codec.decode_average(in[static_cast<size_t>(p)], length(starts, p), data + starts[static_cast<size_t>(p)],
                         divisor);
  }
  op.wait_all(sends, "direct compressed allgather send");
}

}  // namespace gradcomm::detail
