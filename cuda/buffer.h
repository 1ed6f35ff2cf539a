// RAII owners for CUDA memory, streams and events. Host-only; usable from .cc
// files. Constructors throw CudaError; destructors never throw (they log).
//
// Ownership: each object owns exactly one allocation or handle and is move-only;
// a moved-from object is empty and its destructor does nothing. Sizes are bytes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace gradcomm::detail {

enum class MemoryKind : uint8_t {
  kDevice,  // cudaMalloc on the current device
  kPinned,  // cudaMallocHost: page-locked host memory, the staging area for async
            // copies (cudaMemcpyAsync from pageable memory is synchronous)
};

// One CUDA allocation of `Kind`. Zero bytes allocates nothing (data() is null, no
// CUDA call), so empty tensors need no special case. Freeing synchronizes the
// device implicitly: keep buffers for the hot path alive across calls (reserve()).
template <MemoryKind Kind>
class CudaMemory {
 public:
  CudaMemory() noexcept = default;
  explicit CudaMemory(size_t bytes);
  ~CudaMemory() { reset(); }
  CudaMemory(CudaMemory&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  CudaMemory& operator=(CudaMemory&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;

  void* data() const noexcept { return data_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  size_t size() const noexcept { return size_; }
  int64_t nbytes() const noexcept { return static_cast<int64_t>(size_); }
  bool empty() const noexcept { return size_ == 0; }

  // Frees the memory (if any); the buffer becomes empty.
  void reset() noexcept;
  // Grow-only workspace: reallocates when smaller than `bytes` (old contents are
  // discarded), otherwise does nothing. size() is then at least `bytes`.
  void reserve(size_t bytes) {
    if (bytes <= size_) return;
    reset();  // free first: peak memory stays at the larger size, not the sum
    *this = CudaMemory(bytes);
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

using DeviceBuffer = CudaMemory<MemoryKind::kDevice>;
using PinnedBuffer = CudaMemory<MemoryKind::kPinned>;
extern template class CudaMemory<MemoryKind::kDevice>;
extern template class CudaMemory<MemoryKind::kPinned>;

// An owned stream (cudaStreamNonBlocking by default: it does not serialize with
// the legacy default stream). The destructor does not wait for queued work;
// cudaStreamDestroy lets it finish and then releases the stream.
class Stream {
 public:
  explicit Stream(unsigned int flags = cudaStreamNonBlocking);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const noexcept { return stream_; }
  void synchronize() const;  // throws CudaError, including for earlier async faults

 private:
  cudaStream_t stream_ = nullptr;
};

// An owned event. Timing is off by default (cheaper record/wait); pass
// cudaEventDefault to use elapsed_ms.
class Event {
 public:
  explicit Event(unsigned int flags = cudaEventDisableTiming);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const noexcept { return event_; }
  void record(cudaStream_t stream);
  // Makes `stream` wait for this event (device-side; the host does not block).
  void wait_on(cudaStream_t stream) const;
  void synchronize() const;
  bool ready() const;  // cudaEventQuery: true when complete, false when pending
  // Milliseconds from `start` to this event; both must be recorded and complete.
  float elapsed_ms_since(const Event& start) const;

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace gradcomm::detail
