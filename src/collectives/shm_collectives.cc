// The collectives of a call whose group is one node's ranks, on the node's shared segment
// (node_shm.h, node_collectives.h) instead of the transport: what dense_allreduce,
// dense_reduce_scatter, the ring's and the direct reduce-scatter, ring_allgatherv,
// chain_broadcast and dissemination_barrier run when Op::node_shm() says the segment
// serves this group. Here: the waits' checks (the call's deadline, aborts, the peers'
// processes) and the digest that keeps the node's ranks in the same collective.
#include <fmt/format.h>

#include <array>
#include <cstring>
#include <optional>
#include <vector>

#include "collectives/collectives.h"
#include "node_shm.h"

namespace gradcomm::detail {
namespace {

constexpr auto kCheckEvery = std::chrono::microseconds(50);

// The same on every rank of the node for the same collective of the same call: every field
// of the call's header that ranks must agree on (WireHeader::agrees_with), so that calls
// that differ never exchange data, and what this collective moves.
uint64_t digest(const Op& op, char kind, int64_t count, DType dtype, ReduceOp reduce_op, int root) {
  const WireHeader& h = op.header();
  const auto u8 = [](auto v) { return static_cast<uint64_t>(static_cast<uint8_t>(v)); };
  const auto u32 = [](auto v) { return static_cast<uint64_t>(static_cast<uint32_t>(v)); };
  // Each field in bits of its own (the small ones packed in words), each word times its own
  // odd constant, summed (independent multiplies, written out: FNV over the bytes was a
  // third of a small call's instructions), then mixed. Equal on every rank for equal
  // fields; a word that differs alone always changes the sum (an odd factor is invertible
  // modulo 2^64), and the final mix is a bijection.
  const uint64_t small =
      u8(h.op) | u8(h.dtype) << 8 | u8(h.reduce_op) << 16 | u8(kind) << 24 | u8(dtype) << 32 | u8(reduce_op) << 40;
  uint64_t mix = h.seq * 0x9e3779b97f4a7c15ull + small * 0xbf58476d1ce4e5b9ull +
                 static_cast<uint64_t>(h.numel) * 0x94d049bb133111ebull +
                 (u32(h.root) | u32(root) << 32) * 0xd6e8feb86659fd93ull + h.step * 0xa0761d6478bd642full +
                 h.payload_bytes * 0xe7037ed1a0b428dbull +
                 (u32(h.fused) | u32(h.fused_digest) << 32) * 0x8ebc6af09c88c6e3ull +
                 u32(h.compressor_hash) * 0x589965cc75374cc3ull +
                 static_cast<uint64_t>(count) * 0x1d8e4e27c47d124full;
  mix ^= mix >> 31;
  mix *= 0xbf58476d1ce4e5b9ull;
  return mix ^ (mix >> 29);
}

// Runs `body(collectives, wait)`; the waits check in with the Op (deadline, aborts,
// destruction) and the peers' processes every kCheckEvery. `counted`: a collective of
// Stats::node_shm_ops (a header check is not).
template <typename Body>
void on_segment(Op& op, NodeShm& shm, const char* what, Body&& body, bool counted = true) {
  // What the waits' callbacks need, behind one pointer (a std::function that small keeps
  // it in place: a small call allocates nothing here).
  struct Context {
    Op& op;
    NodeShm& shm;
    const char* what;
    Clock::time_point next{};  // the first check comes with the first poll
  } ctx{op, shm, what};
  NodeWait wait;
  wait.poll = [c = &ctx](int place) {
    const auto now = Clock::now();
    if (now < c->next) return;
    c->next = now + kCheckEvery;
    c->op.check_in(c->what, c->shm.members()[static_cast<size_t>(place)]);
    try {
      c->shm.check_peers();
    } catch (const PeerFailure& e) {
      c->op.fail(ErrorCode::kPeerFailure, fmt::format("{} ({})", e.what(), c->what));
    }
  };
  // The call's header goes beside each round's digest, so that a rank that finds another
  // call there names both, as the transport's header check does (Op::check_header).
  static_assert(WireHeader::kBytes <= kNodeRecordBytes);
  wait.record = [c = &ctx](std::span<uint8_t> into) {
    const std::array<uint8_t, WireHeader::kBytes> bytes = c->op.header().serialize();
    std::memcpy(into.data(), bytes.data(), bytes.size());
    return bytes.size();
  };
  wait.disagree = [c = &ctx](int place, std::span<const uint8_t> theirs) {
    Op& op = c->op;
    const int them = c->shm.members()[static_cast<size_t>(place)];
    const std::optional<WireHeader> header = WireHeader::parse(theirs.data(), theirs.size());
    if (header && !header->agrees_with(op.header())) {
      op.fail(ErrorCode::kMismatch,
              fmt::format("mismatched collective calls: rank {} called {}; rank {} called {} (they differ in {})",
                          op.comm_rank(op.rank()), op.header().describe(), them, header->describe(),
                          op.header().differences(*header)));
    }
    op.fail(ErrorCode::kMismatch, fmt::format("rank {} is in another collective of the same call than this rank on "
                                              "the node's shared segment ({})",
                                              them, c->what));
  };
  const uint64_t written = shm.collectives().bytes_written();
  const uint64_t rounds = shm.collectives().rounds();
  body(shm.collectives(), wait);
  // A peer that timed out (or failed) in this call had published its part before it gave
  // up: a late rank finds everything ready and finishes the rounds the others abandoned.
  // Their abort is here by then (the engine collects aborts between calls, and every
  // wait's poll does), and this raises it instead of the call succeeding alone; as it
  // does one that came while the rounds ran. (Once after the rounds: a check before them
  // would raise nothing this one does not.)
  op.check_aborts_now();
  // Every round's digest held the header, and agreed; a collective with nothing to move
  // ran none, and leaves the check to Op::check_header.
  if (shm.collectives().rounds() != rounds) op.header_checked_on_segment();
  if (counted) op.count_shm(shm.collectives().bytes_written() - written);
}

}  // namespace

void shm_allreduce(Op& op, NodeShm& shm, void* data, int64_t numel, DType dtype, ReduceOp reduce_op) {
  // Larger than a small call, in a block of Communicator::alloc_shared: from the ranks'
  // buffers in place. Every rank of the node must pass the same place in the same
  // allocation: the digest holds both, so a rank that does not is a mismatch, not a
  // wrong sum.
  const size_t bytes = static_cast<size_t>(numel) * dtype_size(dtype);
  if (bytes > kNodeSmallBytes) {
    const int place = shm.collectives().rank();
    if (const auto block = shm.blocks()->find(data, bytes, place)) {
      const size_t offset = static_cast<size_t>(static_cast<uint8_t*>(data) - block->bases[static_cast<size_t>(place)]);
      std::vector<const uint8_t*> buffers;
      for (uint8_t* base : block->bases) buffers.push_back(base + offset);
      const uint64_t where = digest(op, 'S', static_cast<int64_t>(offset), DType::kUInt8, ReduceOp::kSum,
                                    static_cast<int>(static_cast<uint32_t>(block->id)));
      on_segment(op, shm, "allreduce from the node's alloc_shared buffers",
                 [&](NodeCollectives& node, const NodeWait& wait) {
                   node.allreduce_direct(data, numel, dtype, reduce_op, buffers,
                                         digest(op, 'D', numel, dtype, reduce_op, -1) ^ where, wait);
                 });
      return;
    }
  }
  on_segment(op, shm, "allreduce on the node's segment", [&](NodeCollectives& node, const NodeWait& wait) {
    node.allreduce(data, numel, dtype, reduce_op, digest(op, 'A', numel, dtype, reduce_op, -1), wait);
  });
}

void shm_reduce_scatter(Op& op, NodeShm& shm, const void* in, void* out, std::span<const int64_t> starts, DType dtype,
                        ReduceOp reduce_op) {
  on_segment(op, shm, "reduce-scatter on the node's segment", [&](NodeCollectives& node, const NodeWait& wait) {
    node.reduce_scatter(in, out, starts, dtype, reduce_op, digest(op, 'R', starts.back(), dtype, reduce_op, -1),
                        wait);
  });
}

void shm_allgatherv(Op& op, NodeShm& shm, uint8_t* out, const std::vector<int64_t>& counts, size_t elem_bytes) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t p = 0; p < counts.size(); ++p) offsets[p + 1] = offsets[p] + counts[p] * static_cast<int64_t>(elem_bytes);
  on_segment(op, shm, "allgather on the node's segment", [&](NodeCollectives& node, const NodeWait& wait) {
    node.allgather(out, offsets, digest(op, 'G', offsets.back(), DType::kUInt8, ReduceOp::kSum, -1), wait);
  });
}

void shm_broadcast(Op& op, NodeShm& shm, void* data, int64_t bytes, int root) {
  on_segment(op, shm, "broadcast on the node's segment", [&](NodeCollectives& node, const NodeWait& wait) {
    node.broadcast(data, static_cast<size_t>(bytes), root, digest(op, 'B', bytes, DType::kUInt8, ReduceOp::kSum, root),
                   wait);
  });
}

void shm_check_header(Op& op, NodeShm& shm) {
  on_segment(op, shm, "call header on the node's segment", [&](NodeCollectives& node, const NodeWait& wait) {
    node.barrier(digest(op, 'H', 0, DType::kUInt8, ReduceOp::kSum, -1), wait);
  }, /*counted=*/false);
}

void shm_barrier(Op& op, NodeShm& shm) {
  on_segment(op, shm, "barrier on the node's segment", [&](NodeCollectives& node, const NodeWait& wait) {
    node.barrier(digest(op, 'Z', 0, DType::kUInt8, ReduceOp::kSum, -1), wait);
  });
}

}  // namespace gradcomm::detail
