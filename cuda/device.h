// Which CUDA devices exist, and a guard that makes one of them current.
// Host-only; safe to call on machines without a GPU or without a driver.
#pragma once

namespace gradcomm::detail {

// Number of usable CUDA devices; 0 (never an exception) when there is no GPU,
// no driver, or the driver is too old for this runtime. Queried once per
// process (the set of visible devices cannot change after the runtime starts).
int cuda_device_count() noexcept;

// Why cuda_device_count() is 0 ("cudaErrorNoDevice (no CUDA-capable device is
// detected)"), or "" when devices exist.
const char* cuda_unavailable_reason() noexcept;

// Throws Unsupported when CUDA device `index` does not exist on this machine:
// "<what>: no CUDA device (...reason...)" or "<what>: no CUDA device 3 (this
// machine has 2)". `what` names the caller's operation, e.g. "allreduce(cuda:0)".
// A negative index is InvalidArgument.
void require_cuda_device(int index, const char* what);

// Makes `index` the calling thread's current device for the guard's lifetime and
// restores the previous one afterwards. Does nothing (no CUDA call) when `index`
// is already current. The constructor throws CudaError; the destructor only logs.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to restore
};

// Device the calling thread currently uses (cudaGetDevice); throws CudaError.
int cuda_current_device();

// Streaming multiprocessors on `device`, cached per device; throws CudaError.
int cuda_sm_count(int device);

}  // namespace gradcomm::detail
