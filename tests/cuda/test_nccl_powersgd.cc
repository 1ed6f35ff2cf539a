// PowerSGD on CUDA tensors over NCCL (compressors/lowrank/gpu_powersgd.cu,
// src/collectives/nccl_powersgd_allreduce.cc) against the CPU engine on the same inputs
// and key history: the output, the residual and the kept Q within the tolerance
// gpu_powersgd.h states (1e-4 relative Frobenius error on well-conditioned gradients),
// all-dense calls bit for bit; the Q moves with save_state/load_state and back to the
// host for a CPU call; a warm key's shapes cannot change. At N > 1 (one GPU per rank,
// threads) every rank ends bitwise identical. Everything skips without a GPU.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <span>

#include "comm_impl.h"
#include "cuda/buffer.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "common/spiked_matrix.h"
#include "cuda_test_util.h"
#include "gradcomm/gradcomm.h"
#include "state.h"
#include "unit/test_util.h"

namespace gradcomm {
namespace {

using detail::cuda_device_count;
using detail::cuda_unavailable_reason;

constexpr double kTolerance = 1e-4;  // compressors/lowrank/gpu_powersgd.h

// A DDP-bucket-like tensor: two weight matrices, a conv weight, a bias.
const std::vector<std::vector<int64_t>> kShapes = {{256, 192}, {192}, {64, 32, 3, 3}, {1000, 40}};

int64_t numel_of(const std::vector<std::vector<int64_t>>& shapes) {
  int64_t total = 0;
  for (const auto& s : shapes) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    total += n;
  }
  return total;
}

std::vector<float> normal(size_t count, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = dist(gen);
  return v;
}

// Each matrix rank 3 with singular values about 4, 2, 1 (directions shared by every rank
// and step) plus 1% noise that changes with rank and step: well-conditioned for ranks
// 1 and 2. Biases are noise.
std::vector<float> gradient(int rank, int step) {
  std::vector<float> g;
  uint32_t seed = 1;
  for (const auto& shape : kShapes) {
    ++seed;
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const uint32_t fresh = seed * 1000 + static_cast<uint32_t>(rank * 100 + step);
    if (shape.size() < 2) {
      const auto bias = normal(static_cast<size_t>(numel), fresh, 1.0f);
      g.insert(g.end(), bias.begin(), bias.end());
      continue;
    }
    const int64_t rows = shape[0], cols = numel / rows;
    const auto u = normal(static_cast<size_t>(rows * 3), seed, 1.0f / std::sqrt(static_cast<float>(rows)));
    const auto v = normal(static_cast<size_t>(cols * 3), seed + 500, 1.0f / std::sqrt(static_cast<float>(cols)));
    const auto noise = normal(static_cast<size_t>(numel), fresh, 0.01f / std::sqrt(static_cast<float>(cols)));
    testing::append_spiked(g, rows, cols, u, v, noise);
  }
  return g;
}

double relative_error(std::span<const float> got, std::span<const float> want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    diff += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    norm += static_cast<double>(want[i]) * want[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

std::span<const float> floats(const std::vector<uint8_t>& bytes) {
  return {reinterpret_cast<const float*>(bytes.data()), bytes.size() / sizeof(float)};
}

// The key's saved residual and Q within the tolerance of the reference's.
void expect_state_near(Communicator& got, Communicator& want, const std::string& key) {
  const auto a = detail::parse_state(got.save_state(), got.rank(), got.size());
  const auto b = detail::parse_state(want.save_state(), want.rank(), want.size());
  const detail::KeyState& x = a.keys.at(key);
  const detail::KeyState& y = b.keys.at(key);
  EXPECT_EQ(x.step, y.step);
  ASSERT_EQ(x.residual.size(), y.residual.size());
  ASSERT_EQ(x.extra.size(), y.extra.size());
  EXPECT_LE(relative_error(floats(x.residual), floats(y.residual)), kTolerance) << "residual";
  EXPECT_LE(relative_error(floats(x.extra), floats(y.extra)), kTolerance) << "Q";
}

std::vector<float> on_gpu(Communicator& comm, std::vector<float> x, const CompressOptions& options, ReduceOp op,
                          int device = 0) {
  detail::DeviceBuffer t(x.size() * sizeof(float));
  GRADCOMM_CUDA_CHECK(cudaMemcpy(t.data(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  comm.allreduce(TensorView{t.data(), static_cast<int64_t>(x.size()), DType::kFloat32, {DeviceType::kCuda, device}},
                 op, options);
  comm.synchronize();
  GRADCOMM_CUDA_CHECK(cudaMemcpy(x.data(), t.data(), x.size() * 4, cudaMemcpyDeviceToHost));
  return x;
}

CompressOptions powersgd(const std::string& spec, const std::string& key, bool shaped = true) {
  CompressOptions options;
  options.compressor = spec;
  options.key = key;
  if (shaped) options.parts = kShapes;
  return options;
}

const char* const kSpecs[] = {"powersgd:rank=2", "powersgd:rank=1,warm_start=0", "powersgd:rank=2,ef=0",
                              "powersgd:rank=2,start_iter=2", "powersgd:rank=2,min_compression_rate=1"};

TEST(NcclPowersgd, SingleRankMatchesTheCpuEngineWithinToleranceOverSteps) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gpu = testing::single_rank("nccl");
  auto cpu = testing::single_rank("ucx");
  const auto numel = static_cast<size_t>(numel_of(kShapes));
  for (const char* spec : kSpecs) {
    SCOPED_TRACE(spec);
    const CompressOptions options = powersgd(spec, fmt::format("w/{}", spec));
    for (int step = 0; step < 5; ++step) {
      const ReduceOp op = step % 2 == 0 ? ReduceOp::kSum : ReduceOp::kAvg;
      std::vector<float> want = gradient(0, step);
      ASSERT_EQ(want.size(), numel);
      const std::vector<float> got = on_gpu(*gpu, want, options, op);
      cpu->allreduce(TensorView::of(want.data(), static_cast<int64_t>(numel)), op, options);
      EXPECT_LE(relative_error(got, want), kTolerance) << "step " << step;
    }
    expect_state_near(*gpu, *cpu, options.key);
  }
  EXPECT_EQ(gpu->impl().cuda_path(), "nccl");
}

TEST(NcclPowersgd, AllDenseCallsAreTheCpuEnginesBytes) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gpu = testing::single_rank("nccl");
  auto cpu = testing::single_rank("ucx");
  // No shape: one 1-D tensor, dense; a shape too small to compress: dense as well.
  for (const bool shaped : {false, true}) {
    CompressOptions options = powersgd("powersgd:rank=4", shaped ? "tiny" : "flat", false);
    if (shaped) options.shape = {4, 3};
    const int64_t numel = shaped ? 12 : 10007;
    for (int step = 0; step < 3; ++step) {
      std::vector<float> want = normal(static_cast<size_t>(numel), static_cast<uint32_t>(step + 1), 1.0f);
      const ReduceOp op = step == 1 ? ReduceOp::kAvg : ReduceOp::kSum;
      const std::vector<float> got = on_gpu(*gpu, want, options, op);
      cpu->allreduce(TensorView::of(want.data(), numel), op, options);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << "step " << step;
    }
  }
  EXPECT_EQ(gpu->save_state(), cpu->save_state());
}

TEST(NcclPowersgd, SaveLoadAndCpuCallsCarryTheDeviceQ) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const CompressOptions options = powersgd("powersgd:rank=2", "w");
  const auto numel = static_cast<int64_t>(numel_of(kShapes));
  auto a = testing::single_rank("nccl");
  auto cpu = testing::single_rank("ucx");
  for (int step = 0; step < 2; ++step) {
    std::vector<float> x = gradient(0, step);
    on_gpu(*a, x, options, ReduceOp::kSum);
    cpu->allreduce(TensorView::of(x.data(), numel), ReduceOp::kSum, options);
  }
  expect_state_near(*a, *cpu, "w");
  // A fresh GPU communicator continues from the saved Q and residual (host -> device).
  auto b = testing::single_rank("nccl");
  b->load_state(a->save_state());
  std::vector<float> want = gradient(0, 2);
  const std::vector<float> got = on_gpu(*b, want, options, ReduceOp::kSum);
  cpu->allreduce(TensorView::of(want.data(), numel), ReduceOp::kSum, options);
  EXPECT_LE(relative_error(got, want), kTolerance);
  expect_state_near(*b, *cpu, "w");
  // A CPU call on the key takes the device state back (take_back_from_device).
  std::vector<float> y = gradient(0, 3), z = y;
  b->allreduce(TensorView::of(y.data(), numel), ReduceOp::kSum, options);
  cpu->allreduce(TensorView::of(z.data(), numel), ReduceOp::kSum, options);
  EXPECT_LE(relative_error(y, z), kTolerance);
  expect_state_near(*b, *cpu, "w");
}

TEST(NcclPowersgd, WarmKeyRefusesOtherShapes) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gpu = testing::single_rank("nccl");
  CompressOptions options = powersgd("powersgd:rank=2", "w", false);
  options.shape = {64, 48};
  on_gpu(*gpu, normal(64 * 48, 1, 1.0f), options, ReduceOp::kSum);
  options.shape = {48, 64};  // same numel, another Q size
  EXPECT_THROW(on_gpu(*gpu, normal(64 * 48, 2, 1.0f), options, ReduceOp::kSum), InvalidArgument);
}

TEST(NcclPowersgdThreads, RanksAreBitwiseIdenticalAndNearTheCpuEngine) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int devices = cuda_device_count();
  if (devices < 2) GTEST_SKIP() << "needs a GPU per rank (this machine has " << devices << ")";
  const auto numel = static_cast<size_t>(numel_of(kShapes));
  for (int n = 2; n <= std::min(devices, 4); ++n) {
    for (const char* spec : kSpecs) {
      SCOPED_TRACE(fmt::format("N={} {}", n, spec));
      const CompressOptions options = powersgd(spec, "grad");
      std::vector<std::vector<float>> gpu_out(n), cpu_out(n), gpu_q(n);
      testing::run_device_threads(n, "nccl", [](int r) { return r; }, [&](Communicator& comm, int device) {
        std::vector<float> x;
        for (int step = 0; step < 4; ++step) {
          x = on_gpu(comm, gradient(comm.rank(), step), options, step % 2 == 0 ? ReduceOp::kAvg : ReduceOp::kSum,
                     device);
        }
        gpu_out[comm.rank()] = x;
        const auto state = detail::parse_state(comm.save_state(), comm.rank(), comm.size());
        const auto q = floats(state.keys.at("grad").extra);
        gpu_q[comm.rank()].assign(q.begin(), q.end());
      });
      testing::run_device_threads(n, "ucx", [](int) { return 0; }, [&](Communicator& comm, int) {
        std::vector<float> x;
        for (int step = 0; step < 4; ++step) {
          x = gradient(comm.rank(), step);
          comm.allreduce(TensorView::of(x.data(), static_cast<int64_t>(numel)),
                         step % 2 == 0 ? ReduceOp::kAvg : ReduceOp::kSum, options);
        }
        cpu_out[comm.rank()] = x;
      });
      for (int r = 1; r < n; ++r) {
        ASSERT_EQ(std::memcmp(gpu_out[r].data(), gpu_out[0].data(), numel * 4), 0) << "rank " << r;
        ASSERT_EQ(gpu_q[r], gpu_q[0]) << "rank " << r << "'s Q";
      }
      EXPECT_LE(relative_error(gpu_out[0], cpu_out[0]), kTolerance);
    }
  }
}

}  // namespace
}  // namespace gradcomm
