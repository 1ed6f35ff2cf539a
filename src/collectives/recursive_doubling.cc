// Recursive-doubling allreduce for small tensors: latency-optimal, ceil(log2 N)
// exchanges of the whole buffer instead of the ring's 2(N-1) steps; and for
// mid-size tensors Rabenseifner's recursive halving + doubling (below), which
// moves the ring's bytes in 2 log2(N) steps.
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
#include <memory>
#include <vector>

#include "collectives/collectives.h"
#include "hierarchy.h"
#include "env.h"
#include "reduce.h"

namespace gradcomm::detail {

int64_t small_allreduce_bytes() {
  // GRADCOMM_SMALL_ALLREDUCE_BYTES: tensors up to this size take recursive
  // doubling (latency-bound); larger ones the ring (bandwidth-optimal). Measured
  // crossover on loopback TCP, N = 2..4: between 64 and 256 KiB.
  return env_bytes("GRADCOMM_SMALL_ALLREDUCE_BYTES", int64_t{128} << 10, 0, int64_t{1} << 30);
}

int64_t halving_doubling_bytes() {
  // GRADCOMM_HALVING_DOUBLING_BYTES: tensors above small_allreduce_bytes() and up to
  // this size take recursive halving + doubling (Rabenseifner): the ring's bytes in
  // 2 log2(N) steps instead of 2(N-1). Only for N > 2 (at N = 2 both are one
  // exchange each way, and the ring pipelines it). 2M: ahead of the ring up to 2M at
  // N = 4 and 8 on emulated links, behind it at 4M, where its rounds (one unpipelined
  // message each) lose: bench/results/tuning-notes-2026-11-27.md#halving-doubling-bytes.
  return env_bytes("GRADCOMM_HALVING_DOUBLING_BYTES", int64_t{2} << 20, 0, int64_t{1} << 40);
}

void dense_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op, uint32_t unit_base) {
  if (op.size() == 1 || numel == 0) return;
  if (NodeShm* shm = op.node_shm()) return shm_allreduce(op, *shm, data, numel, dtype, reduce_op);
  if (op.two_levels()) return two_level_dense_allreduce(op, data, numel, dtype, reduce_op, unit_base);
  const int64_t bytes = numel * static_cast<int64_t>(dtype_size(dtype));
  if (bytes <= small_allreduce_bytes()) {
    recursive_doubling_allreduce(op, data, numel, dtype, reduce_op, unit_base);
  } else if (op.size() > 2 && bytes <= halving_doubling_bytes()) {
    halving_doubling_allreduce(op, data, numel, dtype, reduce_op, unit_base);
  } else {
    ring_allreduce(op, data, numel, dtype, reduce_op, unit_base);
  }
}

namespace {
constexpr uint32_t kFoldUnit = 0x7FFFFFF0u;  // pre-step: even rank -> odd rank
constexpr uint32_t kUnfoldUnit = 0x7FFFFFF1u;  // post-step: odd rank -> even rank
constexpr uint32_t kAllgatherUnits = 64;  // halving-doubling: its allgather rounds' units start here

// The power-of-two core both algorithms run on: p = largest power of two <= N,
// and the first 2·rem ranks (rem = N - p) folded in pairs.
struct PowerOfTwo {
  int p = 1;
  int rem = 0;
  explicit PowerOfTwo(int n) {
    while (p * 2 <= n) p *= 2;
    rem = n - p;
  }
  // The real rank of core member i (0..p-1): the odd rank of a folded pair, or
  // one of the ranks above the pairs.
  int real_rank(int i) const { return i < rem ? 2 * i + 1 : i + rem; }
};

// Pre-step: in each of the first `rem` pairs the even rank sends its whole buffer to
// the odd one and sits out (-1); the odd one folds it in, the even rank's data as
// the first operand. Returns this rank's index in the power-of-two core.
int fold_in(Op& op, const PowerOfTwo& core, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
            uint8_t* scratch, uint32_t unit_base) {
  const int r = op.rank();
  const size_t bytes = static_cast<size_t>(numel) * dtype_size(dtype);
  if (r >= 2 * core.rem) return r - core.rem;
  if (r % 2 == 0) {
    auto send = op.send(r + 1, unit_base + kFoldUnit, data, bytes);
    op.wait(*send, "fold send");
    return -1;
  }
  auto recv = op.recv(r - 1, unit_base + kFoldUnit, scratch, bytes);
  op.wait(*recv, "fold receive");
  Op::PhaseTimer timer(op, &Stats::reduce_s);
  reduce_inplace(scratch, data, numel, dtype, reduce_op);
  std::memcpy(data, scratch, bytes);
  return r / 2;
}

// Post-step: every odd rank of the folded pairs hands the result to the even one.
void unfold(Op& op, const PowerOfTwo& core, void* data, size_t bytes, uint32_t unit_base) {
  const int r = op.rank();
  if (r >= 2 * core.rem) return;
  if (r % 2 == 0) {
    auto recv = op.recv(r + 1, unit_base + kUnfoldUnit, data, bytes);
    op.wait(*recv, "unfold receive");
  } else {
    auto send = op.send(r - 1, unit_base + kUnfoldUnit, data, bytes);
    op.wait(*send, "unfold send");
  }
}
}  // namespace

void recursive_doubling_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                                  uint32_t unit_base) {
  const int r = op.rank();
  const size_t bytes = static_cast<size_t>(numel) * dtype_size(dtype);
  const PowerOfTwo core(op.size());
  const auto theirs = std::make_unique_for_overwrite<uint8_t[]>(bytes);

  const int id = fold_in(op, core, data, numel, dtype, reduce_op, theirs.get(), unit_base);
  if (id >= 0) {
    uint32_t round = 0;
    for (int mask = 1; mask < core.p; mask *= 2, ++round) {
      const int peer = core.real_rank(id ^ mask);
      auto recv = op.recv(peer, unit_base + round, theirs.get(), bytes);
      auto send = op.send(peer, unit_base + round, data, bytes);
      op.wait(*recv, "recursive-doubling receive");
      op.wait(*send, "recursive-doubling send");  // `data` changes next: the send must be done
      // Both partners compute the same combination: the lower rank's partial result first.
      Op::PhaseTimer timer(op, &Stats::reduce_s);
      if (peer > r) {
        reduce_inplace(data, theirs.get(), numel, dtype, reduce_op);
      } else {
        reduce_inplace(theirs.get(), data, numel, dtype, reduce_op);
        std::memcpy(data, theirs.get(), bytes);
      }
    }
  }
  unfold(op, core, data, bytes, unit_base);
  // Every rank divides the identical sum identically; the even ranks of the pre-step
  // received the sum, not the average, so they divide too.
  if (reduce_op == ReduceOp::kAvg) {
    Op::PhaseTimer timer(op, &Stats::reduce_s);
    divide_inplace(data, numel, dtype, op.size());
  }
}

// Rabenseifner's allreduce on the power-of-two core (Thakur, Rabenseifner & Gropp
// 2005). Reduce-scatter by recursive halving: in round k (mask = p/2, p/4, .., 1)
// partners id and id^mask hold the same element range; each keeps one half (the
// lower half if its mask bit is 0), sends the other half and folds the partner's
// copy of its own half in. After log2(p) rounds each member owns a fully reduced
// block; kAvg divides it there, once. Allgather by recursive doubling retraces the
// rounds backwards, each partner sending its block and receiving the other's, so
// every member ends with the same bytes. Each member sends 2(p-1)/p of the buffer,
// as in the ring, in 2 log2(p) messages instead of 2(N-1) steps.
void halving_doubling_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                                uint32_t unit_base) {
  const size_t elem = dtype_size(dtype);
  const size_t bytes = static_cast<size_t>(numel) * elem;
  auto* base = static_cast<uint8_t*>(data);
  const PowerOfTwo core(op.size());
  // The fold receives a whole buffer; the halving at most half of one.
  const auto scratch = std::make_unique_for_overwrite<uint8_t[]>(core.rem > 0 ? bytes : bytes / 2 + elem);

  const int id = fold_in(op, core, data, numel, dtype, reduce_op, scratch.get(), unit_base);
  if (id >= 0) {
    struct Round {
      int mask;
      int64_t lo, hi;  // the range both partners held when the round began
      bool lower;      // this member kept its lower half
    };
    std::vector<Round> rounds;
    int64_t lo = 0, hi = numel;
    uint32_t round = 0;
    for (int mask = core.p / 2; mask >= 1; mask /= 2, ++round) {
      const int peer = core.real_rank(id ^ mask);
      const int64_t mid = lo + (hi - lo) / 2;
      const bool lower = (id & mask) == 0;
      const int64_t keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
      const int64_t give_lo = lower ? mid : lo, give_hi = lower ? hi : mid;
      auto recv = op.recv(peer, unit_base + round, scratch.get(), static_cast<size_t>(keep_hi - keep_lo) * elem);
      auto send = op.send(peer, unit_base + round, base + give_lo * elem, static_cast<size_t>(give_hi - give_lo) * elem);
      op.wait(*recv, "recursive-halving receive");
      {  // the send reads the other half: the fold may run while it is in flight
        Op::PhaseTimer timer(op, &Stats::reduce_s);
        const int64_t divisor = reduce_op == ReduceOp::kAvg && mask == 1 ? op.size() : 1;
        reduce_inplace(base + keep_lo * elem, scratch.get(), keep_hi - keep_lo, dtype, reduce_op, divisor);
      }
      op.wait(*send, "recursive-halving send");  // the allgather writes that half again
      rounds.push_back({mask, lo, hi, lower});
      lo = keep_lo;
      hi = keep_hi;
    }
    for (auto it = rounds.rbegin(); it != rounds.rend(); ++it, ++round) {
      const int peer = core.real_rank(id ^ it->mask);
      // The partner owns the rest of the round's range.
      const int64_t other_lo = it->lower ? hi : it->lo;
      const int64_t other_hi = it->lower ? it->hi : lo;
      auto recv = op.recv(peer, unit_base + kAllgatherUnits + round, base + other_lo * elem,
                          static_cast<size_t>(other_hi - other_lo) * elem);
      auto send = op.send(peer, unit_base + kAllgatherUnits + round, base + lo * elem, static_cast<size_t>(hi - lo) * elem);
      op.wait(*recv, "recursive-doubling allgather receive");
      op.wait(*send, "recursive-doubling allgather send");
      lo = it->lo;
      hi = it->hi;
    }
  }
  unfold(op, core, data, bytes, unit_base);
}

}  // namespace gradcomm::detail
