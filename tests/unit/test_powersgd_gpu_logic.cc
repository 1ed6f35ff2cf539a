// PowerSGD's GPU arithmetic, checked on the CPU: a host emulation of the kernels'
// decompositions (kOrthoThreads partial sums and the reduction tree of the Gram-Schmidt
// block, the per-element reconstruction, the batches, the column-major cuBLAS
// arguments) built from gpu_powersgd_logic.h's functions, held to the CPU's powersgd.h;
// and one whole emulated step per call against the CPU engine, within the tolerance
// compressors/lowrank/gpu_powersgd.h states. Runs everywhere;
// tests/cuda/test_nccl_powersgd.cc runs the kernels themselves where a GPU exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "compressors/philox.h"
#include "common/spiked_matrix.h"
#include "compressors/lowrank/gpu_powersgd_logic.h"
#include "compressors/lowrank/powersgd.h"
#include "gradcomm/gradcomm.h"
#include "state.h"
#include "unit/test_util.h"

namespace gradcomm::detail {
namespace {

using powersgd::Entry;
using powersgd::Part;
using powersgd::Plan;

std::vector<float> random_floats(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = normal(gen);
  return v;
}

// ---- emulation of gpu_powersgd.cu --------------------------------------------------------

// orthonormalize_kernel: thread t's partials, then the tree, for every reduction.
double block_sum(const float* a, int64_t rows, int r, int j, int k) {
  constexpr int kT = powersgd::kOrthoThreads;
  std::vector<double> partial(kT);
  for (int t = 0; t < kT; ++t) partial[t] = powersgd::column_dot_partial(a, rows, r, j, k, t, kT);
  for (int half = kT / 2; half > 0; half /= 2) {
    for (int t = 0; t < kT; ++t) powersgd::tree_level(partial.data(), t, half);
  }
  return partial[0];
}

void emulate_orthonormalize(float* a, int64_t rows, int r) {
  std::vector<double> before(static_cast<size_t>(r));
  for (int j = 0; j < r; ++j) before[static_cast<size_t>(j)] = std::sqrt(block_sum(a, rows, r, j, j));
  for (int j = 0; j < r; ++j) {
    const double norm2 = block_sum(a, rows, r, j, j);
    if (powersgd::only_rounding_left(std::sqrt(norm2), before[static_cast<size_t>(j)])) {
      for (int64_t i = 0; i < rows; ++i) a[i * r + j] = 0.0f;
      continue;
    }
    const float scale = powersgd::column_scale(norm2);
    for (int64_t i = 0; i < rows; ++i) a[i * r + j] *= scale;
    for (int k = j + 1; k < r; ++k) {
      const auto d = static_cast<float>(block_sum(a, rows, r, j, k));
      for (int64_t i = 0; i < rows; ++i) a[i * r + k] -= d * a[i * r + j];
    }
  }
}

// reconstruct_kernel, element by element.
void emulate_reconstruct(const float* p, const float* q, int64_t rows, int64_t cols, int r, int n, bool average,
                         float* acc, float* residual) {
  for (int64_t at = 0; at < rows * cols; ++at) {
    const int64_t i = at / cols, j = at - i * cols;
    powersgd::finish_element(powersgd::reconstruct_sum(p + i * r, q + j * r, r), n, average, acc + at,
                             residual != nullptr ? residual + at : nullptr);
  }
}

// cublasSgemm as documented (column-major, alpha 1, beta 0), summing over k backwards in
// fp32: an order unlike OpenBLAS's, as cuBLAS's is.
void colmajor_sgemm(const powersgd::Gemm& g, const float* a, const float* b, float* c) {
  for (int y = 0; y < g.n; ++y) {
    for (int x = 0; x < g.m; ++x) {
      float s = 0;
      for (int kk = g.k - 1; kk >= 0; --kk) {
        const float bv = g.trans_b ? b[y + static_cast<int64_t>(kk) * g.ldb] : b[kk + static_cast<int64_t>(y) * g.ldb];
        s += a[x + static_cast<int64_t>(kk) * g.lda] * bv;
      }
      c[x + static_cast<int64_t>(y) * g.ldc] = s;
    }
  }
}

// ---- the pieces ------------------------------------------------------------------------------

TEST(PowersgdGpuLogic, GramSchmidtOfTheBlockMatchesTheCpusWithinRounding) {
  int exact = 0, total = 0;
  for (int64_t rows : {1, 2, 3, 255, 256, 257, 1000, 4099}) {
    for (int r : {1, 2, 3, 8}) {
      if (r > rows) continue;
      SCOPED_TRACE(::testing::Message() << rows << " x " << r);
      const std::vector<float> a = random_floats(static_cast<size_t>(rows * r), static_cast<uint32_t>(rows * 31 + r));
      std::vector<float> cpu = a, gpu = a;
      powersgd::orthonormalize(cpu.data(), rows, r);
      emulate_orthonormalize(gpu.data(), rows, r);
      for (size_t e = 0; e < a.size(); ++e) {
        ASSERT_NEAR(gpu[e], cpu[e], 1e-6f) << "element " << e;
        exact += gpu[e] == cpu[e];
        ++total;
      }
      // Orthonormal columns (up to fp32 rounding), as the CPU's.
      for (int j = 0; j < r; ++j) {
        for (int k = j; k < r; ++k) {
          double dot = 0;
          for (int64_t i = 0; i < rows; ++i) dot += static_cast<double>(gpu[i * r + j]) * gpu[i * r + k];
          EXPECT_NEAR(dot, j == k ? 1.0 : 0.0, 1e-5) << "columns " << j << ", " << k;
        }
      }
    }
  }
  // The double sums almost always round to the same fp32 values as the CPU's.
  EXPECT_GT(exact, total * 9 / 10) << exact << " of " << total << " bitwise equal";
}

TEST(PowersgdGpuLogic, ZeroColumnStaysZeroWithoutNaN) {
  const int64_t rows = 300;
  const int r = 3;
  std::vector<float> a = random_floats(rows * r, 7);
  for (int64_t i = 0; i < rows; ++i) a[i * r + 1] = 0.0f;
  std::vector<float> cpu = a;
  powersgd::orthonormalize(cpu.data(), rows, r);
  emulate_orthonormalize(a.data(), rows, r);
  for (int64_t i = 0; i < rows; ++i) {
    EXPECT_EQ(a[i * r + 1], 0.0f);
    for (int j = 0; j < r; ++j) ASSERT_FALSE(std::isnan(a[i * r + j]));
  }
  for (size_t e = 0; e < a.size(); ++e) EXPECT_NEAR(a[e], cpu[e], 1e-6f);
}

// A dependent column (c2 = 2 c0 + c1) is zeroed by both, not normalized noise.
TEST(PowersgdGpuLogic, DependentColumnIsZeroedAsOnTheCpu) {
  const int64_t rows = 500;
  const int r = 3;
  std::vector<float> a = random_floats(rows * r, 8);
  for (int64_t i = 0; i < rows; ++i) a[i * r + 2] = 2.0f * a[i * r] + a[i * r + 1];
  std::vector<float> cpu = a;
  powersgd::orthonormalize(cpu.data(), rows, r);
  emulate_orthonormalize(a.data(), rows, r);
  for (int64_t i = 0; i < rows; ++i) {
    ASSERT_EQ(a[i * r + 2], 0.0f) << i;
    ASSERT_EQ(cpu[i * r + 2], 0.0f) << i;
  }
  for (size_t e = 0; e < a.size(); ++e) EXPECT_NEAR(a[e], cpu[e], 1e-6f);
}

TEST(PowersgdGpuLogic, ReconstructionIsTheCpusBitForBit) {
  for (const auto& [rows, cols, r] : {std::tuple<int64_t, int64_t, int>{2, 1, 1}, {7, 5, 3}, {64, 48, 4}, {33, 100, 8}}) {
    const std::vector<float> p = random_floats(static_cast<size_t>(rows * r), 1);
    const std::vector<float> q = random_floats(static_cast<size_t>(cols * r), 2);
    const std::vector<float> acc = random_floats(static_cast<size_t>(rows * cols), 3);
    for (int n : {1, 2, 3, 7}) {
      for (bool average : {false, true}) {
        for (bool with_residual : {false, true}) {
          SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " r=" << r << " n=" << n << " avg=" << average);
          std::vector<float> cpu = acc, gpu = acc, cpu_res(acc.size(), -1.0f), gpu_res(acc.size(), -1.0f);
          powersgd::reconstruct(p.data(), q.data(), rows, cols, r, n, average, cpu.data(),
                                with_residual ? cpu_res.data() : nullptr);
          emulate_reconstruct(p.data(), q.data(), rows, cols, r, n, average, gpu.data(),
                              with_residual ? gpu_res.data() : nullptr);
          ASSERT_EQ(std::memcmp(cpu.data(), gpu.data(), acc.size() * 4), 0);
          ASSERT_EQ(std::memcmp(cpu_res.data(), gpu_res.data(), acc.size() * 4), 0);
        }
      }
    }
  }
}

TEST(PowersgdGpuLogic, InitialDrawIsTheCpus) {
  const PhiloxStream s{42, philox_stream_id(0x1234, 0, -1)};
  std::vector<float> cpu(1001), gpu(1001);
  powersgd::draw_initial_q(cpu.data(), static_cast<int64_t>(cpu.size()), s);
  for (size_t e = 0; e < gpu.size(); ++e) gpu[e] = powersgd::initial_q(s, e);  // draw_q_kernel
  EXPECT_EQ(std::memcmp(cpu.data(), gpu.data(), cpu.size() * 4), 0);
}

TEST(PowersgdGpuLogic, ColumnMajorGemmArgumentsGiveTheCpusRowMajorProducts) {
  for (const auto& [rows, cols, r] : {std::tuple<int64_t, int64_t, int>{2, 1, 1}, {7, 5, 3}, {64, 48, 4},
                                      {33, 100, 2}, {100, 33, 8}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " r=" << r);
    Entry e;
    e.rows = rows;
    e.cols = cols;
    e.numel = rows * cols;
    e.rank = r;
    const std::vector<float> m = random_floats(static_cast<size_t>(rows * cols), 11);
    const std::vector<float> q = random_floats(static_cast<size_t>(cols * r), 12);
    const std::vector<float> p = random_floats(static_cast<size_t>(rows * r), 13);
    std::vector<float> cpu_p(p.size()), gpu_p(p.size()), cpu_q(q.size()), gpu_q(q.size());
    powersgd::multiply(m.data(), rows, cols, q.data(), r, cpu_p.data());
    colmajor_sgemm(powersgd::gemm_for_p(e), q.data(), m.data(), gpu_p.data());
    powersgd::multiply_transposed(m.data(), rows, cols, p.data(), r, cpu_q.data());
    colmajor_sgemm(powersgd::gemm_for_q(e), p.data(), m.data(), gpu_q.data());
    // Sums of up to 100 products of N(0, 1) values, in two orders.
    for (size_t i = 0; i < p.size(); ++i) ASSERT_NEAR(gpu_p[i], cpu_p[i], 1e-4f) << "P " << i;
    for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(gpu_q[i], cpu_q[i], 1e-4f) << "Q " << i;
    const powersgd::Gemm g = powersgd::gemm_for_q(e);  // cuBLAS's own argument checks
    EXPECT_GE(g.lda, std::max(1, g.m));
    EXPECT_GE(g.ldb, std::max(1, g.trans_b ? g.n : g.k));
    EXPECT_GE(g.ldc, std::max(1, g.m));
  }
}

TEST(PowersgdGpuLogic, BatchesKeepPlanOrderAndSkipEmptyParts) {
  std::vector<Part> parts;
  for (int i = 0; i < 70; ++i) {
    parts.push_back({64 * 32, 64});  // a matrix at rank 1
    if (i % 10 == 0) parts.push_back({5, 0});  // a bias
  }
  parts.push_back({0, 0});
  const Plan plan = powersgd::make_plan(parts, 1, 2.0);
  ASSERT_EQ(plan.matrices, 70);
  const auto matrices = powersgd::batches(plan, true);
  const auto dense = powersgd::batches(plan, false);
  ASSERT_EQ(matrices.size(), 3u);
  EXPECT_EQ(matrices[0].count, powersgd::kBatchEntries);
  EXPECT_EQ(matrices[2].count, 70 - 2 * powersgd::kBatchEntries);
  ASSERT_EQ(dense.size(), 1u);
  EXPECT_EQ(dense[0].count, 7);  // the empty part has nothing to launch
  // Every non-empty entry once, matrices then dense parts, each in plan order.
  std::vector<int64_t> want, got;
  for (bool compressed : {true, false}) {
    for (const Entry& e : plan.entries) {
      if ((e.rank > 0) == compressed && e.numel > 0) want.push_back(e.offset);
    }
    for (const auto& batch : powersgd::batches(plan, compressed)) {
      for (int b = 0; b < batch.count; ++b) got.push_back(batch.entries[b].offset);
    }
  }
  EXPECT_EQ(got, want);
}

// ---- a whole step -----------------------------------------------------------------------------

// nccl_powersgd_allreduce.cc at N = 1 (no rings), warm start, error feedback, with the
// emulated kernels and products.
struct EmulatedKey {
  std::vector<float> residual, q;
};

void emulated_step(std::vector<float>& data, const Plan& plan, uint64_t seed, uint64_t key_hash, bool average,
                   EmulatedKey& key) {
  if (key.residual.empty()) key.residual.assign(data.size(), 0.0f);
  for (size_t i = 0; i < data.size(); ++i) data[i] += key.residual[i];
  if (key.q.empty()) {
    key.q.resize(static_cast<size_t>(plan.q_floats));
    const PhiloxStream s{seed, philox_stream_id(key_hash, 0, -1)};
    for (size_t e = 0; e < key.q.size(); ++e) key.q[e] = powersgd::initial_q(s, e);
    for (const Entry& e : plan.entries) {
      if (e.rank > 0) emulate_orthonormalize(key.q.data() + e.q_offset, e.cols, e.rank);
    }
  }
  std::vector<float> p_buf(static_cast<size_t>(plan.p_floats + plan.dense_floats));
  for (const Entry& e : plan.entries) {
    if (e.rank > 0) {
      colmajor_sgemm(powersgd::gemm_for_p(e), key.q.data() + e.q_offset, data.data() + e.offset,
                     p_buf.data() + e.p_offset);
    } else {
      std::copy_n(data.data() + e.offset, e.numel, p_buf.data() + e.p_offset);
    }
  }
  for (const Entry& e : plan.entries) {
    if (e.rank == 0) continue;
    emulate_orthonormalize(p_buf.data() + e.p_offset, e.rows, e.rank);
    colmajor_sgemm(powersgd::gemm_for_q(e), p_buf.data() + e.p_offset, data.data() + e.offset,
                   key.q.data() + e.q_offset);
  }
  for (const Entry& e : plan.entries) {
    if (e.rank > 0) {
      emulate_reconstruct(p_buf.data() + e.p_offset, key.q.data() + e.q_offset, e.rows, e.cols, e.rank, 1, average,
                          data.data() + e.offset, key.residual.data() + e.offset);
    } else {
      for (int64_t i = 0; i < e.numel; ++i) {
        powersgd::finish_element(p_buf[e.p_offset + i], 1, average, data.data() + e.offset + i, nullptr);
        key.residual[e.offset + i] = 0.0f;
      }
    }
  }
}

double relative_error(std::span<const float> got, std::span<const float> want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    norm += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(diff / norm);
}

// A gradient whose matrices are rank 3 with singular values about 4, 2, 1 plus 1% noise:
// rank 2 has a clear gap on both sides. Fixed directions, fresh noise each step.
std::vector<float> gradient(const std::vector<Part>& parts, int step) {
  std::vector<float> g;
  uint32_t seed = 100;
  for (const Part& part : parts) {
    ++seed;
    if (part.rows == 0) {
      const auto bias = random_floats(static_cast<size_t>(part.numel), seed * 7 + static_cast<uint32_t>(step));
      g.insert(g.end(), bias.begin(), bias.end());
      continue;
    }
    const int64_t rows = part.rows, cols = part.numel / part.rows;
    const auto u = random_floats(static_cast<size_t>(rows * 3), seed, 1.0f / std::sqrt(static_cast<float>(rows)));
    const auto v = random_floats(static_cast<size_t>(cols * 3), seed + 50, 1.0f / std::sqrt(static_cast<float>(cols)));
    const auto noise = random_floats(static_cast<size_t>(part.numel), seed * 13 + static_cast<uint32_t>(step),
                                     0.01f / std::sqrt(static_cast<float>(cols)));
    testing::append_spiked(g, rows, cols, u, v, noise);
  }
  return g;
}

TEST(PowersgdGpuLogic, EmulatedStepStaysWithinTheStatedToleranceOfTheCpuEngine) {
  constexpr double kTolerance = 1e-4;  // compressors/lowrank/gpu_powersgd.h
  const std::vector<Part> parts = {{64 * 48, 64}, {48, 0}, {32 * 36, 32}, {300 * 20, 300}};
  const std::vector<std::vector<int64_t>> shapes = {{64, 48}, {48}, {32, 4, 3, 3}, {300, 20}};
  CompressOptions options;
  options.compressor = "powersgd:rank=2,seed=9";
  options.key = "layer";
  options.parts = shapes;
  const Plan plan = powersgd::make_plan(parts, 2, 2.0);
  ASSERT_EQ(plan.matrices, 3);
  const uint64_t key_hash =
      fnv1a64(std::span(reinterpret_cast<const uint8_t*>(options.key.data()), options.key.size()));

  EmulatedKey emulated;
  double worst_out = 0, worst_residual = 0, worst_q = 0;
  testing::run_ranks(1, [&](Communicator& comm) {
    for (int step = 0; step < 6; ++step) {
      const bool average = step % 2 == 1;
      std::vector<float> cpu = gradient(parts, step);
      std::vector<float> gpu = cpu;
      comm.allreduce(TensorView::of(cpu.data(), static_cast<int64_t>(cpu.size())),
                     average ? ReduceOp::kAvg : ReduceOp::kSum, options);
      emulated_step(gpu, plan, 9, key_hash, average, emulated);
      const CompressionState state = parse_state(comm.save_state(), 0, 1);
      const KeyState& key = state.keys.at("layer");
      const std::span<const float> residual(reinterpret_cast<const float*>(key.residual.data()),
                                            key.residual.size() / 4);
      const std::span<const float> q(reinterpret_cast<const float*>(key.extra.data()), key.extra.size() / 4);
      ASSERT_EQ(residual.size(), emulated.residual.size());
      ASSERT_EQ(q.size(), emulated.q.size());
      worst_out = std::max(worst_out, relative_error(gpu, cpu));
      worst_residual = std::max(worst_residual, relative_error(emulated.residual, residual));
      worst_q = std::max(worst_q, relative_error(emulated.q, q));
    }
  });
  RecordProperty("worst_relative_error_out", std::to_string(worst_out));
  std::printf("relative Frobenius error vs the CPU engine: out %.2e, residual %.2e, Q %.2e\n", worst_out,
              worst_residual, worst_q);
  EXPECT_LE(worst_out, kTolerance);
  EXPECT_LE(worst_residual, kTolerance);
  EXPECT_LE(worst_q, kTolerance);
}

}  // namespace
}  // namespace gradcomm::detail
