// PowerSGD over the in-process transport: the spec, the plan's matrix rules, the
// Gram-Schmidt step, exact recovery of a low-rank sum, agreement with a
// double-precision reference of the whole step, error feedback, bitwise identical
// ranks, state save/load (Q included), mismatched shapes and corrupt state.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "common/normal.h"
#include "compressors/philox.h"
#include "compressors/lowrank/powersgd.h"
#include "compressors/spec.h"
#include "compressors/powersgd/powersgd.h"
#include "test_util.h"

namespace gradcomm {
namespace {

using detail::CompressorSpec;
using detail::parse_compressor_spec;
namespace psgd = detail::powersgd;

using testing::normal_floats;

CompressOptions matrix(const std::string& spec, const std::string& key, int64_t rows, int64_t cols) {
  CompressOptions o{spec, key, nullptr};
  o.shape = {rows, cols};
  return o;
}

double rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

TEST(PowersgdSpec, DefaultsCanonicalFormAndErrors) {
  const CompressorSpec d = parse_compressor_spec("powersgd");
  EXPECT_EQ(d.family<detail::PowersgdParams>().rank, 1);
  EXPECT_TRUE(d.family<detail::PowersgdParams>().warm_start);
  EXPECT_EQ(d.family<detail::PowersgdParams>().min_compression_rate, 2.0);
  EXPECT_TRUE(d.ef);
  EXPECT_EQ(d.canonical(), "powersgd:rank=1,warm_start=1,min_compression_rate=2,ef=1,min_numel=0,warmup=0,seed=0");
  const CompressorSpec s = parse_compressor_spec("powersgd:rank=4,warm_start=0,min_compression_rate=1.5,start_iter=10,seed=3");
  EXPECT_EQ(s.family<detail::PowersgdParams>().rank, 4);
  EXPECT_FALSE(s.family<detail::PowersgdParams>().warm_start);
  EXPECT_EQ(s.warmup, 10);  // start_iter is torch's name for warmup
  EXPECT_EQ(parse_compressor_spec(s.canonical()).canonical(), s.canonical());
  for (const char* bad : {"powersgd:rank=0", "powersgd:rank=1025", "powersgd:warm_start=2",
                          "powersgd:min_compression_rate=0.5", "powersgd:min_compression_rate=nan",
                          "powersgd:start_iter=1,warmup=1", "powersgd:values=fp16", "powersgd:ratio=0.1"}) {
    EXPECT_THROW(parse_compressor_spec(bad), InvalidArgument) << bad;
  }
}

TEST(PowersgdPlan, MatricesRanksAndOffsets) {
  // torch's rule: (rows + cols) * r * rate < rows * cols, r = min(rank, rows, cols).
  EXPECT_EQ(psgd::matrix_rank(2048, 784, 4, 2.0), 4);
  EXPECT_EQ(psgd::matrix_rank(10, 2048, 4, 2.0), 4);   // 2058 * 4 * 2 = 16464 < 20480
  EXPECT_EQ(psgd::matrix_rank(4, 4, 4, 2.0), 0);       // (8) * 4 * 2 = 64 >= 16
  EXPECT_EQ(psgd::matrix_rank(3, 1000, 8, 1.0), 0);    // r = 3: 3009 > 3000
  EXPECT_EQ(psgd::matrix_rank(1, 1000, 1, 1.0), 0);    // one row: dense
  EXPECT_EQ(psgd::matrix_rank(100, 100, 1, 2.0), 1);
  const psgd::Plan plan = psgd::make_plan({{100 * 50, 100}, {7, 0}, {16, 4}, {30 * 20, 30}}, 2, 2.0);
  ASSERT_EQ(plan.entries.size(), 4u);
  EXPECT_EQ(plan.matrices, 2);
  EXPECT_EQ(plan.entries[0].rank, 2);
  EXPECT_EQ(plan.entries[0].p_offset, 0);
  EXPECT_EQ(plan.entries[0].q_offset, 0);
  EXPECT_EQ(plan.entries[1].rank, 0);  // 1-D
  EXPECT_EQ(plan.entries[2].rank, 0);  // 4x4: not worth it
  EXPECT_EQ(plan.entries[3].rank, 2);
  EXPECT_EQ(plan.entries[3].offset, 5000 + 7 + 16);
  EXPECT_EQ(plan.entries[3].p_offset, 200);
  EXPECT_EQ(plan.entries[3].q_offset, 100);
  EXPECT_EQ(plan.p_floats, 200 + 60);
  EXPECT_EQ(plan.q_floats, 100 + 40);
  EXPECT_EQ(plan.dense_floats, 7 + 16);
  EXPECT_EQ(plan.entries[1].p_offset, 260);
  EXPECT_EQ(plan.entries[2].p_offset, 267);
}

TEST(PowersgdMath, OrthonormalizeGivesOrthonormalColumnsAndKeepsZeroColumnsZero) {
  const int64_t rows = 300;
  const int r = 5;
  auto a = normal_floats(rows * r, 5);
  psgd::orthonormalize(a.data(), rows, r);
  for (int i = 0; i < r; ++i) {
    for (int j = 0; j < r; ++j) {
      double dot = 0;
      for (int64_t k = 0; k < rows; ++k) dot += double{a[k * r + i]} * a[k * r + j];
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5) << i << "," << j;
    }
  }
  std::vector<float> zero(static_cast<size_t>(rows) * 2, 0.0f);
  psgd::orthonormalize(zero.data(), rows, 2);
  for (float v : zero) ASSERT_EQ(v, 0.0f);  // torch's epsilon: no NaN from a zero gradient
  // A dependent column (c2 = c0 - 3 c1) holds only rounding error once c0 and c1 are
  // removed: it is zeroed, not normalized into a random direction.
  auto dep = normal_floats(rows * 3, 6);
  for (int64_t i = 0; i < rows; ++i) dep[i * 3 + 2] = dep[i * 3] - 3.0f * dep[i * 3 + 1];
  psgd::orthonormalize(dep.data(), rows, 3);
  for (int64_t i = 0; i < rows; ++i) ASSERT_EQ(dep[i * 3 + 2], 0.0f) << i;
  double norm1 = 0;
  for (int64_t i = 0; i < rows; ++i) norm1 += double{dep[i * 3 + 1]} * dep[i * 3 + 1];
  EXPECT_NEAR(norm1, 1.0, 1e-5);
}

// Every rank's matrix lies in one rank-R column space, so the sum has rank R and a
// rank-R approximation is exact: P spans the sum's columns from the first step on.
TEST(Powersgd, RecoversALowRankSumExactly) {
  const int64_t rows = 64, cols = 48;
  const int R = 3;
  for (int n : {1, 2, 3}) {
    const auto u = normal_floats(rows * R, 11);
    std::vector<std::vector<float>> local(n);
    std::vector<double> sum(static_cast<size_t>(rows * cols), 0.0);
    for (int r = 0; r < n; ++r) {
      const auto v = normal_floats(cols * R, 20 + r);
      local[r].assign(static_cast<size_t>(rows * cols), 0.0f);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) {
          float s = 0;
          for (int l = 0; l < R; ++l) s += u[i * R + l] * v[j * R + l];
          local[r][i * cols + j] = s;
          sum[i * cols + j] += s;
        }
      }
    }
    // At rank R, and at rank R + 3, whose extra columns of P hold only rounding error.
    for (int rank : {R, R + 3}) {
      testing::run_ranks(n, [&](Communicator& comm) {
        for (int step = 0; step < 3; ++step) {  // the first step and two warm-started ones
          auto g = local[comm.rank()];
          comm.allreduce(TensorView::of(g.data(), rows * cols), ReduceOp::kSum,
                         matrix(fmt::format("powersgd:rank={},ef=0", rank), "m", rows, cols));
          if (comm.rank() == 0) {
            EXPECT_LT(rel_error(g, sum), 2e-5) << "N=" << n << " rank " << rank << " step " << step;
          }
        }
      });
    }
  }
}

// The whole step in double precision from the same initial Q: P = sum_r M_r Q,
// Gram-Schmidt, Q' = sum_r M_r^T P, out = P Q'^T / N (avg).
std::vector<double> reference_step(const std::vector<std::vector<float>>& m, int64_t rows, int64_t cols, int rank,
                                   const std::vector<float>& q0) {
  const int n = static_cast<int>(m.size());
  std::vector<double> p(static_cast<size_t>(rows * rank), 0.0), q(static_cast<size_t>(cols * rank), 0.0);
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int l = 0; l < rank; ++l) {
        double s = 0;
        for (int64_t j = 0; j < cols; ++j) s += double{m[r][i * cols + j]} * q0[j * rank + l];
        p[i * rank + l] += s;
      }
    }
  }
  for (int l = 0; l < rank; ++l) {
    double norm = 0;
    for (int64_t i = 0; i < rows; ++i) norm += p[i * rank + l] * p[i * rank + l];
    norm = std::sqrt(norm) + psgd::kEpsilon;
    for (int64_t i = 0; i < rows; ++i) p[i * rank + l] /= norm;
    for (int k = l + 1; k < rank; ++k) {
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i) dot += p[i * rank + l] * p[i * rank + k];
      for (int64_t i = 0; i < rows; ++i) p[i * rank + k] -= dot * p[i * rank + l];
    }
  }
  for (int r = 0; r < n; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      for (int l = 0; l < rank; ++l) {
        double s = 0;
        for (int64_t i = 0; i < rows; ++i) s += double{m[r][i * cols + j]} * p[i * rank + l];
        q[j * rank + l] += s;
      }
    }
  }
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      double s = 0;
      for (int l = 0; l < rank; ++l) s += p[i * rank + l] * q[j * rank + l];
      out[i * cols + j] = s / n;
    }
  }
  return out;
}

TEST(Powersgd, FirstStepMatchesADoublePrecisionReference) {
  const int64_t rows = 40, cols = 70;
  const int rank = 4, n = 3;
  const std::string spec = "powersgd:rank=4,seed=9";
  std::vector<std::vector<float>> m(n);
  for (int r = 0; r < n; ++r) m[r] = normal_floats(rows * cols, 100 + r);
  // The initial Q as the rules define it (powersgd_logic.h): Philox draws for the key, orthonormalized.
  const std::string key = "w";
  const uint64_t key_hash = detail::fnv1a64(std::span(reinterpret_cast<const uint8_t*>(key.data()), key.size()));
  std::vector<float> q0(static_cast<size_t>(cols * rank));
  psgd::draw_initial_q(q0.data(), cols * rank, detail::PhiloxStream{9, detail::philox_stream_id(key_hash, 0, -1)});
  psgd::orthonormalize(q0.data(), cols, rank);
  const auto want = reference_step(m, rows, cols, rank, q0);
  std::vector<std::vector<float>> out(n);
  testing::run_ranks(n, [&](Communicator& comm) {
    auto g = m[comm.rank()];
    comm.allreduce(TensorView::of(g.data(), rows * cols), ReduceOp::kAvg, matrix(spec, key, rows, cols));
    out[comm.rank()] = g;
  });
  EXPECT_LT(rel_error(out[0], want), 1e-5);
  // A rank-4 approximation of a random 40x70 sum is far from it (the test would
  // pass vacuously if the output were the exact mean).
  std::vector<double> mean(static_cast<size_t>(rows * cols), 0.0);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < mean.size(); ++i) mean[i] += double{m[r][i]} / n;
  }
  EXPECT_GT(rel_error(out[0], mean), 0.3);
}

// Mixed parts (a DDP bucket): matrices compressed, 1-D and tiny parts exact;
// every rank holds the same bytes; sum and avg differ by exactly N on the dense parts.
// What a call puts on the wire at N = 4: a P of 4 KiB takes halving + doubling (the
// bandwidth optimum, 1.5x its bytes), a Q of 2 KiB recursive doubling (2x, fewer
// messages), plus the 96-byte call header. The bytes ratio users read ("x fewer
// than dense") rests on this.
TEST(Powersgd, BuffersFromFourKibOnTakeTheBandwidthOptimalSchedule) {
  ::setenv("GRADCOMM_FUSION_BYTES", "0", 1);  // no fusion plan messages from rank 0
  const int n = 4;
  const int64_t rows = 512, cols = 256, rank = 2;
  const uint64_t p_bytes = rows * rank * 4, q_bytes = cols * rank * 4;  // 4096 and 2048
  std::vector<Stats> stats(n);
  testing::run_ranks(n, [&](Communicator& comm) {
    auto g = normal_floats(rows * cols, 7 + comm.rank());
    comm.allreduce(TensorView::of(g.data(), rows * cols), ReduceOp::kSum,
                   matrix("powersgd:rank=2", "bytes", rows, cols));
    stats[comm.rank()] = comm.stats();
  });
  ::unsetenv("GRADCOMM_FUSION_BYTES");
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(stats[r].bytes_sent, 96 + p_bytes * 3 / 2 + q_bytes * 2) << "rank " << r;
  }
}

TEST(Powersgd, BucketOfPartsIsBitwiseIdenticalOnEveryRankAndDensePartsAreExact) {
  const std::vector<std::vector<int64_t>> shapes = {{32, 16}, {32}, {3, 3}, {10, 8, 2}};
  const int64_t numel = 32 * 16 + 32 + 9 + 160;
  for (int n : {1, 2, 3, 4}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      std::vector<std::vector<float>> out(n);
      testing::run_ranks(n, [&](Communicator& comm) {
        for (int step = 0; step < 3; ++step) {
          auto g = normal_floats(numel, 1000 * step + comm.rank());
          CompressOptions o{"powersgd:rank=2", "bucket", nullptr};
          o.parts = shapes;
          comm.allreduce(TensorView::of(g.data(), numel), op, o);
          out[comm.rank()] = g;
        }
      });
      for (int r = 1; r < n; ++r) {
        ASSERT_TRUE(testing::same_bytes(out[r].data(), out[0].data(), numel * sizeof(float))) << "N=" << n;
      }
      // The 1-D part at [512, 544) and the 3x3 at [544, 553) are the exact sum (or mean) of the last step.
      for (int64_t i = 512; i < 553; ++i) {
        double exact = 0;
        for (int r = 0; r < n; ++r) exact += normal_floats(numel, 2000 + r)[i];
        if (op == ReduceOp::kAvg) exact /= n;
        ASSERT_NEAR(out[0][i], exact, 1e-5) << "N=" << n << " i=" << i;
      }
    }
  }
}

TEST(Powersgd, WithoutAShapeTheTensorGoesDense) {
  const int n = 2;
  std::vector<std::vector<float>> out(n);
  testing::run_ranks(n, [&](Communicator& comm) {
    auto g = normal_floats(500, comm.rank());
    comm.allreduce(TensorView::of(g.data(), 500), ReduceOp::kSum, {"powersgd:rank=2", "flat", nullptr});
    out[comm.rank()] = g;
  });
  for (int64_t i = 0; i < 500; ++i) ASSERT_NEAR(out[0][i], normal_floats(500, 0)[i] + normal_floats(500, 1)[i], 1e-5);
}

// A fixed gradient allreduced T times: with error feedback the outputs' total
// tracks T times the exact sum; without it the same rank-1 part is sent every time.
double relative_gap(const std::string& spec, int steps) {
  const int n = 2;
  const int64_t rows = 48, cols = 32;
  std::vector<double> total(rows * cols, 0.0), exact(rows * cols, 0.0);
  for (int r = 0; r < n; ++r) {
    const auto g = normal_floats(rows * cols, 77 + r);
    for (int64_t i = 0; i < rows * cols; ++i) exact[i] += double{g[i]} * steps;
  }
  testing::run_ranks(n, [&](Communicator& comm) {
    for (int s = 0; s < steps; ++s) {
      auto g = normal_floats(rows * cols, 77 + comm.rank());
      comm.allreduce(TensorView::of(g.data(), rows * cols), ReduceOp::kSum, matrix(spec, "w", rows, cols));
      if (comm.rank() == 0) {
        for (int64_t i = 0; i < rows * cols; ++i) total[i] += g[i];
      }
    }
  });
  double num = 0, den = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    num += (total[i] - exact[i]) * (total[i] - exact[i]);
    den += exact[i] * exact[i];
  }
  return std::sqrt(num / den);
}

TEST(Powersgd, ErrorFeedbackLongRunSumConvergesWithItAndNotWithout) {
  const double with_10 = relative_gap("powersgd:rank=1", 10), with_80 = relative_gap("powersgd:rank=1", 80);
  const double without_10 = relative_gap("powersgd:rank=1,ef=0", 10);
  const double without_80 = relative_gap("powersgd:rank=1,ef=0", 80);
  EXPECT_LT(with_80, with_10 * 0.5) << with_10 << " -> " << with_80;
  EXPECT_GT(without_80, without_10 * 0.8) << without_10 << " -> " << without_80;
  EXPECT_LT(with_80, without_80);
}

TEST(Powersgd, SaveAndLoadStateResumeBitwiseWithQ) {
  const int n = 2;
  const int64_t rows = 30, cols = 20;
  for (const char* spec : {"powersgd:rank=2", "powersgd:rank=2,warm_start=0", "powersgd:rank=3,ef=0"}) {
    std::vector<std::vector<uint8_t>> saved(n);
    std::vector<std::vector<float>> uninterrupted(n), resumed(n);
    testing::run_ranks(n, [&](Communicator& comm) {
      for (int s = 0; s < 4; ++s) {
        auto g = normal_floats(rows * cols, 10 * s + comm.rank());
        comm.allreduce(TensorView::of(g.data(), rows * cols), ReduceOp::kAvg, matrix(spec, "w", rows, cols));
        if (s == 2) saved[comm.rank()] = comm.save_state();
        if (s == 3) uninterrupted[comm.rank()] = g;
      }
    });
    testing::run_ranks(n, [&](Communicator& comm) {
      comm.load_state(saved[comm.rank()]);
      auto g = normal_floats(rows * cols, 30 + comm.rank());
      comm.allreduce(TensorView::of(g.data(), rows * cols), ReduceOp::kAvg, matrix(spec, "w", rows, cols));
      resumed[comm.rank()] = g;
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(resumed[r], uninterrupted[r]) << spec << " rank " << r;
    // Losing the warm-start Q changes the next step: the state really carries it.
    if (std::string(spec) == "powersgd:rank=2") {
      std::vector<float> fresh;
      testing::run_ranks(n, [&](Communicator& comm) {
        auto g = normal_floats(rows * cols, 30 + comm.rank());
        comm.allreduce(TensorView::of(g.data(), rows * cols), ReduceOp::kAvg, matrix(spec, "w", rows, cols));
        if (comm.rank() == 0) fresh = g;
      });
      EXPECT_NE(fresh, uninterrupted[0]);
    }
  }
}

TEST(Powersgd, MismatchedShapesAreAMismatchOnEveryRank) {
  auto errors = testing::run_ranks_collect(3, [](Communicator& comm) {
    std::vector<float> g(600, 1.0f);
    const int64_t rows = comm.rank() == 1 ? 20 : 30;
    comm.allreduce(TensorView::of(g.data(), 600), ReduceOp::kSum,
                   matrix("powersgd:rank=2", "w", rows, 600 / rows));
  });
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const MismatchError& m) {
      EXPECT_NE(std::string(m.what()).find("shapes"), std::string::npos) << m.what();
    }
  }
}

TEST(Powersgd, BadShapesAndKeysAreInvalidArguments) {
  testing::run_ranks(2, [](Communicator& comm) {
    std::vector<float> g(600, 1.0f);
    auto t = TensorView::of(g.data(), 600);
    EXPECT_THROW(comm.allreduce(t, ReduceOp::kSum, matrix("powersgd", "w", 20, 31)), InvalidArgument);
    EXPECT_THROW(comm.allreduce(t, ReduceOp::kSum, matrix("powersgd", "w", -20, -30)), InvalidArgument);
    CompressOptions both = matrix("powersgd", "w", 20, 30);
    both.parts = {{600}};
    EXPECT_THROW(comm.allreduce(t, ReduceOp::kSum, both), InvalidArgument);
    CompressOptions parts{"powersgd", "w", nullptr};
    parts.parts = {{10, 10}, {10, 40}};  // 500 of 600
    EXPECT_THROW(comm.allreduce(t, ReduceOp::kSum, parts), InvalidArgument);
    EXPECT_THROW(comm.allreduce(t, ReduceOp::kSum, matrix("powersgd", "", 20, 30)), InvalidArgument);  // no key
    EXPECT_THROW(comm.allreduce(t, ReduceOp::kMax, matrix("powersgd", "w", 20, 30)), InvalidArgument);
    comm.allreduce(t, ReduceOp::kSum, matrix("powersgd", "w", 20, 30));  // still usable
    // A key's shapes may not change once its Q exists (both ranks do the same).
    EXPECT_THROW(comm.allreduce(t, ReduceOp::kSum, matrix("powersgd", "w", 60, 10)), InvalidArgument);
  });
}

// The saved state with a truncated or odd-sized Q is refused; version 1 (no Q) loads.
TEST(Powersgd, CorruptStateIsRefused) {
  testing::run_ranks(1, [](Communicator& comm) {
    std::vector<float> g(600, 1.0f);
    comm.allreduce(TensorView::of(g.data(), 600), ReduceOp::kSum, matrix("powersgd:rank=2", "w", 20, 30));
    const std::vector<uint8_t> good = comm.save_state();
    comm.load_state(good);
    auto reseal = [](std::vector<uint8_t> b) {
      const uint64_t sum = detail::fnv1a64(std::span(b.data(), b.size() - 8));
      std::memcpy(b.data() + b.size() - 8, &sum, 8);
      return b;
    };
    // The extra length is the u64 before the last 2 * 30 * 4 Q bytes and the checksum.
    const size_t q_bytes = 30 * 2 * 4;
    const size_t at = good.size() - 8 - q_bytes - 8;
    uint64_t length = 0;
    std::memcpy(&length, good.data() + at, 8);
    ASSERT_EQ(length, q_bytes);
    for (uint64_t bad : {q_bytes + 4, q_bytes - 2, uint64_t{1} << 62}) {
      auto b = good;
      std::memcpy(b.data() + at, &bad, 8);
      EXPECT_THROW(comm.load_state(reseal(b)), CorruptPayload) << bad;
    }
    auto flipped = good;
    flipped[at + 12] ^= 0x40;  // inside Q, checksum not resealed
    EXPECT_THROW(comm.load_state(flipped), CorruptPayload);
  });
}

}  // namespace
}  // namespace gradcomm
