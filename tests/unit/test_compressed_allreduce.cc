// Compressed allreduce (and reduce_scatter) over the in-process transport: every spec
// gives finite results, bitwise identical on every rank; top-k sums each rank's own
// top-k; casts stay within their rounding; error feedback keeps the long-run sum.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "compressors/spec.h"
#include "introspect.h"
#include "test_util.h"

namespace gradcomm {
namespace {

const char* kSpecs[] = {"fp16",
                        "bf16",
                        "topk:ratio=0.01",
                        "topk:k=37,select=sample",
                        "topk:ratio=0.05,values=fp16",
                        "randomk:ratio=0.02",
                        "qsgd",
                        "qsgd:levels=4,bucket=128",
                        "quant:bits=8",
                        "quant:bits=4,round=nearest",
                        "quant:bits=2,bucket=64",
                        "quant:bits=1",
                        "sign",
                        "sketch:k=50",
                        "sketch:rows=3,cols=512,ratio=0.01,values=fp16"};

std::vector<float> gradient(int rank, int64_t n, uint32_t seed = 1) {
  return testing::normal_gradient(rank, n, seed);
}

std::vector<std::vector<float>> run_compressed(int n, int64_t numel, const std::string& spec, ReduceOp op,
                                               int steps = 1) {
  std::vector<std::vector<float>> out(n);
  testing::run_ranks(n, [&](Communicator& comm) {
    for (int s = 0; s < steps; ++s) {
      auto g = gradient(comm.rank(), numel, s + 1);
      comm.allreduce(TensorView::of(g.data(), numel), op, CompressOptions{spec, "grad", nullptr});
      out[comm.rank()] = g;
    }
  });
  return out;
}

class EverySpec : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

TEST_P(EverySpec, FiniteAndBitwiseIdenticalOnEveryRank) {
  const auto [spec, n] = GetParam();
  for (int64_t numel : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    SCOPED_TRACE(fmt::format("{} N={} numel={}", spec, n, numel));
    const auto out = run_compressed(n, numel, spec, ReduceOp::kAvg, 2);
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(std::all_of(out[r].begin(), out[r].end(), [](float v) { return std::isfinite(v); }));
      ASSERT_TRUE(testing::same_bytes(out[r].data(), out[0].data(), out[0].size() * sizeof(float))) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Compressors, EverySpec,
                         ::testing::Combine(::testing::ValuesIn(kSpecs), ::testing::Values(1, 2, 3, 4)),
                         [](const ::testing::TestParamInfo<std::tuple<const char*, int>>& info) {
                           std::string name = std::get<0>(info.param);
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name + "_N" + std::to_string(std::get<1>(info.param));
                         });

// Reference: each rank's own top-k (largest |x|, ties to the lower index), summed.
TEST(CompressedAllreduce, TopkSumsEachRanksOwnTopk) {
  const int n = 3;
  const int64_t numel = 20000, k = 200;
  const auto out = run_compressed(n, numel, "topk:k=200,ef=0,values=fp32", ReduceOp::kSum);
  std::vector<float> expected(numel, 0.0f);
  for (int r = 0; r < n; ++r) {
    const auto g = gradient(r, numel, 1);
    std::vector<int64_t> order(numel);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return std::abs(g[a]) > std::abs(g[b]); });
    for (int64_t j = 0; j < k; ++j) expected[order[j]] += g[order[j]];
  }
  // Summed in rank order like the decoder: exact equality.
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r], expected) << "rank " << r;
}

TEST(CompressedAllreduce, Fp16StaysWithinRoundingOfTheExactSum) {
  for (int n : {2, 3, 4}) {
    const int64_t numel = 50000;
    const auto out = run_compressed(n, numel, "fp16", ReduceOp::kSum);
    for (int64_t i = 0; i < numel; ++i) {
      double exact = 0, magnitude = 0;
      for (int r = 0; r < n; ++r) {
        exact += gradient(r, numel, 1)[i];
        magnitude += std::abs(gradient(r, numel, 1)[i]);
      }
      // One rounding per hop (N-1 of them) plus the owner's final one, each <= 2^-11 relative.
      ASSERT_LE(std::abs(out[0][i] - exact), n * std::ldexp(magnitude, -11) + 1e-6) << "N=" << n << " i=" << i;
      if (i == 200) break;  // gradient() regenerates the whole vector: check a prefix
    }
  }
}

// A fixed gradient, allreduced T times: with error feedback the total of the
// outputs tracks T times the exact sum (the residual stays bounded); without it
// the same elements are dropped every time.
double relative_gap(const std::string& spec, int steps) {
  const int n = 2;
  const int64_t numel = 4096;
  std::vector<double> total(numel, 0.0), exact(numel, 0.0);
  for (int r = 0; r < n; ++r) {
    const auto g = gradient(r, numel, 99);
    for (int64_t i = 0; i < numel; ++i) exact[i] += g[i] * steps;
  }
  std::vector<std::vector<float>> outs(n);
  testing::run_ranks(n, [&](Communicator& comm) {
    for (int s = 0; s < steps; ++s) {
      auto g = gradient(comm.rank(), numel, 99);
      comm.allreduce(TensorView::of(g.data(), numel), ReduceOp::kSum, CompressOptions{spec, "w", nullptr});
      if (comm.rank() == 0) {
        for (int64_t i = 0; i < numel; ++i) total[i] += g[i];
      }
    }
  });
  double num = 0, den = 0;
  for (int64_t i = 0; i < numel; ++i) {
    num += (total[i] - exact[i]) * (total[i] - exact[i]);
    den += exact[i] * exact[i];
  }
  return std::sqrt(num / den);
}

TEST(ErrorFeedback, LongRunSumConvergesWithItAndNotWithout) {
  for (const char* family : {"topk:ratio=0.02", "sign", "sketch:ratio=0.02,cols=1024"}) {
    const std::string with = family;
    const std::string without = with + (with.find(':') == std::string::npos ? ":ef=0" : ",ef=0");
    const double with_10 = relative_gap(with, 10), with_80 = relative_gap(with, 80);
    const double without_10 = relative_gap(without, 10), without_80 = relative_gap(without, 80);
    EXPECT_LT(with_80, with_10 * 0.5) << family << ": " << with_10 << " -> " << with_80;
    EXPECT_GT(without_80, without_10 * 0.8) << family << " without EF: " << without_10 << " -> " << without_80;
    EXPECT_LT(with_80, without_80) << family;
  }
}

// ---- compressed reduce_scatter ------------------------------------------------------------

// Every rank's share of a compressed reduce-scatter of `count` per rank and step; the
// inputs are gradient(r, N x count, step + 1) and must come back unchanged.
std::vector<std::vector<float>> run_reduce_scatter(int n, int64_t count, const std::string& spec, ReduceOp op,
                                                   int steps = 1, std::vector<Stats>* stats = nullptr) {
  std::vector<std::vector<float>> share(n);
  if (stats != nullptr) stats->assign(n, Stats{});
  testing::run_ranks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    for (int s = 0; s < steps; ++s) {
      const auto g = gradient(r, n * count, s + 1);
      auto in = g;
      std::vector<float> out(static_cast<size_t>(count));
      comm.reduce_scatter(TensorView::of(in.data(), n * count), TensorView::of(out.data(), count), op,
                          CompressOptions{spec, "shard", nullptr});
      ASSERT_EQ(in, g) << "rank " << r << "'s input changed";
      share[r] = out;
    }
    if (stats != nullptr) (*stats)[r] = comm.stats();
  });
  return share;
}

// A partial sum crosses N-1 hops, each a payload; the owner adds its own values exactly.
TEST(CompressedReduceScatter, Fp16ShareStaysWithinRoundingOfTheExactSum) {
  for (int n : {2, 3, 4}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      const int64_t count = 5003;
      const auto share = run_reduce_scatter(n, count, "fp16", op);
      std::vector<std::vector<float>> g(n);
      for (int r = 0; r < n; ++r) g[r] = gradient(r, n * count, 1);
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < count; ++i) {
          double exact = 0, magnitude = 0;
          for (int q = 0; q < n; ++q) {
            exact += g[q][r * count + i];
            magnitude += std::abs(g[q][r * count + i]);
          }
          const double d = op == ReduceOp::kAvg ? n : 1;
          ASSERT_LE(std::abs(share[r][i] - exact / d), (n * std::ldexp(magnitude, -11) + 1e-6) / d)
              << "N=" << n << " rank " << r << " i=" << i << " " << reduce_op_name(op);
        }
      }
    }
  }
}

// Every codec of the compressed ring, at a count no bucket divides: finite shares, no
// further from the exact sum than the compressed allreduce's result (which also encodes
// the owner's final sum once more), each rank's own segment compared.
TEST(CompressedReduceScatter, EveryCodecIsAsCloseToTheExactSumAsItsAllreduce) {
  const int n = 3;
  const int64_t count = 1001;
  for (const char* spec : {"fp16", "bf16", "qsgd", "quant:bits=8", "quant:bits=4", "quant:bits=2,bucket=64",
                           "quant:bits=1", "sign"}) {
    SCOPED_TRACE(spec);
    const auto share = run_reduce_scatter(n, count, spec, ReduceOp::kSum);
    const auto whole = run_compressed(n, n * count, spec, ReduceOp::kSum);
    std::vector<double> exact(n * count, 0.0);
    for (int q = 0; q < n; ++q) {
      const auto g = gradient(q, n * count, 1);
      for (int64_t i = 0; i < n * count; ++i) exact[i] += g[i];
    }
    double rs_err = 0, ar_err = 0, norm = 0;
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < count; ++i) {
        const int64_t j = r * count + i;
        ASSERT_TRUE(std::isfinite(share[r][i])) << "rank " << r << " i=" << i;
        rs_err += (share[r][i] - exact[j]) * (share[r][i] - exact[j]);
        ar_err += (whole[r][j] - exact[j]) * (whole[r][j] - exact[j]);
        norm += exact[j] * exact[j];
      }
    }
    EXPECT_LE(std::sqrt(rs_err / norm), 1.05 * std::sqrt(ar_err / norm) + 1e-7)
        << "reduce_scatter " << std::sqrt(rs_err / norm) << " against allreduce " << std::sqrt(ar_err / norm);
  }
}

// Each rank's counters after one compressed reduce-scatter of `count` per rank (rs) and
// after one compressed allreduce of the same input (ar), with `spec`.
void bytes_of_both(int n, int64_t count, const std::string& spec, std::vector<Stats>& rs, std::vector<Stats>& ar) {
  run_reduce_scatter(n, count, spec, ReduceOp::kSum, 1, &rs);
  ar.assign(n, Stats{});
  testing::run_ranks(n, [&](Communicator& comm) {
    auto g = gradient(comm.rank(), n * count, 1);
    comm.allreduce(TensorView::of(g.data(), n * count), ReduceOp::kSum, CompressOptions{spec, "all", nullptr});
    ar[comm.rank()] = comm.stats();
  });
}

// A reduce-scatter's hops carry (N-1)/N of the input: half a compressed allreduce's payloads.
TEST(CompressedReduceScatter, SendsAboutHalfTheCompressedAllreducesBytes) {
  const int n = 4;
  const int64_t count = 65536;
  std::vector<Stats> rs, ar;
  bytes_of_both(n, count, "quant:bits=8", rs, ar);
  for (int r = 0; r < n; ++r) {
    const double ratio = static_cast<double>(rs[r].bytes_sent) / static_cast<double>(ar[r].bytes_sent);
    EXPECT_GT(ratio, 0.45) << "rank " << r;
    EXPECT_LT(ratio, 0.55) << "rank " << r;
    // About (N-1)/N of the input's quant:bits=8 size (a byte per element, plus scales).
    EXPECT_LT(rs[r].bytes_sent, (n - 1) * count * 1.1 + 4096) << "rank " << r;
  }
}

double reduce_scatter_gap(const std::string& spec, int steps);

// Top-k's reduce-scatter: each rank sends each segment's owner the entries of its own
// top-k (over the whole input) that fall in that segment; the owner sums them in rank
// order. Reference: each rank's own top-k (largest |x|, ties to the lower index), summed,
// values exact (values=fp32), so the shares are equal, not close.
TEST(CompressedReduceScatter, TopkShareSumsEachRanksOwnTopkInTheSegment) {
  for (int n : {2, 3, 4}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      SCOPED_TRACE(fmt::format("N={} {}", n, reduce_op_name(op)));
      const int64_t count = 5000, k = 150;
      const auto share = run_reduce_scatter(n, count, "topk:k=150,ef=0,values=fp32", op);
      std::vector<float> expected(static_cast<size_t>(n * count), 0.0f);
      for (int r = 0; r < n; ++r) {
        const auto g = gradient(r, n * count, 1);
        std::vector<int64_t> order(static_cast<size_t>(n * count));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return std::abs(g[a]) > std::abs(g[b]); });
        for (int64_t j = 0; j < k; ++j) expected[order[j]] += g[order[j]];
      }
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < count; ++i) {
          const float want = op == ReduceOp::kAvg ? expected[r * count + i] / static_cast<float>(n)
                                                  : expected[r * count + i];
          ASSERT_EQ(share[r][i], want) << "rank " << r << " i=" << i;
        }
      }
    }
  }
}

// What the top-k reduce-scatter saves: each rank sends about (N-1)/N of its k entries
// once, where the compressed allreduce it replaces (the torch backend's top-k
// reduce-scatter until now) gathers every rank's k entries to every rank.
TEST(CompressedReduceScatter, TopkSendsUnderHalfTheBytesOfTheAllreduceItReplaces) {
  const int n = 4;
  const int64_t count = 65536;
  std::vector<Stats> rs, ar;
  bytes_of_both(n, count, "topk:ratio=0.01", rs, ar);
  const int64_t k = n * count / 100;
  for (int r = 0; r < n; ++r) {
    const double ratio = static_cast<double>(rs[r].bytes_sent) / static_cast<double>(ar[r].bytes_sent);
    std::printf("rank %d: top-k 1%% reduce-scatter %llu bytes, as a compressed allreduce %llu: %.3fx\n", r,
                static_cast<unsigned long long>(rs[r].bytes_sent), static_cast<unsigned long long>(ar[r].bytes_sent),
                ratio);
    EXPECT_LE(ratio, 0.4) << "rank " << r;
    // (N-1)/N of k entries of at most 6 bytes (coded index, bf16 value), plus headers.
    EXPECT_LT(rs[r].bytes_sent, static_cast<uint64_t>((n - 1) * k / n * 6 + 4096)) << "rank " << r;
  }
}

// With error feedback, what top-k leaves out comes back in later steps: a fixed input's
// shares add up to T times the exact sum, and without it they never do.
TEST(CompressedReduceScatter, TopkErrorFeedbackKeepsTheLongRunSum) {
  const double with_10 = reduce_scatter_gap("topk:ratio=0.05", 10), with_80 = reduce_scatter_gap("topk:ratio=0.05", 80);
  const double without_80 = reduce_scatter_gap("topk:ratio=0.05,ef=0", 80);
  EXPECT_LT(with_80, with_10 * 0.5) << with_10 << " -> " << with_80;
  EXPECT_LT(with_80, 0.5 * without_80) << with_80 << " against " << without_80;
}

// A fixed input reduce-scattered T times: with error feedback the shares' total tracks T
// times the exact sum; without it the same rounding is lost every time.
double reduce_scatter_gap(const std::string& spec, int steps) {
  const int n = 3;
  const int64_t count = 2000;
  std::vector<double> total(n * count, 0.0), exact(n * count, 0.0);
  for (int r = 0; r < n; ++r) {
    const auto g = gradient(r, n * count, 99);
    for (int64_t i = 0; i < n * count; ++i) exact[i] += g[i] * steps;
  }
  testing::run_ranks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    for (int s = 0; s < steps; ++s) {
      auto g = gradient(r, n * count, 99);
      std::vector<float> out(count);
      comm.reduce_scatter(TensorView::of(g.data(), n * count), TensorView::of(out.data(), count), ReduceOp::kSum,
                          CompressOptions{spec, "w", nullptr});
      for (int64_t i = 0; i < count; ++i) total[r * count + i] += out[i];  // each rank its own segment
    }
  });
  double num = 0, den = 0;
  for (int64_t i = 0; i < n * count; ++i) {
    num += (total[i] - exact[i]) * (total[i] - exact[i]);
    den += exact[i] * exact[i];
  }
  return std::sqrt(num / den);
}

TEST(CompressedReduceScatter, ErrorFeedbackKeepsTheLongRunSum) {
  const double with_10 = reduce_scatter_gap("sign", 10), with_80 = reduce_scatter_gap("sign", 80);
  const double without_10 = reduce_scatter_gap("sign:ef=0", 10), without_80 = reduce_scatter_gap("sign:ef=0", 80);
  EXPECT_LT(with_80, with_10 * 0.5) << with_10 << " -> " << with_80;
  EXPECT_GT(without_80, without_10 * 0.8) << without_10 << " -> " << without_80;
  EXPECT_LT(with_80, without_80);
}

TEST(CompressedReduceScatter, OtherFamiliesAndBadUsesAreRefused) {
  testing::run_ranks(2, [](Communicator& comm) {
    std::vector<float> in(64, 1.0f), out(32);
    std::vector<double> in64(64), out64(32);
    const auto refused = [&](const std::string& spec, const std::string& key, bool fp64, const char* says) {
      try {
        if (fp64) {
          comm.reduce_scatter(TensorView::of(in64.data(), 64), TensorView::of(out64.data(), 32), ReduceOp::kSum,
                              CompressOptions{spec, key, nullptr});
        } else {
          comm.reduce_scatter(TensorView::of(in.data(), 64), TensorView::of(out.data(), 32), ReduceOp::kSum,
                              CompressOptions{spec, key, nullptr});
        }
        ADD_FAILURE() << spec << " accepted";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      }
    };
    refused("randomk:ratio=0.1", "k", false, "not available for reduce_scatter");
    // The families that are, from the registry: every codec-ring family, and top-k.
    refused("randomk:ratio=0.1", "k", false, "compressed ring (fp16, bf16, qsgd, quant, sign) and with topk");
    refused("powersgd", "k", false, "not available for reduce_scatter");
    refused("sign", "", false, "name this tensor");
    refused("quant:bits=8", "q", true, "takes float32 tensors");
    // Still usable, and the ranks still agree on the sequence.
    comm.reduce_scatter(TensorView::of(in.data(), 64), TensorView::of(out.data(), 32), ReduceOp::kSum,
                        CompressOptions{"fp16", "", nullptr});
    EXPECT_EQ(out[0], 2.0f);
  });
}

TEST(CompressedReduceScatter, CompressedAgainstDenseIsAMismatchOnEveryRank) {
  std::atomic<int> mismatches{0};
  testing::run_ranks(2, [&](Communicator& comm) {
    std::vector<float> in(64, 1.0f), out(32);
    try {
      comm.reduce_scatter(TensorView::of(in.data(), 64), TensorView::of(out.data(), 32), ReduceOp::kSum,
                          CompressOptions{comm.rank() == 0 ? "fp16" : "none", "", nullptr});
    } catch (const MismatchError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("reduce_scatter(numel=64"), std::string::npos) << what;
      ++mismatches;
    }
  });
  EXPECT_EQ(mismatches.load(), 2);
}

TEST(CompressedAllreduce, MismatchedSpecsRaiseOnEveryRank) {
  auto errors = testing::run_ranks_collect(3, [](Communicator& comm) {
    std::vector<float> g(1000, 1.0f);
    comm.allreduce(TensorView::of(g.data(), 1000), ReduceOp::kSum,
                   CompressOptions{comm.rank() == 1 ? "topk:ratio=0.02" : "topk:ratio=0.01", "g", nullptr});
  });
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const MismatchError& m) {
      EXPECT_NE(std::string(m.what()).find("topk:"), std::string::npos) << m.what();
    }
  }
}

// One rank restored an older checkpoint: same call, different step of the key.
TEST(CompressedAllreduce, DifferentStepsOfAKeyAreAMismatchNamingTheSteps) {
  auto errors = testing::run_ranks_collect(2, [](Communicator& comm) {
    std::vector<float> g(100, 1.0f);
    const CompressOptions options{"sign", "w", nullptr};
    comm.allreduce(TensorView::of(g.data(), 100), ReduceOp::kSum, options);
    const auto after_one = comm.save_state();
    comm.allreduce(TensorView::of(g.data(), 100), ReduceOp::kSum, options);
    if (comm.rank() == 1) comm.load_state(after_one);  // back to step 1
    comm.allreduce(TensorView::of(g.data(), 100), ReduceOp::kSum, options);
  });
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const MismatchError& m) {
      EXPECT_NE(std::string(m.what()).find("step=2"), std::string::npos) << m.what();
      EXPECT_NE(std::string(m.what()).find("step=1"), std::string::npos) << m.what();
    }
  }
}

// Stats split a compressed call's time into encode, decode and the rest.
TEST(CompressedAllreduce, StatsReportEncodeAndDecodeTime) {
  for (const char* spec : {"quant:bits=4", "topk:ratio=0.01", "sketch:ratio=0.01"}) {
    std::vector<Stats> stats(2);
    testing::run_ranks(2, [&](Communicator& comm) {
      auto g = gradient(comm.rank(), 200000);
      comm.allreduce(TensorView::of(g.data(), 200000), ReduceOp::kSum, {spec, "w", nullptr});
      stats[comm.rank()] = comm.stats();
    });
    for (const Stats& s : stats) {
      EXPECT_GT(s.encode_s, 0.0) << spec;
      EXPECT_GT(s.decode_s, 0.0) << spec;
      EXPECT_LE(s.encode_s + s.decode_s + s.reduce_s, s.total_s) << spec;
    }
  }
}

TEST(CompressedAllreduce, BadUsesAreInvalidArguments) {
  testing::run_ranks(2, [](Communicator& comm) {
    std::vector<float> g(100, 1.0f);
    std::vector<double> d(100, 1.0);
    auto t = TensorView::of(g.data(), 100);
    EXPECT_THROW(comm.allreduce(t, ReduceOp::kSum, {"topk:ratio=0.1", "", nullptr}), InvalidArgument);  // no key
    EXPECT_THROW(comm.allreduce(t, ReduceOp::kMax, {"fp16", "", nullptr}), InvalidArgument);
    EXPECT_THROW(comm.allreduce(TensorView::of(d.data(), 100), ReduceOp::kSum, {"fp16", "", nullptr}), InvalidArgument);
    EXPECT_THROW(comm.allreduce(t, ReduceOp::kSum, {"topk:ratoi=0.1", "k", nullptr}), InvalidArgument);
    comm.allreduce(t, ReduceOp::kSum, {"sign", "k", nullptr});
    std::vector<float> other(50, 1.0f);  // same key, another size
    EXPECT_THROW(comm.allreduce(TensorView::of(other.data(), 50), ReduceOp::kSum, {"sign", "k", nullptr}),
                 InvalidArgument);
    comm.allreduce(t, ReduceOp::kSum, {"fp16", "", nullptr});  // stateless: no key needed, still usable
  });
}

TEST(CompressedAllreduce, WarmupAndMinNumelGoDense) {
  const int n = 3;
  const int64_t numel = 1000;
  for (const char* spec : {"topk:ratio=0.01,warmup=2", "sign:min_numel=5000"}) {
    const auto out = run_compressed(n, numel, spec, ReduceOp::kSum, 1);
    for (int64_t i = 0; i < numel; ++i) {
      float exact = 0;
      for (int r = 0; r < n; ++r) exact += gradient(r, numel, 1)[i];
      ASSERT_NEAR(out[0][i], exact, 1e-5) << spec;
      if (i == 100) break;
    }
  }
}

// plan_allreduce: the engine's own decision, step by step. Warm-up and min_numel go
// dense, "none" always does; only sparsifiers with error feedback report it.
TEST(CompressedAllreduce, PlanAllreduceFollowsWarmupMinNumelAndTheFamily) {
  testing::run_ranks(2, [](Communicator& comm) {
    const int64_t numel = 1000;
    const CompressOptions warm{"topk:ratio=0.01,warmup=2", "w", nullptr};
    std::vector<bool> compressed;
    for (int step = 0; step < 4; ++step) {
      const AllreducePlan plan = comm.plan_allreduce(numel, warm);
      compressed.push_back(plan.compressed);
      EXPECT_TRUE(plan.sparse_with_feedback);
      auto g = gradient(comm.rank(), numel, step + 1);
      comm.allreduce(TensorView::of(g.data(), numel), ReduceOp::kSum, warm);
    }
    EXPECT_EQ(compressed, (std::vector<bool>{false, false, true, true}));
    EXPECT_FALSE(comm.plan_allreduce(numel, {"none", "n", nullptr}).compressed);
    EXPECT_FALSE(comm.plan_allreduce(numel, {"sign:min_numel=5000", "s", nullptr}).compressed);
    EXPECT_TRUE(comm.plan_allreduce(5000, {"sign:min_numel=5000", "s", nullptr}).compressed);
    EXPECT_FALSE(comm.plan_allreduce(numel, {"sign", "s", nullptr}).sparse_with_feedback);
    EXPECT_FALSE(comm.plan_allreduce(numel, {"topk:ratio=0.1,ef=0", "t", nullptr}).sparse_with_feedback);
    for (const char* spec : {"randomk:ratio=0.1", "sketch:k=10", "topk:k=5"}) {
      EXPECT_TRUE(comm.plan_allreduce(numel, {spec, "x", nullptr}).sparse_with_feedback) << spec;
    }
    EXPECT_THROW(comm.plan_allreduce(numel, {"topk:ratio=7", "t", nullptr}), InvalidArgument);
  });
}

// sent_mask: 0 exactly at what this rank's top-k sent (its own k largest magnitudes
// of gradient + residual), 1 elsewhere; false before any sparsified call; bad masks
// are refused by name.
TEST(CompressedAllreduce, SentMaskMarksExactlyWhatThisRankSent) {
  testing::run_ranks(2, [](Communicator& comm) {
    const int64_t numel = 500, k = 7;
    const CompressOptions options{"topk:k=7,values=fp32", "grad", nullptr};
    std::vector<float> mask(numel, 5.0f);
    EXPECT_FALSE(comm.sent_mask("grad", TensorView::of(mask.data(), numel)));
    EXPECT_EQ(mask, std::vector<float>(numel, 5.0f)) << "untouched when nothing was sent";
    auto g = gradient(comm.rank(), numel, 3);
    const auto before = g;
    comm.allreduce(TensorView::of(g.data(), numel), ReduceOp::kSum, options);
    ASSERT_TRUE(comm.sent_mask("grad", TensorView::of(mask.data(), numel)));
    // First step: the residual was zero, so the selection is the gradient's own top k.
    std::vector<int64_t> order(numel);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return std::abs(before[a]) > std::abs(before[b]); });
    std::vector<float> expected(numel, 1.0f);
    for (int64_t j = 0; j < k; ++j) expected[order[j]] = 0.0f;
    EXPECT_EQ(mask, expected) << "rank " << comm.rank();

    std::vector<float> short_mask(numel - 1);
    EXPECT_THROW(comm.sent_mask("grad", TensorView::of(short_mask.data(), numel - 1)), InvalidArgument);
    std::vector<double> wide(numel);
    EXPECT_THROW(comm.sent_mask("grad", TensorView::of(wide.data(), numel)), InvalidArgument);
    EXPECT_FALSE(comm.sent_mask("never-used", TensorView::of(mask.data(), numel)));
  });
}

// Checkpoint after a few steps, restore into fresh communicators, and the next
// step matches the uninterrupted run bitwise (residuals and step counters survive).
TEST(CompressedAllreduce, SaveAndLoadStateResumeExactly) {
  const int n = 2;
  const int64_t numel = 5000;
  for (const char* spec : {"topk:ratio=0.01", "sign", "qsgd", "randomk:ratio=0.05", "sketch:ratio=0.01"}) {
    std::vector<std::vector<uint8_t>> saved(n);
    std::vector<std::vector<float>> uninterrupted(n), resumed(n);
    testing::run_ranks(n, [&](Communicator& comm) {
      for (int s = 0; s < 4; ++s) {
        auto g = gradient(comm.rank(), numel, s + 1);
        comm.allreduce(TensorView::of(g.data(), numel), ReduceOp::kAvg, {spec, "w", nullptr});
        if (s == 2) saved[comm.rank()] = comm.save_state();
        if (s == 3) uninterrupted[comm.rank()] = g;
      }
    });
    testing::run_ranks(n, [&](Communicator& comm) {
      comm.load_state(saved[comm.rank()]);
      auto g = gradient(comm.rank(), numel, 4);
      comm.allreduce(TensorView::of(g.data(), numel), ReduceOp::kAvg, {spec, "w", nullptr});
      resumed[comm.rank()] = g;
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(resumed[r], uninterrupted[r]) << spec << " rank " << r;
  }
}

// NaN and Inf are never dropped and never an error (docs/fault-model.md). Casts, top-k
// and the sketch carry them through at their position (NaN ranks as the largest
// magnitude, so top-k always selects it). The bucketed quantizers cannot encode a
// non-finite value: its bucket's scale turns non-finite and the whole bucket decodes
// to NaN on every rank. Random-k sends only the drawn coordinates; a NaN elsewhere
// stays in this rank's residual until its index is drawn, so it is delayed, not lost.
TEST(CompressedAllreduce, NanAndInfPropagateOnEveryRank) {
  const int n = 3;
  const int64_t numel = 1000, p = 123, q = 456;
  const float kNan = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
  for (const char* spec : kSpecs) {
    SCOPED_TRACE(spec);
    const std::string name = std::string(spec).substr(0, std::string(spec).find(':'));
    std::vector<std::vector<float>> out(n);
    bool nan_in_residual = false;
    testing::run_ranks(n, [&](Communicator& comm) {
      auto g = gradient(comm.rank(), numel);
      if (comm.rank() == 1) g[p] = kNan;
      if (comm.rank() == 2) g[q] = kInf;
      comm.allreduce(TensorView::of(g.data(), numel), ReduceOp::kSum, CompressOptions{spec, "grad", nullptr});
      out[comm.rank()] = g;
      if (comm.rank() == 1) {
        const auto residual = detail::residual_view(comm, "grad");
        nan_in_residual = !residual.empty() && std::isnan(residual[p]);
      }
    });
    for (int r = 1; r < n; ++r) {
      ASSERT_TRUE(testing::same_bytes(out[r].data(), out[0].data(), numel * sizeof(float))) << "rank " << r;
    }
    const auto& y = out[0];
    if (name == "randomk") {
      EXPECT_TRUE(std::isnan(y[p]) || nan_in_residual) << "the NaN was neither sent nor kept";
    } else if (name == "qsgd" || name == "quant" || name == "sign") {
      EXPECT_TRUE(std::isnan(y[p]));
      EXPECT_FALSE(std::isfinite(y[q]));
    } else {
      EXPECT_TRUE(std::isnan(y[p]));
      EXPECT_EQ(y[q], kInf);
      const auto finite = std::count_if(y.begin(), y.end(), [](float v) { return std::isfinite(v); });
      EXPECT_EQ(finite, numel - 2) << "a non-finite value leaked into other coordinates";
    }
  }
}

}  // namespace
}  // namespace gradcomm
