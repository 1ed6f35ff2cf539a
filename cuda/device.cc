#include "cuda/device.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <string>

#include "cuda/check.h"
#include "gradcomm/errors.h"
#include "logging.h"

namespace gradcomm::detail {
namespace {

struct DeviceCount {
  int count = 0;
  std::string reason;  // empty when count > 0
};

const DeviceCount& device_count_once() noexcept {
  // Function-local static: initialized once, thread-safe. Without a driver the
  // runtime answers cudaErrorInsufficientDriver / cudaErrorNoDevice (and on some
  // systems cudaErrorStubLibrary, cudaErrorSystemDriverMismatch, ...): every
  // failure means "no usable device" here, so all of them give 0.
  static const DeviceCount cached = []() noexcept {
    DeviceCount result;
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count <= 0) {
      (void)cudaGetLastError();  // the failed query must not poison the next launch check
      try {
        if (status == cudaSuccess) {
          result.reason = "the CUDA runtime reports 0 devices";
        } else {
          result.reason = fmt::format("{} ({})", cudaGetErrorName(status), cudaGetErrorString(status));
        }
        log(LogLevel::kInfo, "no CUDA device: {}", result.reason);
      } catch (...) {
      }
      return result;
    }
    result.count = count;
    return result;
  }();
  return cached;
}

}  // namespace

int cuda_device_count() noexcept { return device_count_once().count; }

const char* cuda_unavailable_reason() noexcept { return device_count_once().reason.c_str(); }

void require_cuda_device(int index, const char* what) {
  const char* context = what ? what : "CUDA";
  if (index < 0) throw InvalidArgument(fmt::format("{}: CUDA device index {} is negative", context, index));
  const int count = cuda_device_count();
  if (count == 0) {
    throw Unsupported(fmt::format("{}: no CUDA device ({}); use CPU tensors on this machine", context,
                                  cuda_unavailable_reason()));
  }
  if (index >= count) {
    throw Unsupported(fmt::format("{}: no CUDA device {} (this machine has {} CUDA device{})", context, index,
                                  count, count == 1 ? "" : "s"));
  }
}

int cuda_current_device() {
  int device = 0;
  GRADCOMM_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

int cuda_sm_count(int device) {
  // Launchers size grids from this on every call; the attribute never changes.
  static constexpr int kCached = 64;
  static std::array<std::atomic<int>, kCached> cache{};  // 0 = not yet queried
  if (device >= 0 && device < kCached) {
    const int known = cache[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int sms = 0;
  GRADCOMM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (device >= 0 && device < kCached) cache[device].store(sms, std::memory_order_relaxed);
  return sms;
}

DeviceGuard::DeviceGuard(int index) {
  const int current = cuda_current_device();
  if (current != index) {
    GRADCOMM_CUDA_CHECK(cudaSetDevice(index));
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) GRADCOMM_CUDA_WARN(cudaSetDevice(previous_));
}

}  // namespace gradcomm::detail
