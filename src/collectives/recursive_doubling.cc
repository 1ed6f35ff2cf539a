// Recursive-doubling allreduce for small tensors: latency-optimal, ceil(log2 N)
// exchanges of the whole buffer instead of the ring's 2(N-1) steps.
//
// With p the largest power of two <= N and rem = N - p, the first 2·rem ranks
// pair up: each even one sends its buffer to the odd one above it and sits out;
// the odd one folds it in. The p remaining ranks (renumbered 0..p-1) then run
// log2(p) rounds: in round k, partners id and id^2^k exchange their buffers and
// both reduce. Finally every odd rank of the first 2·rem hands the result back to
// the even one below it.
//
// Bitwise identical results: both partners of a round compute the same
// combination — the lower rank's partial result is always the first operand, so
// even the NaN payload that survives an addition is the same on both sides — and
// the average's division happens once, identically, on every rank.
#include <cstring>
#include <vector>

#include "collectives/collectives.h"
#include "env.h"
#include "reduce.h"

namespace gradcomm::detail {

int64_t small_allreduce_bytes() {
  // GRADCOMM_SMALL_ALLREDUCE_BYTES: tensors up to this size take recursive
  // doubling (latency-bound); larger ones the ring (bandwidth-optimal). Measured
  // crossover on loopback TCP, N = 2..4: between 64 and 256 KiB.
  return env_bytes("GRADCOMM_SMALL_ALLREDUCE_BYTES", int64_t{128} << 10, 0, int64_t{1} << 30);
}

void dense_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op, uint32_t unit_base) {
  if (op.size() == 1 || numel == 0) return;
  if (numel * static_cast<int64_t>(dtype_size(dtype)) <= small_allreduce_bytes()) {
    recursive_doubling_allreduce(op, data, numel, dtype, reduce_op, unit_base);
  } else {
    ring_allreduce(op, data, numel, dtype, reduce_op, unit_base);
  }
}

namespace {
constexpr uint32_t kFoldUnit = 0x7FFFFFF0u;  // pre-step: even rank -> odd rank
constexpr uint32_t kUnfoldUnit = 0x7FFFFFF1u;  // post-step: odd rank -> even rank
}  // namespace

void recursive_doubling_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                                  uint32_t unit_base) {
  const int n = op.size();
  const int r = op.rank();
  const size_t bytes = static_cast<size_t>(numel) * dtype_size(dtype);
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  std::vector<uint8_t> theirs(bytes);

  // Combines `theirs` (from `peer`) into `data`, the lower rank's data first.
  auto combine = [&](int peer) {
    Op::PhaseTimer timer(op, &Stats::reduce_s);
    if (peer > r) {
      reduce_inplace(data, theirs.data(), numel, dtype, reduce_op);
    } else {
      reduce_inplace(theirs.data(), data, numel, dtype, reduce_op);
      std::memcpy(data, theirs.data(), bytes);
    }
  };

  // ---- pre-step: fold the first 2·rem ranks in pairs ----
  int id;  // rank among the p that do the doubling; -1 for ranks that sit out
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      auto send = op.send(r + 1, unit_base + kFoldUnit, data, bytes);
      op.wait(*send, "fold send");
      id = -1;
    } else {
      auto recv = op.recv(r - 1, unit_base + kFoldUnit, theirs.data(), bytes);
      op.wait(*recv, "fold receive");
      combine(r - 1);
      id = r / 2;
    }
  } else {
    id = r - rem;
  }

  // ---- recursive doubling among p ranks ----
  if (id >= 0) {
    auto real_rank = [rem](int i) { return i < rem ? 2 * i + 1 : i + rem; };
    uint32_t round = 0;
    for (int mask = 1; mask < p; mask *= 2, ++round) {
      const int peer = real_rank(id ^ mask);
      auto recv = op.recv(peer, unit_base + round, theirs.data(), bytes);
      auto send = op.send(peer, unit_base + round, data, bytes);
      op.wait(*recv, "recursive-doubling receive");
      op.wait(*send, "recursive-doubling send");  // `data` changes next: the send must be done
      combine(peer);
    }
  }

  // ---- post-step: hand the result back to the ranks that sat out ----
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      auto recv = op.recv(r + 1, unit_base + kUnfoldUnit, data, bytes);
      op.wait(*recv, "unfold receive");
    } else {
      auto send = op.send(r - 1, unit_base + kUnfoldUnit, data, bytes);
      op.wait(*send, "unfold send");
    }
  }
  // Every rank divides the identical sum identically; the even ranks of the pre-step
  // received the sum, not the average, so they divide too.
  if (reduce_op == ReduceOp::kAvg) {
    Op::PhaseTimer timer(op, &Stats::reduce_s);
    divide_inplace(data, numel, dtype, n);
  }
}

}  // namespace gradcomm::detail
