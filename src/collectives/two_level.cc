// The two-level schedules (hierarchy.h, docs/two-levels.md): inside the nodes, across
// them, inside again, each phase the flat algorithm in a View of its group.
#include <fmt/format.h>

#include <algorithm>

#include "collectives/collectives.h"
#include "env.h"
#include "gradcomm/errors.h"
#include "hierarchy.h"
#include "reduce.h"

namespace gradcomm::detail {

bool use_two_levels(const NodeMap& nodes) {
  const std::string mode = env_string("GRADCOMM_HIERARCHY").value_or("auto");
  if (mode == "auto") return nodes.two_levels();
  if (mode == "on") return nodes.size() > 1;
  if (mode == "off") return false;
  throw InvalidArgument(fmt::format("GRADCOMM_HIERARCHY='{}' unknown; accepted: auto, on, off", mode.substr(0, 40)));
}

TwoLevelPlan plan_two_levels(const NodeMap& nodes, int rank, int64_t numel, int64_t align) {
  TwoLevelPlan plan;
  const int me = nodes.node_of(rank);
  plan.node = nodes.members(me);
  plan.local = nodes.local_rank(rank);
  // Every node's segments (the same formula as its ring's), and their common refinement.
  std::vector<std::vector<int64_t>> starts(static_cast<size_t>(nodes.nodes()));
  std::vector<int64_t> cuts;
  for (int n = 0; n < nodes.nodes(); ++n) {
    starts[static_cast<size_t>(n)] = ring_segments(numel, static_cast<int>(nodes.members(n).size()), align);
    cuts.insert(cuts.end(), starts[static_cast<size_t>(n)].begin(), starts[static_cast<size_t>(n)].end());
  }
  plan.segments = starts[static_cast<size_t>(me)];
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  const int64_t mine_begin = plan.segments[static_cast<size_t>(plan.local)];
  const int64_t mine_end = plan.segments[static_cast<size_t>(plan.local) + 1];
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    const int64_t b = cuts[c], e = cuts[c + 1];
    if (b < mine_begin || e > mine_end) continue;
    Piece piece{b, e, {}};
    for (int n = 0; n < nodes.nodes(); ++n) {
      const std::vector<int64_t>& s = starts[static_cast<size_t>(n)];
      // The segment of node n holding b: the last start at or before b with a non-empty segment.
      const auto l = std::upper_bound(s.begin(), s.end() - 1, b) - s.begin() - 1;
      piece.owners.push_back(nodes.members(n)[static_cast<size_t>(l)]);
    }
    plan.pieces.push_back(std::move(piece));
  }
  return plan;
}

void two_level_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op, int64_t align,
                         uint32_t unit_base, const std::function<void(int64_t, int64_t)>& across) {
  const TwoLevelPlan plan = plan_two_levels(op.nodes(), op.rank(), numel, align);
  const ReduceOp inside = reduce_op == ReduceOp::kAvg ? ReduceOp::kSum : reduce_op;
  auto* bytes = static_cast<uint8_t*>(data);
  const size_t elem = dtype_size(dtype);
  {  // 1. The node's reduce-scatter: local rank l ends with the node's sum of segment l.
    const Op::View node(op, plan.node, 0);
    ring_reduce_scatter(op, data, numel, dtype, inside, unit_base, align);
  }
  for (const Piece& piece : plan.pieces) {  // 2. Each piece across the nodes, by its owners.
    const Op::View owners(op, piece.owners, 0);
    across(piece.begin, piece.end);
    if (reduce_op == ReduceOp::kAvg) {
      Op::PhaseTimer timer(op, &Stats::reduce_s);
      divide_inplace(bytes + static_cast<size_t>(piece.begin) * elem, piece.end - piece.begin, dtype,
                     op.nodes().size());
    }
  }
  // 3. The node's allgather of its segments.
  const Op::View node(op, plan.node, 0);
  if (plan.node.size() > 1) {
    std::vector<int64_t> counts(plan.node.size());
    for (size_t l = 0; l < counts.size(); ++l) counts[l] = plan.segments[l + 1] - plan.segments[l];
    ring_allgatherv(op, bytes, counts, elem, unit_base);
  }
}

void two_level_dense_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                               uint32_t unit_base) {
  const ReduceOp across_op = reduce_op == ReduceOp::kAvg ? ReduceOp::kSum : reduce_op;
  const size_t elem = dtype_size(dtype);
  two_level_allreduce(op, data, numel, dtype, reduce_op, /*align=*/1, unit_base, [&](int64_t b, int64_t e) {
    dense_allreduce(op, static_cast<uint8_t*>(data) + static_cast<size_t>(b) * elem, e - b, dtype, across_op,
                    unit_base);
  });
}

void two_level_by_leaders(Op& op, float* data, int64_t numel, ReduceOp reduce_op,
                          const std::function<void()>& leaders) {
  const NodeMap& nodes = op.nodes();
  const std::vector<int>& node = nodes.members(nodes.node_of(op.rank()));
  {
    const Op::View inside(op, node, 0);
    dense_allreduce(op, data, numel, DType::kFloat32, ReduceOp::kSum);
  }
  if (op.rank() == node.front()) {  // the node's first rank compresses across
    std::vector<int> firsts;
    for (int n = 0; n < nodes.nodes(); ++n) firsts.push_back(nodes.members(n).front());
    {
      const Op::View across(op, firsts, 0);
      leaders();
    }
    if (reduce_op == ReduceOp::kAvg) {
      Op::PhaseTimer timer(op, &Stats::reduce_s);
      divide_inplace(data, numel, DType::kFloat32, nodes.size());
    }
  }
  const Op::View inside(op, node, 0);
  if (op.size() > 1 && numel > 0) chain_broadcast(op, data, numel * static_cast<int64_t>(sizeof(float)), 0);
}

}  // namespace gradcomm::detail
