#include "cuda/buffer.h"

#include <utility>

#include "cuda/check.h"

namespace gradcomm::detail {

// ---- CudaMemory -------------------------------------------------------------
template <MemoryKind Kind>
CudaMemory<Kind>::CudaMemory(size_t bytes) {
  if (bytes == 0) return;
  if constexpr (Kind == MemoryKind::kDevice) {
    GRADCOMM_CUDA_CHECK(cudaMalloc(&data_, bytes));
  } else {
    GRADCOMM_CUDA_CHECK(cudaMallocHost(&data_, bytes));
  }
  size_ = bytes;
}

template <MemoryKind Kind>
void CudaMemory<Kind>::reset() noexcept {
  if (data_ != nullptr) {
    if constexpr (Kind == MemoryKind::kDevice) {
      GRADCOMM_CUDA_WARN(cudaFree(data_));
    } else {
      GRADCOMM_CUDA_WARN(cudaFreeHost(data_));
    }
  }
  data_ = nullptr;
  size_ = 0;
}

template class CudaMemory<MemoryKind::kDevice>;
template class CudaMemory<MemoryKind::kPinned>;

// ---- Stream ---------------------------------------------------------------------
Stream::Stream(unsigned int flags) { GRADCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, flags)); }

Stream::~Stream() {
  if (stream_ != nullptr) GRADCOMM_CUDA_WARN(cudaStreamDestroy(stream_));
}

Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) GRADCOMM_CUDA_WARN(cudaStreamDestroy(stream_));
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void Stream::synchronize() const { GRADCOMM_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

// ---- Event ----------------------------------------------------------------------
Event::Event(unsigned int flags) { GRADCOMM_CUDA_CHECK(cudaEventCreateWithFlags(&event_, flags)); }

Event::~Event() {
  if (event_ != nullptr) GRADCOMM_CUDA_WARN(cudaEventDestroy(event_));
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) GRADCOMM_CUDA_WARN(cudaEventDestroy(event_));
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::record(cudaStream_t stream) { GRADCOMM_CUDA_CHECK(cudaEventRecord(event_, stream)); }

void Event::wait_on(cudaStream_t stream) const { GRADCOMM_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }

void Event::synchronize() const { GRADCOMM_CUDA_CHECK(cudaEventSynchronize(event_)); }

bool Event::ready() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;  // an answer, not a failure (not recorded as last error)
  GRADCOMM_CUDA_CHECK(status);
  return true;
}

float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0.0f;
  GRADCOMM_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

}  // namespace gradcomm::detail
