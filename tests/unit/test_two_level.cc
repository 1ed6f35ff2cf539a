// The two-level collectives (src/hierarchy.h) over the in-process transport, ranks as
// threads placed on nodes: exact against a closed form for every dtype and op, bitwise
// identical on every rank, at 2x2, 3x2, 2x3, 3+2, 4x2 and degenerate shapes; compressed
// calls finite, identical, within their codec's reach of the exact sum, and top-k
// selecting once per node piece, checked against a reference that does so.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <numeric>

#include "compressors/spec.h"
#include "hierarchy.h"
#include "test_util.h"

namespace gradcomm {
namespace {

using testing::ScopedEnv;

// A topology written as node sizes, e.g. {3, 2}: ranks 0-2 on node "n0", 3-4 on "n1".
std::vector<std::string> nodes_of(const std::vector<int>& sizes) {
  std::vector<std::string> names;
  for (size_t n = 0; n < sizes.size(); ++n) {
    for (int i = 0; i < sizes[n]; ++i) names.push_back(fmt::format("n{}", n));
  }
  return names;
}
std::string shape_name(const std::vector<int>& sizes) {
  std::string s;
  for (int v : sizes) s += (s.empty() ? "" : "+") + std::to_string(v);
  return s;
}

const std::vector<std::vector<int>> kShapes = {{2, 2}, {2, 2, 2}, {3, 3}, {3, 2}, {2, 2, 2, 2}, {1, 3}, {2, 1, 2}};

// Rank r's contribution at i: small non-negative integers, exact in every dtype and sum.
double value(int r, int64_t i) { return static_cast<double>((3 * r + i) % 13); }

void run_on(const std::vector<int>& sizes, const std::function<void(Communicator&)>& fn) {
  for (auto& e : testing::run_ranks_on_nodes(nodes_of(sizes), fn)) {
    if (e) std::rethrow_exception(e);
  }
}

TEST(TwoLevelPlan, PiecesRefineEveryNodesSegmentsAndHaveOneOwnerPerNode) {
  const detail::NodeMap map = detail::NodeMap::from_names(nodes_of({3, 2}));
  std::map<std::pair<int64_t, int64_t>, std::vector<int>> seen;
  for (int r = 0; r < map.size(); ++r) {
    const detail::TwoLevelPlan plan = detail::plan_two_levels(map, r, 12, 1);
    for (const detail::Piece& p : plan.pieces) {
      EXPECT_EQ(p.owners.size(), 2u);
      EXPECT_EQ(p.owners[static_cast<size_t>(map.node_of(r))], r);
      seen[{p.begin, p.end}] = p.owners;
    }
  }
  // Node 0's cuts at 0, 4, 8, 12; node 1's at 0, 6, 12: four pieces.
  const std::map<std::pair<int64_t, int64_t>, std::vector<int>> want = {
      {{0, 4}, {0, 3}}, {{4, 6}, {1, 3}}, {{6, 8}, {1, 4}}, {{8, 12}, {2, 4}}};
  EXPECT_EQ(seen, want);
  // Nodes of one size: one piece per rank, its segment, owned by its local rank everywhere.
  const detail::NodeMap even = detail::NodeMap::from_names(nodes_of({2, 2}));
  const detail::TwoLevelPlan plan = detail::plan_two_levels(even, 3, 1000, 64);
  ASSERT_EQ(plan.pieces.size(), 1u);
  EXPECT_EQ(plan.pieces[0].owners, (std::vector<int>{1, 3}));
  EXPECT_EQ(plan.pieces[0].begin % 64, 0);
}

class TwoLevelDense : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(TwoLevelDense, EveryDtypeAndOpIsExactAndBitwiseIdentical) {
  const std::vector<int> sizes = GetParam();
  const int n = std::accumulate(sizes.begin(), sizes.end(), 0);
  ScopedEnv on("GRADCOMM_HIERARCHY", "on");
  for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{1003}, int64_t{300001}}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt32,
                        DType::kInt64, DType::kUInt8}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
        const auto want = testing::expected_allreduce(dtype, op, n, numel, value);
        std::vector<std::vector<uint8_t>> got(static_cast<size_t>(n));
        run_on(sizes, [&](Communicator& comm) {
          std::vector<uint8_t> data(static_cast<size_t>(numel) * dtype_size(dtype));
          for (int64_t i = 0; i < numel; ++i) testing::store_value(dtype, data.data(), i, value(comm.rank(), i));
          comm.allreduce(TensorView{data.data(), numel, dtype, {}}, op);
          got[static_cast<size_t>(comm.rank())] = data;
        });
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(got[static_cast<size_t>(r)], want)
              << shape_name(sizes) << " rank " << r << " numel " << numel << " " << dtype_name(dtype) << " "
              << reduce_op_name(op);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, TwoLevelDense, ::testing::ValuesIn(kShapes),
                         [](const auto& info) { return "n" + [&] {
                                                          std::string s;
                                                          for (int v : info.param) s += std::to_string(v) + "_";
                                                          return s;
                                                        }(); });

// reduce_scatter over two levels: each rank's share exact for every dtype and op.
TEST_P(TwoLevelDense, ReduceScatterIsExact) {
  const std::vector<int> sizes = GetParam();
  const int n = std::accumulate(sizes.begin(), sizes.end(), 0);
  ScopedEnv on("GRADCOMM_HIERARCHY", "on");
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{333}, int64_t{70001}}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt32,
                        DType::kUInt8}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
        const int64_t numel = count * n;
        const auto want = testing::expected_allreduce(dtype, op, n, numel, value);
        run_on(sizes, [&](Communicator& comm) {
          const size_t e = dtype_size(dtype);
          std::vector<uint8_t> in(static_cast<size_t>(numel) * e), out(static_cast<size_t>(count) * e);
          for (int64_t i = 0; i < numel; ++i) testing::store_value(dtype, in.data(), i, value(comm.rank(), i));
          const auto before = in;
          comm.reduce_scatter(TensorView{in.data(), numel, dtype, {}}, TensorView{out.data(), count, dtype, {}}, op);
          EXPECT_EQ(in, before) << "the input changed";
          const auto from = want.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(comm.rank() * count) * e);
          EXPECT_TRUE(std::equal(out.begin(), out.end(), from))
              << shape_name(sizes) << " rank " << comm.rank() << " count " << count << " " << dtype_name(dtype)
              << " " << reduce_op_name(op);
        });
      }
    }
  }
}

// Every family over two levels: finite, bitwise identical on every rank, and within its
// codec's reach of the exact sum (relative L2 error; the bound is the flat call's own
// error measured beside it, times 1.5, or 1e-2 for the casts), N-rank error feedback kept.
const char* kSpecs[] = {"fp16", "bf16", "quant:bits=8", "quant:bits=4,round=nearest", "qsgd", "sign",
                        "quant:bits=8,ef=1,inside=compress", "fp16:inside=compress",
                        "topk:ratio=0.05", "topk:k=37,select=sample", "randomk:ratio=0.1", "sketch:k=50",
                        "powersgd:rank=2"};

std::vector<float> gradient(int rank, int64_t n, int step) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    g[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i + 1) * static_cast<float>(rank + 2) + step);
  }
  return g;
}

struct Outcome {
  std::vector<std::vector<float>> out;  // per rank, the last step's result
  double error = 0;                     // relative L2 error of rank 0's last result
};

Outcome run_compressed(const std::vector<int>& sizes, const char* mode, const std::string& spec, ReduceOp op,
                   int64_t numel, int steps) {
  ScopedEnv env("GRADCOMM_HIERARCHY", mode);
  const int n = std::accumulate(sizes.begin(), sizes.end(), 0);
  Outcome run;
  run.out.resize(static_cast<size_t>(n));
  run_on(sizes, [&](Communicator& comm) {
    for (int s = 0; s < steps; ++s) {
      auto g = gradient(comm.rank(), numel, s);
      CompressOptions o{spec, "w", nullptr};
      if (spec.rfind("powersgd", 0) == 0) o.shape = {numel / 16, 16};
      comm.allreduce(TensorView::of(g.data(), numel), op, o);
      run.out[static_cast<size_t>(comm.rank())] = g;
    }
  });
  std::vector<double> exact(static_cast<size_t>(numel), 0.0);
  for (int r = 0; r < n; ++r) {
    const auto g = gradient(r, numel, steps - 1);
    for (int64_t i = 0; i < numel; ++i) exact[static_cast<size_t>(i)] += g[static_cast<size_t>(i)] / (op == ReduceOp::kAvg ? n : 1);
  }
  double num = 0, den = 0;
  for (int64_t i = 0; i < numel; ++i) {
    const double exact_i = exact[static_cast<size_t>(i)];
    num += (run.out[0][static_cast<size_t>(i)] - exact_i) * (run.out[0][static_cast<size_t>(i)] - exact_i);
    den += exact_i * exact_i;
  }
  run.error = std::sqrt(num / den);
  return run;
}

class TwoLevelCompressed : public ::testing::TestWithParam<const char*> {};

TEST_P(TwoLevelCompressed, FiniteIdenticalAndAsCloseAsFlat) {
  const std::string spec = GetParam();
  for (const std::vector<int>& sizes : {std::vector<int>{2, 2}, std::vector<int>{3, 2}, std::vector<int>{2, 2, 2},
                                        std::vector<int>{3, 3}, std::vector<int>{2, 2, 2, 2}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      const int64_t numel = 16 * 640;
      const Outcome two = run_compressed(sizes, "on", spec, op, numel, 3);
      const Outcome flat = run_compressed(sizes, "off", spec, op, numel, 3);
      const std::string where = fmt::format("{} {} {}", spec, shape_name(sizes), reduce_op_name(op));
      for (size_t r = 0; r < two.out.size(); ++r) {
        ASSERT_EQ(two.out[r], two.out[0]) << where << ": rank " << r << " differs from rank 0";
        for (float v : two.out[r]) ASSERT_TRUE(std::isfinite(v)) << where;
      }
      EXPECT_LE(two.error, std::max(1.5 * flat.error, 1e-2)) << where << ": two levels " << two.error << ", flat "
                                                             << flat.error;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Specs, TwoLevelCompressed, ::testing::ValuesIn(kSpecs), [](const auto& info) {
  std::string name = info.param;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
});

// CompressOptions::compress_inside_nodes is the spec's inside=compress (the same bytes), and
// the families it does not apply to refuse it, naming the key.
TEST(TwoLevelInside, TheOptionIsTheSpecKeyAndOtherFamiliesRefuseIt) {
  ScopedEnv on("GRADCOMM_HIERARCHY", "on");
  std::vector<std::vector<float>> by_key(4), by_option(4);
  run_on({2, 2}, [&](Communicator& comm) {
    auto a = gradient(comm.rank(), 5000, 0), b = a;
    comm.allreduce(TensorView::of(a.data(), 5000), ReduceOp::kSum, CompressOptions{"quant:bits=4,round=nearest,inside=compress", "", nullptr});
    CompressOptions o{"quant:bits=4,round=nearest", "", nullptr};
    o.compress_inside_nodes = true;
    comm.allreduce(TensorView::of(b.data(), 5000), ReduceOp::kSum, o);
    by_key[static_cast<size_t>(comm.rank())] = a;
    by_option[static_cast<size_t>(comm.rank())] = b;
    CompressOptions topk{"topk:ratio=0.1", "t", nullptr};
    topk.compress_inside_nodes = true;
    try {
      comm.allreduce(TensorView::of(a.data(), 5000), ReduceOp::kSum, topk);
      ADD_FAILURE() << "top-k accepted compress_inside_nodes";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("unknown key 'inside'"), std::string::npos) << e.what();
    }
  });
  EXPECT_EQ(by_key, by_option);
  EXPECT_EQ(detail::parse_compressor_spec("sign:inside=compress").canonical(),
            "sign:bucket=512,ef=1,min_numel=0,warmup=0,seed=0,inside=compress");
  EXPECT_EQ(detail::parse_compressor_spec("sign").canonical(), "sign:bucket=512,ef=1,min_numel=0,warmup=0,seed=0");
}

// Top-k across nodes selects once per piece, from the node's sum: the result is the sum
// over nodes of each node's top k of its piece (no error feedback, fp32 values, integer
// inputs so that every sum is exact and ties break to the lower index, as the select's).
TEST(TwoLevelTopk, SelectsOnceFromEachNodesSumOfItsPiece) {
  const std::vector<int> sizes = {2, 2};
  const int64_t numel = 4000;
  const double ratio = 0.05;
  ScopedEnv on("GRADCOMM_HIERARCHY", "on");
  std::vector<std::vector<float>> got(4);
  run_on(sizes, [&](Communicator& comm) {
    std::vector<float> x(static_cast<size_t>(numel));
    for (int64_t i = 0; i < numel; ++i) x[static_cast<size_t>(i)] = static_cast<float>((7 * comm.rank() + 3 * i) % 29) - 14;
    comm.allreduce(TensorView::of(x.data(), numel), ReduceOp::kSum,
                   CompressOptions{"topk:ratio=0.05,values=fp32,ef=0,algo=allgather", "", nullptr});
    got[static_cast<size_t>(comm.rank())] = x;
  });
  const detail::NodeMap map = detail::NodeMap::from_names(nodes_of(sizes));
  std::vector<float> want(static_cast<size_t>(numel), 0.0f);
  for (int local = 0; local < 2; ++local) {
    const detail::TwoLevelPlan plan = detail::plan_two_levels(map, local, numel, 1);
    for (const detail::Piece& piece : plan.pieces) {
      const int64_t len = piece.end - piece.begin;
      const auto k = static_cast<size_t>(std::llround(ratio * static_cast<double>(len)));
      for (int node = 0; node < 2; ++node) {
        std::vector<std::pair<float, int64_t>> sums;  // (node sum, index)
        for (int64_t i = piece.begin; i < piece.end; ++i) {
          float sum = 0;
          for (int r : map.members(node)) sum += static_cast<float>((7 * r + 3 * i) % 29) - 14;
          sums.emplace_back(sum, i);
        }
        std::stable_sort(sums.begin(), sums.end(),
                         [](const auto& a, const auto& b) { return std::abs(a.first) > std::abs(b.first); });
        for (size_t j = 0; j < k; ++j) want[static_cast<size_t>(sums[j].second)] += sums[j].first;
      }
    }
  }
  for (int r = 0; r < 4; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], want) << "rank " << r;
}

// The compressed reduce_scatter over two levels: exact inside, each block encoded once
// across; shares within one rounding per other node of the exact sum, and error feedback
// keeps the long-run sum (what this rank's encodes dropped comes back next step).
TEST(TwoLevelCompressedReduceScatter, SharesAreWithinOneRoundingPerNodeAndErrorFeedbackKeepsTheSum) {
  ScopedEnv on("GRADCOMM_HIERARCHY", "on");
  for (const std::vector<int>& sizes : {std::vector<int>{2, 2}, std::vector<int>{3, 2}}) {
    const int n = std::accumulate(sizes.begin(), sizes.end(), 0);
    const int64_t count = 2000;
    const int steps = 40;
    std::vector<std::vector<double>> total(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(count), 0));
    run_on(sizes, [&](Communicator& comm) {
      for (int s = 0; s < steps; ++s) {
        auto in = gradient(comm.rank(), n * count, 0);  // the same gradient every step
        std::vector<float> out(static_cast<size_t>(count));
        comm.reduce_scatter(TensorView::of(in.data(), n * count), TensorView::of(out.data(), count), ReduceOp::kSum,
                            CompressOptions{"quant:bits=4,ef=1", "rs", nullptr});
        for (int64_t i = 0; i < count; ++i) total[static_cast<size_t>(comm.rank())][static_cast<size_t>(i)] += out[static_cast<size_t>(i)];
      }
    });
    std::vector<std::vector<float>> g(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) g[static_cast<size_t>(q)] = gradient(q, n * count, 0);
    double num = 0, den = 0;
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < count; ++i) {
        double exact = 0;
        for (int q = 0; q < n; ++q) exact += g[static_cast<size_t>(q)][static_cast<size_t>(r * count + i)];
        const double mean = total[static_cast<size_t>(r)][static_cast<size_t>(i)] / steps;
        num += (mean - exact) * (mean - exact);
        den += exact * exact;
      }
    }
    EXPECT_LT(std::sqrt(num / den), 0.01) << shape_name(sizes);  // one step alone: about 0.1
  }
}

// compressor=auto over two levels prices the level it compresses: every rank reviews (its
// probe runs among its local rank's peers of the other nodes, all groups at once), the
// ranks agree on each choice, and the results stay bitwise identical.
TEST(TwoLevelAuto, ChoicesAgreeAndResultsAreIdentical) {
  ScopedEnv on("GRADCOMM_HIERARCHY", "on");
  for (const std::vector<int>& sizes : {std::vector<int>{2, 2}, std::vector<int>{3, 2}}) {
    const int n = std::accumulate(sizes.begin(), sizes.end(), 0);
    std::vector<std::vector<float>> out(static_cast<size_t>(n));
    std::vector<std::string> chosen(static_cast<size_t>(n));
    run_on(sizes, [&](Communicator& comm) {
      for (int s = 0; s < 14; ++s) {  // past the second review (step 10)
        auto g = gradient(comm.rank(), 40000, s);
        comm.allreduce(TensorView::of(g.data(), 40000), ReduceOp::kAvg,
                       CompressOptions{"auto:review=5,among=none|quant:bits=4,ef=1|topk:ratio=0.01", "k", nullptr});
        out[static_cast<size_t>(comm.rank())] = g;
      }
      const Stats st = comm.stats();
      ASSERT_EQ(st.auto_choices.size(), 1u);
      chosen[static_cast<size_t>(comm.rank())] = st.auto_choices[0].chosen;
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(out[static_cast<size_t>(r)], out[0]) << shape_name(sizes) << " rank " << r;
      EXPECT_EQ(chosen[static_cast<size_t>(r)], chosen[0]) << shape_name(sizes) << " rank " << r;
    }
  }
}

// The two levels run unless GRADCOMM_HIERARCHY=off, and only where the nodes differ:
// a message count tells (the node phases are messages the flat ring does not send).
TEST(TwoLevel, HierarchyModesChooseTheSchedule) {
  ScopedEnv one_chunk("GRADCOMM_CHUNK_BYTES", "64M");  // a message per ring step
  ScopedEnv no_fusion("GRADCOMM_FUSION_BYTES", "0");   // no plan messages from rank 0
  const auto messages = [](const char* mode, const std::vector<int>& sizes) {
    ScopedEnv env("GRADCOMM_HIERARCHY", mode);
    std::vector<uint64_t> sent(static_cast<size_t>(std::accumulate(sizes.begin(), sizes.end(), 0)));
    run_on(sizes, [&](Communicator& comm) {
      std::vector<float> x(1 << 20, 1.0f);
      comm.allreduce(TensorView::of(x.data(), 1 << 20));
      sent[static_cast<size_t>(comm.rank())] = comm.stats().messages_sent;
    });
    return sent[0];
  };
  // 2 x 2 ranks: the flat ring takes 2 (N - 1) = 6 steps; two levels 1 inside, 2 across,
  // 1 inside: 4 (and the call header, one message, in both).
  const uint64_t flat = messages("off", {2, 2}), two = messages("auto", {2, 2});
  EXPECT_EQ(flat, 7u);
  EXPECT_EQ(two, 5u);
  // One node, or a rank per node: auto stays flat (the same bytes as off).
  EXPECT_EQ(messages("auto", {4}), messages("off", {4}));
  EXPECT_EQ(messages("auto", {1, 1, 1}), messages("off", {1, 1, 1}));
  ScopedEnv bad("GRADCOMM_HIERARCHY", "sometimes");
  EXPECT_THROW(detail::use_two_levels(detail::NodeMap::from_names(nodes_of({2, 2}))), InvalidArgument);
}

}  // namespace
}  // namespace gradcomm
