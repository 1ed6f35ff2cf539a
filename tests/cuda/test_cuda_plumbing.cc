// cuda/check.h, cuda/device.h and cuda/buffer.h. Tests that need a GPU skip
// without one; the error-path tests run everywhere, including machines with no
// driver, which is where most users of a CPU-only run will be.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>

#include "cuda/buffer.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "gradcomm/errors.h"

#include "cuda_test_util.h"

namespace gradcomm::detail {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- devices --------------------------------------------------------------------------
TEST(CudaDevice, CountNeverThrowsAndIsStable) {
  const int first = cuda_device_count();
  EXPECT_GE(first, 0);
  EXPECT_EQ(cuda_device_count(), first);
  if (first == 0) {
    EXPECT_STRNE(cuda_unavailable_reason(), "");
  } else {
    // The probe must not leave an error for the next launch check. (Without a
    // driver the runtime's init failure is sticky: every call, cudaGetLastError
    // included, keeps reporting it, so there is nothing to check there.)
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

TEST(CudaDevice, RequireWithoutGpuThrowsUnsupportedNamingTheCaller) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  try {
    require_cuda_device(0, "allreduce(cuda:0)");
    FAIL() << "require_cuda_device did not throw";
  } catch (const Unsupported& e) {
    const std::string what = e.what();
    EXPECT_TRUE(contains(what, "allreduce(cuda:0)")) << what;
    EXPECT_TRUE(contains(what, "no CUDA device")) << what;
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
}

TEST(CudaDevice, RequireMissingIndexThrowsUnsupported) {
  SKIP_WITHOUT_CUDA_DEVICE();
  EXPECT_NO_THROW(require_cuda_device(0, "test"));
  const int count = cuda_device_count();
  try {
    require_cuda_device(count, "broadcast");
    FAIL() << "require_cuda_device did not throw";
  } catch (const Unsupported& e) {
    EXPECT_TRUE(contains(e.what(), "no CUDA device " + std::to_string(count))) << e.what();
  }
}

TEST(CudaDevice, RequireNegativeIndexIsInvalidArgument) {
  EXPECT_THROW(require_cuda_device(-1, "test"), InvalidArgument);
}

TEST(CudaDevice, GuardSelectsDeviceAndRestoresThePreviousOne) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int count = cuda_device_count();
  GRADCOMM_CUDA_CHECK(cudaSetDevice(0));
  {
    DeviceGuard guard(count - 1);
    EXPECT_EQ(cuda_current_device(), count - 1);
  }
  EXPECT_EQ(cuda_current_device(), 0);
  EXPECT_THROW(DeviceGuard{count}, CudaError);
  EXPECT_EQ(cuda_current_device(), 0);
  EXPECT_GT(cuda_sm_count(0), 0);
  EXPECT_EQ(cuda_sm_count(0), cuda_sm_count(0));
}

// ---- checks ----------------------------------------------------------------------------
TEST(CudaCheck, MessageNamesErrorExpressionAndLocation) {
  const std::string text = cuda_error_message(cudaErrorInvalidValue, "cudaMemcpy(a, b, n, k)", "x/y.cc", 42);
  EXPECT_TRUE(contains(text, "cudaErrorInvalidValue")) << text;
  EXPECT_TRUE(contains(text, "invalid argument")) << text;
  EXPECT_TRUE(contains(text, "`cudaMemcpy(a, b, n, k)`")) << text;
  EXPECT_TRUE(contains(text, "x/y.cc:42")) << text;
}

// cudaSetDevice(9999) fails everywhere: invalid ordinal with a GPU, no driver /
// no device without one. Either way the check throws CudaError with file:line.
TEST(CudaCheck, FailingCallThrowsCudaErrorWithFileAndLine) {
  int line = 0;
  try {
    line = __LINE__ + 1;
    GRADCOMM_CUDA_CHECK(cudaSetDevice(9999));
    FAIL() << "GRADCOMM_CUDA_CHECK did not throw";
  } catch (const CudaError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kCuda);
    EXPECT_TRUE(contains(what, "cudaSetDevice(9999)")) << what;
    EXPECT_TRUE(contains(what, "test_cuda_plumbing.cc:" + std::to_string(line))) << what;
    EXPECT_TRUE(contains(what, "cudaError")) << what;
  }
  // The handled failure is not reported again by the next launch check (with a
  // driver; without one the init failure is sticky by CUDA's design).
  if (cuda_device_count() > 0) EXPECT_NO_THROW(GRADCOMM_CUDA_CHECK_LAUNCH());
}

TEST(CudaCheck, LaunchCheckReportsAPendingError) {
  SKIP_WITHOUT_CUDA_DEVICE();
  void* p = nullptr;
  ASSERT_NE(cudaMalloc(&p, size_t{1} << 60), cudaSuccess);  // sets the thread's last error
  EXPECT_THROW(GRADCOMM_CUDA_CHECK_LAUNCH(), CudaError);
  EXPECT_NO_THROW(GRADCOMM_CUDA_CHECK_LAUNCH());  // cleared by the first report
}

TEST(CudaCheck, WarnVariantLogsInsteadOfThrowing) {
  EXPECT_NO_THROW(GRADCOMM_CUDA_WARN(cudaErrorInvalidValue));
}

// ---- buffers -----------------------------------------------------------------------------
TEST(DeviceBuffer, ZeroBytesAllocatesNothingAndNeedsNoDevice) {
  DeviceBuffer device(0);
  EXPECT_EQ(device.data(), nullptr);
  EXPECT_TRUE(device.empty());
  PinnedBuffer pinned(0);
  EXPECT_EQ(pinned.data(), nullptr);
  DeviceBuffer moved = std::move(device);
  EXPECT_EQ(moved.size(), 0u);
}

TEST(DeviceBuffer, AllocationWithoutGpuThrowsCudaError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  EXPECT_THROW(DeviceBuffer{1024}, CudaError);
  EXPECT_THROW(PinnedBuffer{1024}, CudaError);
}

TEST(DeviceBuffer, OwnsMemoryUntilDestroyedOrMoved) {
  SKIP_WITHOUT_CUDA_DEVICE();
  constexpr size_t kBytes = size_t{256} << 20;
  size_t free_before = 0, free_during = 0, free_after = 0, total = 0;
  GRADCOMM_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
  {
    DeviceBuffer a(kBytes);
    ASSERT_NE(a.data(), nullptr);
    EXPECT_EQ(a.size(), kBytes);
    EXPECT_EQ(a.nbytes(), static_cast<int64_t>(kBytes));
    GRADCOMM_CUDA_CHECK(cudaMemset(a.data(), 0x5A, kBytes));
    void* const raw = a.data();
    DeviceBuffer b = std::move(a);  // ownership moves; a is empty
    EXPECT_EQ(a.data(), nullptr);
    EXPECT_EQ(a.size(), 0u);
    EXPECT_EQ(b.data(), raw);
    DeviceBuffer c(1024);
    c = std::move(b);  // c's old 1 KiB is freed, b's memory now belongs to c
    EXPECT_EQ(c.data(), raw);
    uint8_t last = 0;
    GRADCOMM_CUDA_CHECK(cudaMemcpy(&last, c.as<uint8_t>() + kBytes - 1, 1, cudaMemcpyDeviceToHost));
    EXPECT_EQ(last, 0x5A);
    GRADCOMM_CUDA_CHECK(cudaMemGetInfo(&free_during, &total));
    EXPECT_LE(free_during + kBytes, free_before + (size_t{4} << 20));
  }
  GRADCOMM_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
  EXPECT_GE(free_after + (size_t{4} << 20), free_before);  // everything was returned
}

TEST(DeviceBuffer, ReserveGrowsButNeverShrinks) {
  SKIP_WITHOUT_CUDA_DEVICE();
  DeviceBuffer buffer;
  buffer.reserve(100);
  EXPECT_EQ(buffer.size(), 100u);
  void* const first = buffer.data();
  buffer.reserve(50);
  EXPECT_EQ(buffer.data(), first);
  EXPECT_EQ(buffer.size(), 100u);
  buffer.reserve(1 << 20);
  EXPECT_EQ(buffer.size(), size_t{1} << 20);
  buffer.reset();
  EXPECT_TRUE(buffer.empty());
}

TEST(DeviceBuffer, ImpossibleAllocationThrowsCudaErrorAndLeavesTheDeviceUsable) {
  SKIP_WITHOUT_CUDA_DEVICE();
  try {
    DeviceBuffer huge(size_t{1} << 60);
    FAIL() << "allocating 2^60 bytes succeeded";
  } catch (const CudaError& e) {
    EXPECT_TRUE(contains(e.what(), "cudaMalloc")) << e.what();
  }
  DeviceBuffer ok(4096);
  EXPECT_NE(ok.data(), nullptr);
  EXPECT_NO_THROW(GRADCOMM_CUDA_CHECK_LAUNCH());
}

TEST(PinnedBuffer, StagesAsyncCopiesThroughAStreamAndEvents) {
  SKIP_WITHOUT_CUDA_DEVICE();
  constexpr size_t kBytes = size_t{8} << 20;
  PinnedBuffer in(kBytes), out(kBytes);
  for (size_t i = 0; i < kBytes; ++i) in.as<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
  std::memset(out.data(), 0, kBytes);
  DeviceBuffer device(kBytes);
  Stream stream;
  Event start(cudaEventDefault), stop(cudaEventDefault);
  start.record(stream.get());
  GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(device.data(), in.data(), kBytes, cudaMemcpyHostToDevice, stream.get()));
  GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(out.data(), device.data(), kBytes, cudaMemcpyDeviceToHost, stream.get()));
  stop.record(stream.get());
  stop.synchronize();
  EXPECT_TRUE(stop.ready());
  EXPECT_GE(stop.elapsed_ms_since(start), 0.0f);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), kBytes), 0);

  // Cross-stream ordering through an event: `other` waits for `stream`'s work.
  Stream other;
  Event done;
  GRADCOMM_CUDA_CHECK(cudaMemsetAsync(device.data(), 0x11, kBytes, stream.get()));
  done.record(stream.get());
  done.wait_on(other.get());
  GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(out.data(), device.data(), kBytes, cudaMemcpyDeviceToHost, other.get()));
  other.synchronize();
  EXPECT_EQ(out.as<uint8_t>()[kBytes - 1], 0x11);

  Stream moved = std::move(stream);
  EXPECT_EQ(stream.get(), nullptr);
  EXPECT_NE(moved.get(), nullptr);
}

}  // namespace
}  // namespace gradcomm::detail
