// The two-level schedules (hierarchy.h, docs/two-levels.md): inside the nodes, across
// them, inside again, each phase the flat algorithm in a View of its group.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>

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

ScheduleMode schedule_mode_from_env() {
  const std::string mode = env_string("GRADCOMM_SCHEDULE").value_or("auto");
  if (mode == "auto") return ScheduleMode::kAuto;
  if (mode == "ring") return ScheduleMode::kRing;
  if (mode == "direct") return ScheduleMode::kDirect;
  throw InvalidArgument(fmt::format("GRADCOMM_SCHEDULE='{}' unknown; accepted: auto, ring, direct", mode.substr(0, 40)));
}

uint32_t levels_digest(const NodeMap& nodes, bool two_levels, ScheduleMode schedule) {
  uint32_t h = nodes.digest();
  for (const uint8_t byte : {static_cast<uint8_t>(two_levels), static_cast<uint8_t>(schedule)}) {
    h ^= byte;  // FNV-1a, continued
    h *= 16777619u;
  }
  return h;
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
                         uint32_t unit_base, const std::function<void(int64_t, int64_t)>& across, Inside inside) {
  const TwoLevelPlan plan = plan_two_levels(op.nodes(), op.rank(), numel, align);
  const ReduceOp sum_op = reduce_op == ReduceOp::kAvg ? ReduceOp::kSum : reduce_op;
  auto* bytes = static_cast<uint8_t*>(data);
  const size_t elem = dtype_size(dtype);
  if (inside == Inside::kReduce) {  // 1. The node's reduce-scatter: local rank l ends with the node's sum of segment l.
    const Op::View node(op, plan.node, 0);
    ring_reduce_scatter(op, data, numel, dtype, sum_op, unit_base, align);
  }
  // 2. Each piece across the nodes, by its owners.
  two_level_across(op, plan, bytes + static_cast<size_t>(plan.segments[static_cast<size_t>(plan.local)]) * elem, dtype,
                   reduce_op, across);
  // 3. The node's allgather of its segments.
  const Op::View node(op, plan.node, 0);
  if (plan.node.size() > 1) {
    std::vector<int64_t> counts(plan.node.size());
    for (size_t l = 0; l < counts.size(); ++l) counts[l] = plan.segments[l + 1] - plan.segments[l];
    ring_allgatherv(op, bytes, counts, elem, unit_base);
  }
}

void two_level_across(Op& op, const TwoLevelPlan& plan, void* segment, DType dtype, ReduceOp reduce_op,
                      const std::function<void(int64_t, int64_t)>& across) {
  const int64_t first = plan.segments[static_cast<size_t>(plan.local)];
  const size_t elem = dtype_size(dtype);
  for (const Piece& piece : plan.pieces) {
    {
      const Op::View owners(op, piece.owners, 0);
      across(piece.begin, piece.end);
    }
    if (reduce_op == ReduceOp::kAvg) {
      Op::PhaseTimer timer(op, &Stats::reduce_s);
      divide_inplace(static_cast<uint8_t*>(segment) + static_cast<size_t>(piece.begin - first) * elem,
                     piece.end - piece.begin, dtype, op.nodes().size());
    }
  }
}

void two_level_reduce_scatter(Op& op, void* data, int64_t count, DType dtype, ReduceOp reduce_op,
                              BlockCodec* codec) {
  const NodeMap& nodes = op.nodes();
  const int n = nodes.size(), me = op.rank(), my_node = nodes.node_of(me);
  const std::vector<int>& node = nodes.members(my_node);
  const auto local_size = static_cast<int>(node.size());
  const size_t elem = dtype_size(dtype);
  const size_t block = static_cast<size_t>(count) * elem;
  const auto holder = [&](int node_index, int g) {  // the local rank of node `node_index` that holds block g
    if (nodes.node_of(g) == node_index) return nodes.local_rank(g);
    return nodes.local_rank(g) % static_cast<int>(nodes.members(node_index).size());
  };
  // 1. Inside: the blocks packed by holder, then each holder's run summed over the node.
  std::vector<int> order;  // blocks in packed order
  std::vector<int64_t> starts{0};
  for (int l = 0; l < local_size; ++l) {
    for (int g = 0; g < n; ++g) {
      if (holder(my_node, g) == l) order.push_back(g);
    }
    starts.push_back(static_cast<int64_t>(order.size()) * count);
  }
  auto* base = static_cast<uint8_t*>(data);
  const auto packed = std::make_unique_for_overwrite<uint8_t[]>(std::max<size_t>(1, block * static_cast<size_t>(n)));
  for (size_t j = 0; j < order.size(); ++j) std::memcpy(packed.get() + j * block, base + static_cast<size_t>(order[j]) * block, block);
  const ReduceOp sum = reduce_op == ReduceOp::kAvg ? ReduceOp::kSum : reduce_op;
  {
    const Op::View inside(op, node, 0);
    if (local_size > 1 && count > 0) direct_reduce_scatter(op, packed.get(), starts, dtype, sum);
  }
  // 2. Across: the blocks this rank holds to their ranks; its own block's partials from
  // the other nodes' holders, added in node order.
  const int local = nodes.local_rank(me);
  const auto first = static_cast<size_t>(starts[static_cast<size_t>(local)] / std::max<int64_t>(count, 1));
  const auto last = static_cast<size_t>(starts[static_cast<size_t>(local) + 1] / std::max<int64_t>(count, 1));
  uint8_t* own = nullptr;
  std::vector<RequestPtr> sends;
  std::vector<std::vector<uint8_t>> payloads;
  for (size_t j = first; j < last && count > 0; ++j) {
    const int g = order[j];
    uint8_t* partial = packed.get() + j * block;
    if (g == me) {
      own = partial;
      continue;
    }
    if (codec == nullptr) {
      sends.push_back(op.send(g, 0, partial, block));
      continue;
    }
    std::vector<uint8_t>& payload = payloads.emplace_back(codec->bytes(count));
    {
      Op::PhaseTimer timer(op, &Stats::encode_s);
      codec->encode(reinterpret_cast<float*>(partial), count, static_cast<int64_t>(g) * count, payload.data());
    }
    sends.push_back(op.send(g, 0, payload.data(), payload.size()));
  }
  if (count > 0) {
    std::vector<std::vector<uint8_t>> inbox(static_cast<size_t>(nodes.nodes()));
    std::vector<RequestPtr> recvs(static_cast<size_t>(nodes.nodes()));
    for (int m = 0; m < nodes.nodes(); ++m) {
      if (m == my_node) continue;
      const int from = nodes.members(m)[static_cast<size_t>(holder(m, me))];
      inbox[static_cast<size_t>(m)].resize(codec == nullptr ? block : codec->bytes(count));
      recvs[static_cast<size_t>(m)] =
          op.recv(from, 0, inbox[static_cast<size_t>(m)].data(), inbox[static_cast<size_t>(m)].size());
    }
    for (int m = 0; m < nodes.nodes(); ++m) {
      if (m == my_node) continue;
      op.wait(*recvs[static_cast<size_t>(m)], "reduce-scatter across nodes");
      if (codec == nullptr) {
        Op::PhaseTimer timer(op, &Stats::reduce_s);
        reduce_inplace(own, inbox[static_cast<size_t>(m)].data(), count, dtype, sum);
      } else {
        Op::PhaseTimer timer(op, &Stats::decode_s);
        codec->decode_add(inbox[static_cast<size_t>(m)], count, reinterpret_cast<float*>(own));
      }
    }
    if (reduce_op == ReduceOp::kAvg) {
      Op::PhaseTimer timer(op, &Stats::reduce_s);
      divide_inplace(own, count, dtype, n);
    }
    std::memcpy(base + static_cast<size_t>(me) * block, own, block);
  }
  op.wait_all(sends, "reduce-scatter across nodes: send");
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
