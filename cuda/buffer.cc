#include "cuda/buffer.h"

#include <utility>

#include "cuda/check.h"

namespace gradcomm::detail {

// ---- DeviceBuffer -------------------------------------------------------------
DeviceBuffer::DeviceBuffer(size_t bytes) {
  if (bytes == 0) return;
  GRADCOMM_CUDA_CHECK(cudaMalloc(&data_, bytes));
  size_ = bytes;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (data_ != nullptr) GRADCOMM_CUDA_WARN(cudaFree(data_));
  data_ = nullptr;
  size_ = 0;
}

void DeviceBuffer::reserve(size_t bytes) {
  if (bytes <= size_) return;
  reset();  // free first: peak memory stays at the larger size, not the sum
  *this = DeviceBuffer(bytes);
}

// ---- PinnedBuffer -------------------------------------------------------------
PinnedBuffer::PinnedBuffer(size_t bytes) {
  if (bytes == 0) return;
  GRADCOMM_CUDA_CHECK(cudaMallocHost(&data_, bytes));
  size_ = bytes;
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void PinnedBuffer::reset() noexcept {
  if (data_ != nullptr) GRADCOMM_CUDA_WARN(cudaFreeHost(data_));
  data_ = nullptr;
  size_ = 0;
}

void PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= size_) return;
  reset();
  *this = PinnedBuffer(bytes);
}

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
