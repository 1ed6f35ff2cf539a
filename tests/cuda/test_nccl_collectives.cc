// Collectives on CUDA tensors: NCCL with N = 1 for every collective, dtype and op
// (and N > 1 over threads when the machine has a GPU per rank), the staging path
// over threads sharing one GPU (N = 2, 3), compressors through the staging seam,
// stream ordering, and the errors of bad device use. Expected values are closed
// form (tests/common/closed_form.h) or, for compressors, the CPU path's bytes on
// the same input. Everything that needs a GPU skips without one.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "comm_impl.h"
#include "common/closed_form.h"
#include "cuda/buffer.h"
#include "cuda/check.h"
#include "cuda_test_util.h"
#include "gradcomm/gradcomm.h"
#include "transport/inproc/inproc_transport.h"
#include "unit/test_util.h"

namespace gradcomm {
namespace {

using detail::cuda_device_count;
using detail::cuda_unavailable_reason;

constexpr DType kDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                             DType::kInt32,   DType::kInt64,   DType::kUInt8};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax};

// Rank r's element i: small integers, exact in every dtype; uint8 gets them
// shifted to be non-negative (its sums over <= 8 ranks stay below 256).
double value(DType dtype, int rank, int64_t i) {
  return testing::contribution(rank, i) + (dtype == DType::kUInt8 ? 6.0 : 0.0);
}

std::vector<uint8_t> host_input(DType dtype, int rank, int64_t numel) {
  std::vector<uint8_t> out(numel * dtype_size(dtype));
  for (int64_t i = 0; i < numel; ++i) testing::store_value(dtype, out.data(), i, value(dtype, rank, i));
  return out;
}

std::vector<uint8_t> expected_allreduce(DType dtype, ReduceOp op, int n, int64_t numel) {
  return testing::expected_allreduce(dtype, op, n, numel, [dtype](int r, int64_t i) { return value(dtype, r, i); });
}

// Device memory with guard bytes on both sides, to catch writes outside the tensor.
class GuardedDevice {
 public:
  static constexpr size_t kGuard = 256;
  static constexpr uint8_t kPattern = 0xA5;
  GuardedDevice(int device, std::span<const uint8_t> contents) : device_(device), bytes_(contents.size()) {
    detail::DeviceGuard guard(device);
    memory_ = detail::DeviceBuffer(bytes_ + 2 * kGuard);
    GRADCOMM_CUDA_CHECK(cudaMemset(memory_.data(), kPattern, memory_.size()));
    if (bytes_ > 0) GRADCOMM_CUDA_CHECK(cudaMemcpy(data(), contents.data(), bytes_, cudaMemcpyHostToDevice));
  }
  void* data() const { return memory_.as<uint8_t>() + kGuard; }
  TensorView view(DType dtype) const {
    return TensorView{data(), static_cast<int64_t>(bytes_ / dtype_size(dtype)), dtype, {DeviceType::kCuda, device_}};
  }
  // The tensor's bytes (after a device synchronize); fails the test on a broken guard.
  std::vector<uint8_t> read() const {
    detail::DeviceGuard guard(device_);
    std::vector<uint8_t> all(memory_.size());
    GRADCOMM_CUDA_CHECK(cudaDeviceSynchronize());
    GRADCOMM_CUDA_CHECK(cudaMemcpy(all.data(), memory_.data(), all.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < kGuard; ++i) {
      EXPECT_EQ(all[i], kPattern) << "write before the tensor at -" << (kGuard - i);
      EXPECT_EQ(all[kGuard + bytes_ + i], kPattern) << "write after the tensor at +" << i;
    }
    return std::vector<uint8_t>(all.begin() + kGuard, all.begin() + kGuard + bytes_);
  }

 private:
  int device_;
  size_t bytes_;
  detail::DeviceBuffer memory_;
};

// N ranks as threads over the in-process transport; rank r on device device_of(r).
void run_threads(int n, const std::string& transport, const std::function<void(Communicator&)>& fn) {
  const auto errors = testing::run_transport_threads(n, [&](int, std::unique_ptr<detail::Transport> t) {
    auto impl = std::make_unique<detail::CommunicatorImpl>(std::move(t), std::chrono::seconds(60));
    impl->set_transport_preference(transport);
    Communicator comm(std::move(impl));
    fn(comm);
  });
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// ---- without a GPU ----------------------------------------------------------------------------

TEST(CudaTensors, OnAMachineWithoutThatDeviceAreUnsupported) {
  auto comm = testing::single_rank("auto");
  float dummy = 0;
  const int missing = cuda_device_count();  // one past the last device (0 when there is none)
  TensorView t{&dummy, 1, DType::kFloat32, {DeviceType::kCuda, missing}};
  try {
    comm->allreduce(t);
    FAIL() << "expected Unsupported";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
  comm->synchronize();  // nothing was enqueued: a no-op
}

// ---- N = 1 -----------------------------------------------------------------------------------------

class SingleRank : public ::testing::TestWithParam<std::string> {};  // "auto" (NCCL) or "ucx" (staging)

TEST_P(SingleRank, DenseAllreduceEveryDtypeOpAndSize) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto comm = testing::single_rank(GetParam());
  for (DType dtype : kDtypes) {
    for (ReduceOp op : kOps) {
      for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000003}}) {
        SCOPED_TRACE(fmt::format("{} {} numel={}", dtype_name(dtype), reduce_op_name(op), numel));
        GuardedDevice t(0, host_input(dtype, 0, numel));
        comm->allreduce(t.view(dtype), op);
        comm->synchronize();
        ASSERT_EQ(t.read(), expected_allreduce(dtype, op, 1, numel));
      }
    }
  }
  EXPECT_EQ(comm->impl().cuda_path(), GetParam() == "ucx" ? "staging" : "nccl");
}

TEST_P(SingleRank, AllgatherAndBroadcast) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto comm = testing::single_rank(GetParam());
  for (int64_t numel : {int64_t{0}, int64_t{5}, int64_t{300001}}) {
    const auto input = host_input(DType::kInt32, 0, numel);
    GuardedDevice in(0, input);
    GuardedDevice out(0, std::vector<uint8_t>(input.size(), 0));
    comm->allgather(in.view(DType::kInt32), out.view(DType::kInt32));
    GuardedDevice b(0, input);
    comm->broadcast(b.view(DType::kInt32), 0);
    comm->synchronize();
    EXPECT_EQ(out.read(), input);
    EXPECT_EQ(b.read(), input);
  }
}

TEST_P(SingleRank, CompressorsGiveTheCpuPathsBytes) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gpu = testing::single_rank(GetParam());
  auto cpu = testing::single_rank("ucx");
  const int64_t numel = 10007;
  for (const char* spec : {"fp16", "bf16", "topk:ratio=0.01", "randomk:ratio=0.05", "qsgd:levels=16,bucket=512",
                           "quant:bits=4,bucket=256,round=stochastic", "sign:bucket=128", "sketch:rows=3,k=50"}) {
    SCOPED_TRACE(spec);
    std::vector<float> host(numel);
    for (int64_t i = 0; i < numel; ++i) host[i] = std::sin(0.01f * static_cast<float>(i)) * (1 + i % 5);
    for (int step = 0; step < 3; ++step) {  // error feedback carries state across steps
      std::vector<float> reference = host;
      CompressOptions options;
      options.compressor = spec;
      options.key = fmt::format("t/{}", spec);
      cpu->allreduce(TensorView::of(reference.data(), numel), ReduceOp::kSum, options);
      GuardedDevice t(0, std::span(reinterpret_cast<const uint8_t*>(host.data()), host.size() * 4));
      gpu->allreduce(t.view(DType::kFloat32), ReduceOp::kSum, options);
      gpu->synchronize();
      const auto got = t.read();
      ASSERT_EQ(std::memcmp(got.data(), reference.data(), got.size()), 0) << "step " << step;
    }
  }
}

TEST_P(SingleRank, CallsAreOrderedOnTheCallersStream) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto comm = testing::single_rank(GetParam());
  detail::Stream stream;
  const int64_t numel = 1 << 22;
  GuardedDevice t(0, host_input(DType::kFloat32, 0, numel));
  // Work enqueued before the call on the same stream must be seen by it (the
  // memset), work after it must see its result (the copy of two ones); the host
  // never waits in between. fp16 goes through the staging copies even at N = 1.
  GRADCOMM_CUDA_CHECK(cudaMemsetAsync(t.data(), 0, numel * 4, stream.get()));
  CompressOptions options;
  options.compressor = "fp16";
  options.stream = stream.get();
  comm->allreduce(t.view(DType::kFloat32), ReduceOp::kSum, options);
  detail::PinnedBuffer ones(8);
  const float one = 1.0f;
  std::memcpy(ones.as<uint8_t>(), &one, 4);
  std::memcpy(ones.as<uint8_t>() + 4, &one, 4);
  GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(t.data(), ones.data(), 8, cudaMemcpyHostToDevice, stream.get()));
  comm->synchronize();
  stream.synchronize();
  const auto got = t.read();
  std::vector<float> expected(numel, 0.0f);
  expected[0] = expected[1] = 1.0f;
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(Paths, SingleRank, ::testing::Values("auto", "ucx"));

TEST(SingleRankDevice, ALaterTensorOnAnotherDeviceIsInvalid) {
  SKIP_WITHOUT_CUDA_DEVICE();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  auto comm = testing::single_rank("auto");
  GuardedDevice a(0, host_input(DType::kFloat32, 0, 10));
  GuardedDevice b(1, host_input(DType::kFloat32, 0, 10));
  comm->allreduce(a.view(DType::kFloat32));
  EXPECT_THROW(comm->allreduce(b.view(DType::kFloat32)), InvalidArgument);
}

TEST(SingleRankDevice, HostMemoryLabelledCudaIsInvalidAndLeavesTheCommunicatorUsable) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto comm = testing::single_rank("auto");
  float host[4] = {1, 2, 3, 4};
  EXPECT_THROW(comm->allreduce(TensorView::of(host, 4, Device{DeviceType::kCuda, 0})), InvalidArgument);
  GuardedDevice t(0, host_input(DType::kFloat32, 0, 4));
  comm->allreduce(t.view(DType::kFloat32));
  comm->synchronize();
  EXPECT_EQ(t.read(), expected_allreduce(DType::kFloat32, ReduceOp::kSum, 1, 4));
}

// ---- N > 1 over threads -------------------------------------------------------------------------------

// Dense allreduce, allgather and broadcast on n ranks; every rank must hold the
// closed-form bytes (hence the same bytes). `device_of` places the ranks.
void check_dense_threads(int n, const std::string& transport, const std::function<int(int)>& device_of,
                         const std::string& expected_path) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt32, DType::kUInt8}) {
    for (ReduceOp op : kOps) {
      for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{n - 1}, int64_t{1000003}}) {
        SCOPED_TRACE(fmt::format("N={} {} {} {} numel={}", n, transport, dtype_name(dtype), reduce_op_name(op), numel));
        std::vector<std::unique_ptr<GuardedDevice>> tensors;
        for (int r = 0; r < n; ++r) tensors.push_back(std::make_unique<GuardedDevice>(device_of(r), host_input(dtype, r, numel)));
        std::vector<std::string> paths(n);
        run_threads(n, transport, [&](Communicator& comm) {
          comm.allreduce(tensors[comm.rank()]->view(dtype), op);
          comm.synchronize();
          paths[comm.rank()] = comm.impl().cuda_path();
        });
        const auto expected = expected_allreduce(dtype, op, n, numel);
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(tensors[r]->read(), expected) << "rank " << r;
          ASSERT_EQ(paths[r], expected_path);
        }
      }
    }
  }
  // Allgather then broadcast from the last rank.
  const int64_t per_rank = 100003;
  std::vector<std::unique_ptr<GuardedDevice>> in, out, bc;
  for (int r = 0; r < n; ++r) {
    in.push_back(std::make_unique<GuardedDevice>(device_of(r), host_input(DType::kInt64, r, per_rank)));
    out.push_back(std::make_unique<GuardedDevice>(device_of(r), std::vector<uint8_t>(per_rank * 8 * n, 0)));
    bc.push_back(std::make_unique<GuardedDevice>(device_of(r), host_input(DType::kInt64, r, per_rank)));
  }
  run_threads(n, transport, [&](Communicator& comm) {
    comm.allgather(in[comm.rank()]->view(DType::kInt64), out[comm.rank()]->view(DType::kInt64));
    comm.broadcast(bc[comm.rank()]->view(DType::kInt64), n - 1);
    comm.synchronize();
  });
  std::vector<uint8_t> gathered;
  for (int r = 0; r < n; ++r) {
    const auto block = host_input(DType::kInt64, r, per_rank);
    gathered.insert(gathered.end(), block.begin(), block.end());
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(out[r]->read(), gathered) << "allgather, rank " << r;
    EXPECT_EQ(bc[r]->read(), host_input(DType::kInt64, n - 1, per_rank)) << "broadcast, rank " << r;
  }
}

TEST(StagingThreads, RanksSharingOneGpuStageAndAgreeBitwise) {
  SKIP_WITHOUT_CUDA_DEVICE();
  for (int n : {2, 3}) check_dense_threads(n, "auto", [](int) { return 0; }, "staging");
}

TEST(StagingThreads, CompressorsAreBitwiseIdenticalAcrossRanks) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t numel = 50001;
  for (int n : {2, 3}) {
    for (const char* spec : {"fp16", "bf16", "topk:ratio=0.01", "randomk:ratio=0.05", "qsgd:levels=16,bucket=512",
                             "quant:bits=2,bucket=256,round=nearest", "sign:bucket=128", "sketch:rows=3,k=100"}) {
      SCOPED_TRACE(fmt::format("N={} {}", n, spec));
      std::vector<std::unique_ptr<GuardedDevice>> tensors;
      for (int r = 0; r < n; ++r) {
        std::vector<float> host(numel);
        for (int64_t i = 0; i < numel; ++i) host[i] = std::cos(0.003f * static_cast<float>(i * (r + 1))) * (r + 1);
        tensors.push_back(std::make_unique<GuardedDevice>(
            0, std::span(reinterpret_cast<const uint8_t*>(host.data()), host.size() * 4)));
      }
      run_threads(n, "auto", [&](Communicator& comm) {
        CompressOptions options;
        options.compressor = spec;
        options.key = "grad";
        for (int step = 0; step < 2; ++step) comm.allreduce(tensors[comm.rank()]->view(DType::kFloat32), ReduceOp::kAvg, options);
        comm.synchronize();
      });
      const auto first = tensors[0]->read();
      for (int r = 1; r < n; ++r) ASSERT_EQ(tensors[r]->read(), first) << "rank " << r;
    }
  }
}

TEST(StagingThreads, NcclDemandedOnASharedGpuIsUnsupportedOnEveryRank) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int n = 2;
  std::vector<std::unique_ptr<GuardedDevice>> tensors;
  for (int r = 0; r < n; ++r) tensors.push_back(std::make_unique<GuardedDevice>(0, host_input(DType::kFloat32, r, 10)));
  std::atomic<int> unsupported{0};
  run_threads(n, "nccl", [&](Communicator& comm) {
    try {
      comm.allreduce(tensors[comm.rank()]->view(DType::kFloat32));
    } catch (const Unsupported& e) {
      if (std::string(e.what()).find("share GPU") != std::string::npos) ++unsupported;
    }
  });
  EXPECT_EQ(unsupported.load(), n);
}

TEST(NcclThreads, OneGpuPerRankTakesNcclAndMatchesClosedForm) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int devices = cuda_device_count();
  if (devices < 2) GTEST_SKIP() << "needs a GPU per rank (this machine has " << devices << ")";
  for (int n = 2; n <= std::min(devices, 4); ++n) check_dense_threads(n, "auto", [](int r) { return r; }, "nccl");
}

}  // namespace
}  // namespace gradcomm
