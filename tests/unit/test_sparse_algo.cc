// Top-k's two collectives (src/collectives/sparse_allreduce.cc) on N = 1..8 threads:
// the sparse reduce-scatter equals an independent reference of its rule, equals the
// allgather bit for bit where every region keeps every entry, is bitwise identical on
// every rank, and conserves the gradient with error feedback (outputs + residuals =
// inputs); the automatic choice follows the α–β model.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "collectives/collectives.h"
#include "compressors/family.h"
#include "compressors/spec.h"
#include "compressors/sparse/sparse.h"
#include "introspect.h"
#include "test_util.h"

namespace gradcomm {
namespace {

using detail::CompressorSpec;
using detail::parse_compressor_spec;
using detail::SparseAlgo;

std::vector<float> gradient(int rank, int64_t n, uint32_t seed) {
  return testing::normal_gradient(rank, n, seed);
}

struct Result {
  std::vector<std::vector<float>> out;       // per rank
  std::vector<std::vector<float>> residual;  // per rank (empty without error feedback)
};

// Each rank allreduces inputs[rank] once (or `steps` times, keeping the last output).
Result run(int n, const std::vector<std::vector<float>>& inputs, const std::string& spec, ReduceOp op,
           int steps = 1) {
  Result res;
  res.out.resize(n);
  res.residual.resize(n);
  testing::run_ranks(n, [&](Communicator& comm) {
    for (int s = 0; s < steps; ++s) {
      auto g = inputs[comm.rank()];
      comm.allreduce(TensorView::of(g.data(), static_cast<int64_t>(g.size())), op, CompressOptions{spec, "g", nullptr});
      res.out[comm.rank()] = g;
    }
    const auto r = detail::residual_view(comm, "g");
    res.residual[comm.rank()].assign(r.begin(), r.end());
  });
  return res;
}

// Positions of the k largest |x| (ties to the lower index), increasing.
std::vector<int64_t> own_topk(const std::vector<float>& x, int64_t k) {
  std::vector<int64_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return std::abs(x[a]) > std::abs(x[b]); });
  order.resize(static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(x.size()))));
  std::sort(order.begin(), order.end());
  return order;
}

// The reduce-scatter's rule, written from its description: every rank's own top-k,
// summed per index in rank order onto +0.0; region s = [s*n/N, (s+1)*n/N) keeps its
// ceil(k/N) largest sums by magnitude (ties to the lower index); fp32 values.
std::vector<float> reference(const std::vector<std::vector<float>>& inputs, int64_t k) {
  const int n = static_cast<int>(inputs.size());
  const int64_t numel = static_cast<int64_t>(inputs[0].size());
  std::vector<float> sum(static_cast<size_t>(numel), 0.0f);
  std::vector<bool> touched(static_cast<size_t>(numel), false);
  for (const auto& x : inputs) {
    for (int64_t i : own_topk(x, k)) {
      sum[i] += x[i];
      touched[i] = true;
    }
  }
  std::vector<float> out(static_cast<size_t>(numel), 0.0f);
  const int64_t budget = std::max<int64_t>(1, (k + n - 1) / n);
  for (int s = 0; s < n; ++s) {
    const int64_t b = numel * s / n, e = numel * (s + 1) / n;
    std::vector<int64_t> idx;
    for (int64_t i = b; i < e; ++i) {
      if (touched[i]) idx.push_back(i);
    }
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t c) { return std::abs(sum[a]) > std::abs(sum[c]); });
    if (static_cast<int64_t>(idx.size()) > budget) idx.resize(static_cast<size_t>(budget));
    for (int64_t i : idx) out[i] = sum[i];
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<std::vector<float>> inputs_for(int n, int64_t numel, uint32_t seed) {
  std::vector<std::vector<float>> in;
  for (int r = 0; r < n; ++r) in.push_back(gradient(r, numel, seed));
  return in;
}

TEST(SparseReduceScatter, MatchesTheReferenceRuleOnOneToEightRanks) {
  for (int n = 1; n <= 8; ++n) {
    for (int64_t numel : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{20011}}) {
      SCOPED_TRACE(fmt::format("N={} numel={}", n, numel));
      const int64_t k = std::max<int64_t>(1, numel / 50);
      const auto in = inputs_for(n, numel, 3);
      const auto res = run(n, in, fmt::format("topk:k={},ef=0,values=fp32,algo=reduce_scatter", k), ReduceOp::kSum);
      const auto want = reference(in, k);
      for (int r = 0; r < n; ++r) ASSERT_TRUE(same_bits(res.out[r], want)) << "rank " << r;
    }
  }
}

// Every rank selects the same positions, q per region: every region keeps every entry,
// so the reduce-scatter's output (and residual) is the allgather's, bit for bit.
TEST(SparseReduceScatter, EqualsTheAllgatherWhereEveryEntryIsKept) {
  for (int n = 1; n <= 8; ++n) {
    const int64_t q = 13, m = 997;  // per region: q spikes among m elements
    const int64_t numel = m * n, k = q * n;
    std::vector<std::vector<float>> in(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      in[r] = gradient(r, numel, 5);
      for (auto& v : in[r]) v *= 1e-3f;
      for (int s = 0; s < n; ++s) {
        for (int64_t t = 0; t < q; ++t) in[r][s * m + t * (m / q)] = 10.0f + static_cast<float>(r + t) * 0.37f;
      }
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      SCOPED_TRACE(fmt::format("N={} op={}", n, op == ReduceOp::kSum ? "sum" : "avg"));
      const std::string base = fmt::format("topk:k={},values=fp32,algo=", k);
      const auto ag = run(n, in, base + "allgather", op, 2);
      const auto rs = run(n, in, base + "reduce_scatter", op, 2);
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(same_bits(rs.out[r], ag.out[r])) << "rank " << r;
        ASSERT_TRUE(same_bits(rs.residual[r], ag.residual[r])) << "rank " << r;
      }
    }
  }
}

TEST(SparseReduceScatter, BitwiseIdenticalOnEveryRankWhateverTheFormat) {
  for (int n = 2; n <= 8; ++n) {
    for (const char* format : {"values=bf16", "values=fp16,indices=raw", "select=sample,values=fp32"}) {
      SCOPED_TRACE(fmt::format("N={} {}", n, format));
      const auto res = run(n, inputs_for(n, 30011, 7), fmt::format("topk:ratio=0.02,algo=reduce_scatter,{}", format),
                           ReduceOp::kAvg, 3);
      for (int r = 1; r < n; ++r) ASSERT_TRUE(same_bits(res.out[r], res.out[0])) << "rank " << r;
      const auto nonzero = std::count_if(res.out[0].begin(), res.out[0].end(), [](float v) { return v != 0.0f; });
      EXPECT_GT(nonzero, 0);
      EXPECT_LE(nonzero, static_cast<long>(n * ((600 + n - 1) / n)));  // N regions of ceil(k/N)
    }
  }
}

// One step from an empty residual: the sum of the outputs' shares and every rank's
// residual is the sum of the inputs, element by element (to fp32 rounding of the
// additions), for both algorithms and every value type.
TEST(SparseReduceScatter, ErrorFeedbackConservesTheGradient) {
  for (int n : {1, 2, 3, 5, 8}) {
    for (const char* algo : {"allgather", "reduce_scatter"}) {
      for (const char* values : {"fp32", "bf16", "fp16"}) {
        SCOPED_TRACE(fmt::format("N={} algo={} values={}", n, algo, values));
        const int64_t numel = 12007;
        const auto in = inputs_for(n, numel, 11);
        const auto res = run(n, in, fmt::format("topk:ratio=0.01,algo={},values={}", algo, values), ReduceOp::kSum);
        for (int64_t i = 0; i < numel; ++i) {
          double input = 0, kept = res.out[0][i], magnitude = std::abs(res.out[0][i]);
          for (int r = 0; r < n; ++r) {
            input += in[r][i];
            kept += res.residual[r][i];
            magnitude += std::abs(in[r][i]) + std::abs(res.residual[r][i]);
          }
          ASSERT_NEAR(kept, input, 4 * n * std::ldexp(magnitude, -24) + 1e-30) << "element " << i;
        }
      }
    }
  }
}

// With error feedback the long-run sum of the outputs tracks the sum of the inputs,
// although each step keeps only ceil(k/N) entries per region.
TEST(SparseReduceScatter, LongRunSumConverges) {
  const int n = 4;
  const int64_t numel = 4096;
  const auto in = inputs_for(n, numel, 99);
  std::vector<double> exact(numel, 0.0), total(numel, 0.0);
  for (const auto& x : in) {
    for (int64_t i = 0; i < numel; ++i) exact[i] += x[i];
  }
  auto gap_after = [&](int steps) {
    std::fill(total.begin(), total.end(), 0.0);
    testing::run_ranks(n, [&](Communicator& comm) {
      for (int s = 0; s < steps; ++s) {
        auto g = in[comm.rank()];
        comm.allreduce(TensorView::of(g.data(), numel), ReduceOp::kSum,
                       CompressOptions{"topk:ratio=0.02,algo=reduce_scatter", "w", nullptr});
        if (comm.rank() == 0) {
          for (int64_t i = 0; i < numel; ++i) total[i] += g[i];
        }
      }
    });
    double num = 0, den = 0;
    for (int64_t i = 0; i < numel; ++i) {
      num += (total[i] - steps * exact[i]) * (total[i] - steps * exact[i]);
      den += steps * exact[i] * steps * exact[i];
    }
    return std::sqrt(num / den);
  };
  const double at_10 = gap_after(10), at_80 = gap_after(80);
  EXPECT_LT(at_80, at_10 * 0.5) << at_10 << " -> " << at_80;
}

// algo=auto: the allgather at two ranks, for small payloads and while the owner's work
// (70 ns per entry) costs more than the bytes it saves; the reduce-scatter where N-1
// payloads cost more than that and its extra messages (10 Gbit/s, 30 µs assumed).
// The shape top-k's spec gives the exchange (SparseOps::shape).
detail::SparseShape shape_of(const std::string& text) {
  const CompressorSpec spec = parse_compressor_spec(text);
  return detail::sparse_ops(spec).shape(spec);
}

TEST(SparseAlgoChoice, FollowsTheModel) {
  const detail::SparseShape one_percent = shape_of("topk:ratio=0.01");
  const int64_t mb100 = 25 << 20, mb4 = 1 << 20;
  EXPECT_EQ(detail::choose_sparse_algo(one_percent, 1, mb100), SparseAlgo::kAllgather);
  EXPECT_EQ(detail::choose_sparse_algo(one_percent, 2, mb100), SparseAlgo::kAllgather);
  EXPECT_EQ(detail::choose_sparse_algo(one_percent, 8, mb100), SparseAlgo::kAllgather);
  EXPECT_EQ(detail::choose_sparse_algo(one_percent, 64, mb100), SparseAlgo::kReduceScatter);
  EXPECT_EQ(detail::choose_sparse_algo(one_percent, 1024, mb100), SparseAlgo::kReduceScatter);
  EXPECT_EQ(detail::choose_sparse_algo(one_percent, 64, mb4), SparseAlgo::kAllgather);  // latency-bound
  // The crossover for 100 MB at 1 %: allgather up to some N, reduce-scatter from there on.
  int first_rs = 0;
  for (int n = 2; n <= 1024 && first_rs == 0; ++n) {
    if (detail::choose_sparse_algo(one_percent, n, mb100) == SparseAlgo::kReduceScatter) first_rs = n;
  }
  EXPECT_GT(first_rs, 8);
  EXPECT_LT(first_rs, 64);
  for (int n = first_rs; n <= 1024; n *= 2) EXPECT_EQ(detail::choose_sparse_algo(one_percent, n, mb100), SparseAlgo::kReduceScatter) << n;
  // The spec's key overrides the model.
  EXPECT_EQ(detail::choose_sparse_algo(shape_of("topk:ratio=0.01,algo=allgather"), 8, 25 << 20),
            SparseAlgo::kAllgather);
  EXPECT_EQ(detail::choose_sparse_algo(shape_of("topk:ratio=0.01,algo=reduce_scatter"), 2, 1000),
            SparseAlgo::kReduceScatter);
}

}  // namespace
}  // namespace gradcomm
