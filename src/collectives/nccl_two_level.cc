// Two levels on device memory (hierarchy.h, docs/two-levels.md): the levels inside the nodes
// over NCCL, stream-ordered, and the level across as the caller says (the NCCL ring in a View
// of each piece's owners for a dense call; the host's compression on a staged copy for a
// compressed one, device_path_cuda.cc).
//
// Inside, a direct exchange rather than a ring: each rank sends its copy of segment l to
// local rank l in one NCCL group and receives the node's copies of its own segment into
// scratch; a reduce kernel per copy folds them in local-rank order. A node's ranks share an
// all-to-all fabric (NVLink, PCIe switches), where the L - 1 sends of one group run at once,
// and the segment's sum is made by one rank only, so every rank ends with the same bytes.
// The allgather inside is the same group reversed. NCCL addresses peers by communicator
// rank: the NCCL communicator is the communicator's (gpu_context.cc).
#include <algorithm>
#include <vector>

#include "collectives/gpu_collectives.h"
#include "cuda/reduce.cuh"
#include "hierarchy.h"

namespace gradcomm::detail {
namespace {

struct Segment {
  int64_t begin, end;
};

Segment segment_of(const TwoLevelPlan& plan, size_t local) {
  return {plan.segments[local], plan.segments[local + 1]};
}

struct Buffer {
  uint8_t* data;
  size_t bytes;
};

// One NCCL group with every other rank of this rank's node, on `stream`: to local rank l
// what `out(l)` names, from it into `in(l)`.
template <class Out, class In>
void exchange_inside(Op& op, GpuContext& gpu, const TwoLevelPlan& plan, cudaStream_t stream, const char* what,
                     Out&& out, In&& in) {
  std::vector<P2pOp> ops;
  uint64_t sent = 0, received = 0;
  for (size_t l = 0; l < plan.node.size(); ++l) {
    if (l == static_cast<size_t>(plan.local)) continue;
    const Buffer o = out(l), i = in(l);
    ops.push_back({P2pOp::kSend, plan.node[l], o.data, o.bytes});
    ops.push_back({P2pOp::kRecv, plan.node[l], i.data, i.bytes});
    sent += o.bytes;
    received += i.bytes;
  }
  if (ops.empty()) return;
  gpu.nccl()->group(ops, stream, what);
  op.count_wire(sent, received, ops.size() / 2);
}

// Step 1: this rank's segment ends holding the node's sum (kSum for kAvg; the divide
// comes after the level across). The copies land in scratch slots, in local-rank order.
void reduce_inside(Op& op, GpuContext& gpu, uint8_t* data, const TwoLevelPlan& plan, DType dtype,
                   ReduceOp sum_op, cudaStream_t stream) {
  const size_t local_size = plan.node.size();
  if (local_size == 1) return;
  const size_t elem = dtype_size(dtype);
  const Segment mine = segment_of(plan, static_cast<size_t>(plan.local));
  const size_t mine_bytes = static_cast<size_t>(mine.end - mine.begin) * elem;
  uint8_t* slots = gpu.scratch(std::max<size_t>(1, mine_bytes * (local_size - 1))).as<uint8_t>();
  const auto slot = [&](size_t l) { return slots + (l < static_cast<size_t>(plan.local) ? l : l - 1) * mine_bytes; };
  exchange_inside(
      op, gpu, plan, stream, "two levels: reduce-scatter inside the node",
      [&](size_t l) {
        const Segment theirs = segment_of(plan, l);
        return Buffer{data + static_cast<size_t>(theirs.begin) * elem,
                      static_cast<size_t>(theirs.end - theirs.begin) * elem};
      },
      [&](size_t l) { return Buffer{slot(l), mine_bytes}; });
  for (size_t s = 0; s + 1 < local_size; ++s) {
    launch_reduce_inplace(data + static_cast<size_t>(mine.begin) * elem, slots + s * mine_bytes, mine.end - mine.begin,
                          dtype, sum_op, 1, stream);
  }
}

// Step 3: every rank's segment to the other ranks of its node, in place.
void gather_inside(Op& op, GpuContext& gpu, uint8_t* data, const TwoLevelPlan& plan, DType dtype,
                   cudaStream_t stream) {
  const size_t elem = dtype_size(dtype);
  const auto segment = [&](size_t l) {
    const Segment s = segment_of(plan, l);
    return Buffer{data + static_cast<size_t>(s.begin) * elem, static_cast<size_t>(s.end - s.begin) * elem};
  };
  exchange_inside(op, gpu, plan, stream, "two levels: allgather inside the node",
                  [&](size_t) { return segment(static_cast<size_t>(plan.local)); }, segment);
}

}  // namespace

void nccl_two_level_allreduce(Op& op, GpuContext& gpu, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                              int64_t align, cudaStream_t stream,
                              const std::function<void(const TwoLevelPlan&)>& across) {
  if (numel == 0) return;
  const TwoLevelPlan plan = plan_two_levels(op.nodes(), op.rank(), numel, align);
  auto* bytes = static_cast<uint8_t*>(data);
  reduce_inside(op, gpu, bytes, plan, dtype, reduce_op == ReduceOp::kAvg ? ReduceOp::kSum : reduce_op, stream);
  across(plan);
  gather_inside(op, gpu, bytes, plan, dtype, stream);
}

void nccl_two_level_dense_allreduce(Op& op, GpuContext& gpu, void* data, int64_t numel, DType dtype,
                                    ReduceOp reduce_op, cudaStream_t stream) {
  const ReduceOp across_op = reduce_op == ReduceOp::kAvg ? ReduceOp::kSum : reduce_op;
  const size_t elem = dtype_size(dtype);
  auto* bytes = static_cast<uint8_t*>(data);
  nccl_two_level_allreduce(op, gpu, data, numel, dtype, reduce_op, /*align=*/1, stream, [&](const TwoLevelPlan& plan) {
    for (const Piece& piece : plan.pieces) {
      uint8_t* values = bytes + static_cast<size_t>(piece.begin) * elem;
      {
        const Op::View owners(op, piece.owners, 0);
        nccl_ring_allreduce(op, gpu, values, piece.end - piece.begin, dtype, across_op, stream);
      }
      if (reduce_op == ReduceOp::kAvg) launch_divide_inplace(values, piece.end - piece.begin, dtype, op.size(), stream);
    }
  });
}

}  // namespace gradcomm::detail
