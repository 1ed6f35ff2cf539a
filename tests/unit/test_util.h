// Helpers for thread-based tests: N ranks as N threads over the in-process
// transport, each with its own Communicator.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "comm_impl.h"
#include "gradcomm/gradcomm.h"
#include "half.h"
#include "transport/inproc/inproc_transport.h"

namespace gradcomm::testing {

// Runs fn(comm) on n threads; returns each rank's exception (null when it returned).
inline std::vector<std::exception_ptr> run_ranks_collect(int n, const std::function<void(Communicator&)>& fn,
                                                         std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto transports = detail::create_inproc_transports(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        Communicator comm(std::make_unique<detail::CommunicatorImpl>(std::move(transports[r]), timeout));
        fn(comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Runs fn(comm) on n threads and rethrows the first rank's failure.
inline void run_ranks(int n, const std::function<void(Communicator&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  for (auto& e : run_ranks_collect(n, fn, timeout)) {
    if (e) std::rethrow_exception(e);
  }
}

// Stores a small integer-valued double as `dtype` at element i (exact for the
// values the tests use), and reads it back.
inline void store_value(DType dtype, void* base, int64_t i, double v) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::kFloat64: static_cast<double*>(base)[i] = v; break;
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = detail::float_to_half(static_cast<float>(v)); break;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = detail::float_to_bf16(static_cast<float>(v)); break;
    case DType::kInt32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case DType::kInt64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    case DType::kUInt8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); break;
  }
}

// What the library must produce for avg: the exact sum divided once, in the
// type's arithmetic (fp32 for the 16-bit floats), then stored.
inline void store_average(DType dtype, void* base, int64_t i, double sum, int n) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(base)[i] = static_cast<float>(sum) / static_cast<float>(n); break;
    case DType::kFloat64: static_cast<double*>(base)[i] = sum / n; break;
    case DType::kFloat16:
      static_cast<uint16_t*>(base)[i] = detail::float_to_half(static_cast<float>(sum) / static_cast<float>(n));
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[i] = detail::float_to_bf16(static_cast<float>(sum) / static_cast<float>(n));
      break;
    case DType::kInt32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(static_cast<int64_t>(sum) / n); break;
    case DType::kInt64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(sum) / n; break;
    case DType::kUInt8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(static_cast<int64_t>(sum) / n); break;
  }
}

// A buffer with guard bytes on both sides, to catch writes outside the tensor.
class GuardedBuffer {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kPattern = 0xA5;
  explicit GuardedBuffer(size_t bytes) : bytes_(bytes), storage_(bytes + 2 * kGuard, kPattern) {}
  void* data() { return storage_.data() + kGuard; }
  const uint8_t* bytes() const { return storage_.data() + kGuard; }
  size_t size() const { return bytes_; }
  bool guards_intact() const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (storage_[i] != kPattern || storage_[kGuard + bytes_ + i] != kPattern) return false;
    }
    return true;
  }

 private:
  size_t bytes_;
  std::vector<uint8_t> storage_;
};

}  // namespace gradcomm::testing
