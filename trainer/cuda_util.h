// The CUDA backend's small runtime helpers: error checks that throw the public
// gradcomm::CudaError, and owners of device memory, pinned host memory and a stream.
// The trainer is a program written against gradcomm's public API, as a user's is:
// it keeps its own, rather than the library's internal ones. Host-only (needs
// cuda_runtime_api.h), so both cuda_backend.cc and kernels.cu include it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace gradcomm::train::cuda {

// Throws gradcomm::CudaError: "cudaErrorX (text) in `expression` at file:line"
// (cuda_backend.cc; kept out of this header so kernels.cu needs no fmt).
[[noreturn]] void throw_cuda(cudaError_t status, const char* expression, const char* file, int line);

}  // namespace gradcomm::train::cuda

#define TRAIN_CUDA_CHECK(expr)                                                                          \
  do {                                                                                                  \
    const cudaError_t train_cuda_status_ = (expr);                                                      \
    if (train_cuda_status_ != cudaSuccess) {                                                            \
      ::gradcomm::train::cuda::throw_cuda(train_cuda_status_, #expr, __FILE__, __LINE__);               \
    }                                                                                                   \
  } while (0)

// After a kernel launch: a bad configuration (or an earlier asynchronous fault).
#define TRAIN_CUDA_CHECK_LAUNCH() TRAIN_CUDA_CHECK(cudaGetLastError())

namespace gradcomm::train::cuda {

// `bytes` of device memory (Pinned = false) or page-locked host memory (Pinned =
// true), owned; empty when default-constructed.
template <bool Pinned>
class Memory {
 public:
  Memory() = default;
  explicit Memory(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    if constexpr (Pinned) {
      TRAIN_CUDA_CHECK(cudaMallocHost(&data_, bytes));
    } else {
      TRAIN_CUDA_CHECK(cudaMalloc(&data_, bytes));
    }
  }
  ~Memory() { release(); }
  Memory(Memory&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  Memory& operator=(Memory&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void release() noexcept {
    if (data_ == nullptr) return;
    // Errors here are earlier asynchronous faults, reported where they happened.
    if constexpr (Pinned) {
      (void)cudaFreeHost(data_);
    } else {
      (void)cudaFree(data_);
    }
    data_ = nullptr;
  }

  void* data_ = nullptr;
  size_t bytes_ = 0;
};
using DeviceMemory = Memory<false>;
using PinnedMemory = Memory<true>;

// An owned non-blocking stream (it does not serialize with the legacy default stream).
class Stream {
 public:
  Stream() { TRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { (void)cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const { TRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

// `later` waits (on the device, the host goes on) for the work enqueued on `earlier`
// so far; one owned event, re-recorded each time.
class StreamOrder {
 public:
  StreamOrder() { TRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~StreamOrder() { (void)cudaEventDestroy(event_); }
  StreamOrder(const StreamOrder&) = delete;
  StreamOrder& operator=(const StreamOrder&) = delete;
  void after(const Stream& earlier, const Stream& later) {
    TRAIN_CUDA_CHECK(cudaEventRecord(event_, earlier.get()));
    TRAIN_CUDA_CHECK(cudaStreamWaitEvent(later.get(), event_, 0));
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// Makes `device` current for the owner's lifetime, then restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    TRAIN_CUDA_CHECK(cudaGetDevice(&previous_));
    TRAIN_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { (void)cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace gradcomm::train::cuda
