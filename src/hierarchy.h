// Two levels (docs/two-levels.md): a collective of a job whose ranks share nodes runs
// inside the nodes first, where bytes are cheap, and across them only with each rank's
// share, so all of a node's links work at once and the network carries each node's sum
// once, not each rank's tensor.
//
//   allreduce of a tensor of n elements, node m holding L_m ranks:
//     1. inside each node, a reduce-scatter (dense, exact): local rank l holds the node's
//        sum of its segment, ring_segments(n, L_m, align)'s segment l;
//     2. across the nodes, every piece (the segments' common refinement: where no node's
//        segment boundary falls inside) is allreduced by its owners, one rank of every
//        node, in a View of them: the flat algorithm, dense or compressed, on the piece.
//        With nodes of one size every rank owns one piece, its segment, and its group is
//        the ranks of its local rank on every node (Horovod's hierarchical allreduce,
//        NCCL's tree of rings);
//     3. inside each node, an allgather of the segments.
//   The average divides each piece by the world size after step 2, so every rank divides
//   the same sums. Compression happens in step 2 only: a key's residual holds what this
//   rank's encodes of its pieces dropped, at those elements (one residual per key where
//   the compression happens). Low-rank compression views the tensor whole: its nodes sum
//   first (a dense allreduce inside), the nodes' first ranks compress across, and each
//   broadcasts the result inside its node.
//
// Every phase runs in a View (op.h), one after another; tags between two ranks repeat
// from phase to phase, which the transport's order per tag keeps apart.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "gradcomm/types.h"
#include "op.h"
#include "topology.h"

namespace gradcomm::detail {

// GRADCOMM_HIERARCHY=auto (default: two levels when the map has them, NodeMap::two_levels),
// on (always, a degenerate level running as one group) or off (flat).
bool use_two_levels(const NodeMap& nodes);

// GRADCOMM_SCHEDULE=auto (default) | ring | direct: how the codec-ring families run
// (compression.h, codec_schedule). Read once per communicator, at create.
enum class ScheduleMode : uint8_t { kAuto, kRing, kDirect };
ScheduleMode schedule_mode_from_env();

// What every rank must derive alike, or its calls would not match: the topology, whether
// calls run over two levels, and the schedule. The connect barrier carries it (a
// MismatchError at create names both digests).
uint32_t levels_digest(const NodeMap& nodes, bool two_levels, ScheduleMode schedule);

// A piece of a tensor and the ranks that reduce it across nodes, one per node in node
// order (communicator ranks).
struct Piece {
  int64_t begin = 0, end = 0;
  std::vector<int> owners;
};

struct TwoLevelPlan {
  std::vector<int> node;          // this rank's node: its ranks, in rank order
  std::vector<int64_t> segments;  // where each local rank's segment starts (node.size() + 1 entries)
  std::vector<Piece> pieces;      // the pieces of this rank's segment, in order
  int local = 0;                  // this rank's place in `node`
};
// The plan of a tensor of `numel` elements whose segments start at multiples of `align`.
TwoLevelPlan plan_two_levels(const NodeMap& nodes, int rank, int64_t numel, int64_t align);

// Step 1, step 2 as `across(begin, end)` (run inside a View of the piece's owners, on
// data[begin, end); for kAvg it must sum), step 3. `reduce_op` is the call's: the node's
// reduce-scatter sums for kSum and kAvg, and kAvg divides by the world size after step 2.
// Inside::kReduced: the caller ran step 1 itself (inside=compress: a compressed reduce-scatter
// over the same segments).
enum class Inside : uint8_t { kReduce, kReduced };
void two_level_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op, int64_t align,
                         uint32_t unit_base, const std::function<void(int64_t begin, int64_t end)>& across,
                         Inside inside = Inside::kReduce);

// Step 2 alone (the CUDA path runs steps 1 and 3 on the device, collectives/gpu_collectives.h):
// every piece of this rank's segment across the nodes, `across(begin, end)` inside a View of the
// piece's owners; kAvg divides `segment` (this rank's segment, plan.segments[plan.local]
// onward, holding the node's sums) by the world size after each piece.
void two_level_across(Op& op, const TwoLevelPlan& plan, void* segment, DType dtype, ReduceOp reduce_op,
                      const std::function<void(int64_t begin, int64_t end)>& across);

// What the reduce-scatter across nodes sends of a block: the node's partial sum as it is
// (dense, null), or encoded once (a compressed reduce_scatter: HostCompression).
class BlockCodec {
 public:
  virtual ~BlockCodec() = default;
  virtual size_t bytes(int64_t n) const = 0;
  // Encodes values[0, n), the block at element `position` of the call's input (its
  // residual's place); the encode's loss goes to the residual.
  virtual void encode(const float* values, int64_t n, int64_t position, uint8_t* out) = 0;
  virtual void decode_add(std::span<const uint8_t> payload, int64_t n, float* out) = 0;
};

// reduce_scatter over two levels, in place on data (N x count elements): rank r's block
// [r count, (r + 1) count) ends reduced (divided for kAvg); the rest is scratch.
//   1. inside each node, every block goes to the rank that holds it there: its own rank
//      for the node's blocks, local rank (its rank's local rank mod L) for the other
//      nodes' (a direct reduce-scatter: each holder sums its blocks over the node);
//   2. across the nodes, each holder sends each block it holds to the block's rank, which
//      sums them in node order (with `codec`, each encoded once, decoded in fp32).
// With nodes of one size each rank holds M blocks, its own and its peers' of the other
// nodes, and sends M - 1 of them: the flat ring's bytes, (N-1)/N of the input, of which
// only (M-1)/N cross the network.
void two_level_reduce_scatter(Op& op, void* data, int64_t count, DType dtype, ReduceOp reduce_op,
                              BlockCodec* codec);

// The dense allreduce over two levels: dense_allreduce (collectives.h) sends here at the
// top of a two-level call.
void two_level_dense_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                               uint32_t unit_base);

// Low-rank (whole-tensor) compression over two levels: a dense allreduce inside each node,
// `leaders(op)` inside a View of every node's first rank (which must sum), then a
// broadcast inside each node; kAvg divides by the world size.
void two_level_by_leaders(Op& op, float* data, int64_t numel, ReduceOp reduce_op,
                          const std::function<void()>& leaders);

}  // namespace gradcomm::detail
