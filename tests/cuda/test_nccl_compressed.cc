// Compressed allreduce of CUDA tensors on the NCCL path (the GPU codecs,
// src/collectives/nccl_compressed*.cc): at N = 1 every compressor equals the CPU
// path's bytes on the same inputs and key history (several steps, error feedback,
// warm-up), save_state/load_state carry device residuals both ways, corrupt state
// sizes are refused, top-k's algo=reduce_scatter is refused; at N > 1 (one GPU per
// rank, threads) every rank ends bitwise identical and equal to the CPU path over
// threads. Everything skips without a GPU.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "comm_impl.h"
#include "cuda/buffer.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda_test_util.h"
#include "gradcomm/gradcomm.h"
#include "transport/inproc/inproc_transport.h"
#include "unit/test_util.h"

namespace gradcomm {
namespace {

using detail::cuda_device_count;
using detail::cuda_unavailable_reason;

// Sketch with clear heavy hitters: its GPU table is summed with atomics (bits may
// differ from the CPU's), so the recovered indices must not hinge on ties.
// Top-k in every payload format (the default: coded indices, bf16 values).
const char* const kSpecs[] = {"fp16",
                              "bf16",
                              "topk:ratio=0.01",
                              "topk:ratio=0.02,select=sample",
                              "topk:k=50,values=fp16",
                              "topk:ratio=0.01,indices=raw,values=fp32",
                              "topk:ratio=0.03,indices=raw,values=bf16,select=sample",
                              "topk:ratio=0.6,indices=coded,values=fp32,algo=allgather",
                              "randomk:ratio=0.05",
                              "randomk:ratio=0.05,values=fp16",
                              "randomk:ratio=0.05,values=bf16",
                              "qsgd:levels=16,bucket=512",
                              "quant:bits=4,bucket=256,round=stochastic,ef=1",
                              "quant:bits=2,bucket=128,round=nearest",
                              "sign:bucket=128",
                              "sign:bucket=64,warmup=2",
                              "sketch:rows=5,k=20",
                              "sketch:rows=5,k=20,values=bf16"};

float input(int rank, int step, int64_t i, bool heavy) {
  const float base = std::sin(0.01f * static_cast<float>(i * (rank + 1) + 13 * step)) * (1 + i % 5);
  return heavy && i % 97 == 0 ? base + 1000.0f + static_cast<float>(i) : base;
}

// Runs `body` as the allreduce of host values `x` on a CUDA copy, returns the result.
std::vector<float> on_gpu(Communicator& comm, std::vector<float> x, const CompressOptions& options, ReduceOp op) {
  detail::DeviceBuffer t(x.size() * sizeof(float));
  GRADCOMM_CUDA_CHECK(cudaMemcpy(t.data(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  comm.allreduce(TensorView{t.data(), static_cast<int64_t>(x.size()), DType::kFloat32, {DeviceType::kCuda, 0}}, op,
                 options);
  comm.synchronize();
  GRADCOMM_CUDA_CHECK(cudaMemcpy(x.data(), t.data(), x.size() * 4, cudaMemcpyDeviceToHost));
  return x;
}

TEST(NcclCompressed, SingleRankEveryCompressorGivesTheCpuPathsBytesOverSteps) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gpu = testing::single_rank("nccl");
  auto cpu = testing::single_rank("ucx");
  const int64_t numel = 10007;
  for (const char* spec : kSpecs) {
    SCOPED_TRACE(spec);
    const bool heavy = std::string(spec).starts_with("sketch");
    for (int step = 0; step < 4; ++step) {
      std::vector<float> host(numel);
      for (int64_t i = 0; i < numel; ++i) host[i] = input(0, step, i, heavy);
      CompressOptions options;
      options.compressor = spec;
      options.key = fmt::format("t/{}", spec);
      const ReduceOp op = step % 2 == 0 ? ReduceOp::kSum : ReduceOp::kAvg;
      std::vector<float> reference = host;
      cpu->allreduce(TensorView::of(reference.data(), numel), op, options);
      const std::vector<float> got = on_gpu(*gpu, host, options, op);
      ASSERT_EQ(std::memcmp(got.data(), reference.data(), numel * 4), 0) << "step " << step;
    }
    ASSERT_EQ(gpu->save_state(), cpu->save_state()) << "residuals and steps";
  }
  EXPECT_EQ(gpu->impl().cuda_path(), "nccl");
}

// Communicator::sent_mask of a key whose state lives on the GPU: written on the
// device, equal to the CPU path's mask after the same steps (the selections are the
// same); a host mask for device state is refused by name.
TEST(NcclCompressed, SentMaskOnTheDeviceEqualsTheCpuPaths) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gpu = testing::single_rank("nccl");
  auto cpu = testing::single_rank("ucx");
  const int64_t numel = 10007;
  detail::DeviceBuffer mask(numel * sizeof(float));
  const TensorView device_mask{mask.data(), numel, DType::kFloat32, {DeviceType::kCuda, 0}};
  for (const char* spec : {"topk:ratio=0.01", "topk:ratio=0.02,select=sample", "randomk:ratio=0.05",
                           "sketch:rows=5,k=20"}) {
    SCOPED_TRACE(spec);
    const bool heavy = std::string(spec).starts_with("sketch");
    const CompressOptions options{spec, fmt::format("m/{}", spec), nullptr};
    EXPECT_FALSE(gpu->sent_mask(options.key, device_mask)) << "nothing sent yet";
    for (int step = 0; step < 3; ++step) {
      std::vector<float> host(numel);
      for (int64_t i = 0; i < numel; ++i) host[i] = input(0, step, i, heavy);
      std::vector<float> reference = host;
      cpu->allreduce(TensorView::of(reference.data(), numel), ReduceOp::kSum, options);
      on_gpu(*gpu, host, options, ReduceOp::kSum);
    }
    std::vector<float> expected(numel), got(numel, -1.0f);
    ASSERT_TRUE(cpu->sent_mask(options.key, TensorView::of(expected.data(), numel)));
    ASSERT_TRUE(gpu->sent_mask(options.key, device_mask));
    GRADCOMM_CUDA_CHECK(cudaDeviceSynchronize());
    GRADCOMM_CUDA_CHECK(cudaMemcpy(got.data(), mask.data(), numel * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, expected);
    EXPECT_GT(std::count(got.begin(), got.end(), 0.0f), 0);
    EXPECT_THROW(gpu->sent_mask(options.key, TensorView::of(got.data(), numel)), InvalidArgument);
  }
}

// The NCCL path has only the sparse allgather; asking for the reduce-scatter is an
// error that names the way out, not a silent change of algorithm.
TEST(NcclCompressed, TopkReduceScatterIsRefusedForCudaTensors) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gpu = testing::single_rank("nccl");
  CompressOptions options;
  options.compressor = "topk:ratio=0.01,algo=reduce_scatter";
  options.key = "rs";
  try {
    on_gpu(*gpu, std::vector<float>(4096, 1.0f), options, ReduceOp::kSum);
    ADD_FAILURE() << "algo=reduce_scatter ran on a CUDA tensor";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("algo=reduce_scatter"), std::string::npos) << e.what();
  }
}

TEST(NcclCompressed, SaveAndLoadStateCarryDeviceResiduals) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t numel = 4099;
  const CompressOptions options{"sign:bucket=128", "w", nullptr};
  std::vector<float> host(numel);
  for (int64_t i = 0; i < numel; ++i) host[i] = input(0, 0, i, false);
  // Two GPU steps, save, continue on a fresh communicator that loaded the state,
  // against the CPU path doing the same.
  auto a = testing::single_rank("nccl");
  auto cpu = testing::single_rank("ucx");
  for (int step = 0; step < 2; ++step) {
    on_gpu(*a, host, options, ReduceOp::kSum);
    std::vector<float> x = host;
    cpu->allreduce(TensorView::of(x.data(), numel), ReduceOp::kSum, options);
  }
  const std::vector<uint8_t> saved = a->save_state();
  ASSERT_EQ(saved, cpu->save_state());
  auto b = testing::single_rank("nccl");
  b->load_state(saved);
  std::vector<float> x = host;
  cpu->allreduce(TensorView::of(x.data(), numel), ReduceOp::kSum, options);
  const std::vector<float> got = on_gpu(*b, host, options, ReduceOp::kSum);
  EXPECT_EQ(std::memcmp(got.data(), x.data(), numel * 4), 0);
  EXPECT_EQ(b->save_state(), cpu->save_state());
  // A CPU call on a key whose state is on the GPU takes the residual back.
  std::vector<float> y = host, z = host;
  b->allreduce(TensorView::of(y.data(), numel), ReduceOp::kSum, options);
  cpu->allreduce(TensorView::of(z.data(), numel), ReduceOp::kSum, options);
  EXPECT_EQ(std::memcmp(y.data(), z.data(), numel * 4), 0);
}

TEST(NcclCompressedThreads, EveryCompressorIsBitwiseIdenticalAcrossRanksAndMatchesTheCpuRing) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int devices = cuda_device_count();
  if (devices < 2) GTEST_SKIP() << "needs a GPU per rank (this machine has " << devices << ")";
  const int64_t numel = 50001;
  for (int n = 2; n <= std::min(devices, 4); ++n) {
    for (const char* spec : kSpecs) {
      SCOPED_TRACE(fmt::format("N={} {}", n, spec));
      const bool heavy = std::string(spec).starts_with("sketch");
      std::vector<std::vector<float>> gpu_out(n), cpu_out(n);
      CompressOptions options;
      options.compressor = spec;
      options.key = "grad";
      testing::run_device_threads(n, "nccl", [](int r) { return r; }, [&](Communicator& comm, int device) {
        detail::DeviceBuffer t(numel * 4);
        for (int step = 0; step < 3; ++step) {
          std::vector<float> x(numel);
          for (int64_t i = 0; i < numel; ++i) x[i] = input(comm.rank(), step, i, heavy);
          GRADCOMM_CUDA_CHECK(cudaMemcpy(t.data(), x.data(), numel * 4, cudaMemcpyHostToDevice));
          comm.allreduce(TensorView{t.data(), numel, DType::kFloat32, {DeviceType::kCuda, device}}, ReduceOp::kAvg,
                         options);
        }
        comm.synchronize();
        gpu_out[comm.rank()].resize(numel);
        GRADCOMM_CUDA_CHECK(cudaMemcpy(gpu_out[comm.rank()].data(), t.data(), numel * 4, cudaMemcpyDeviceToHost));
      });
      testing::run_device_threads(n, "ucx", [](int) { return 0; }, [&](Communicator& comm, int) {
        std::vector<float> x(numel);
        for (int step = 0; step < 3; ++step) {
          for (int64_t i = 0; i < numel; ++i) x[i] = input(comm.rank(), step, i, heavy);
          comm.allreduce(TensorView::of(x.data(), numel), ReduceOp::kAvg, options);
        }
        cpu_out[comm.rank()] = x;
      });
      for (int r = 1; r < n; ++r) ASSERT_EQ(gpu_out[r], gpu_out[0]) << "rank " << r;
      // The ring codecs and top-k are bitwise the CPU path's; randomk/sketch sum small
      // value vectors with NCCL's ring where the CPU uses recursive doubling (N > 2).
      const std::string s = spec;
      if (!s.starts_with("randomk") && !s.starts_with("sketch")) {
        ASSERT_EQ(std::memcmp(gpu_out[0].data(), cpu_out[0].data(), numel * 4), 0);
      }
    }
  }
}

}  // namespace
}  // namespace gradcomm
