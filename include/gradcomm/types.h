// Element types, devices and the non-owning tensor view every collective takes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace gradcomm {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16, kFloat64, kInt32, kInt64, kUInt8 };

// Bytes per element; 0 for a value outside the enum. (Inline: every call's hot path asks.)
constexpr size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kFloat64: return 8;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
  }
  return 0;
}
// "float32", "float16", ...; "dtype(N)" text is never returned: unknown values give "unknown".
const char* dtype_name(DType dtype) noexcept;
// True when `value` is one of the enumerators (used to validate bytes that claim to be a DType).
bool dtype_valid(uint8_t value) noexcept;

enum class DeviceType : uint8_t { kCpu, kCuda };
struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
};

// 16-bit storage types for TensorView::of. Arithmetic on them goes through fp32
// (see base/half.h); they only name the bit layout.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

namespace detail {
template <class T>
constexpr DType dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return DType::kFloat32;
  else if constexpr (std::is_same_v<U, Half>) return DType::kFloat16;
  else if constexpr (std::is_same_v<U, BFloat16>) return DType::kBFloat16;
  else if constexpr (std::is_same_v<U, double>) return DType::kFloat64;
  else if constexpr (std::is_same_v<U, int32_t>) return DType::kInt32;
  else if constexpr (std::is_same_v<U, int64_t>) return DType::kInt64;
  else if constexpr (std::is_same_v<U, uint8_t>) return DType::kUInt8;
  else static_assert(sizeof(U) == 0, "TensorView::of: unsupported element type");
}
}  // namespace detail

// Non-owning view of `numel` contiguous elements. 64-bit sizes everywhere.
struct TensorView {
  void* data = nullptr;
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  Device device{};

  template <class T>
  static TensorView of(T* data, int64_t numel, Device device = {}) {
    return TensorView{const_cast<std::remove_cv_t<T>*>(data), numel, detail::dtype_of<T>(), device};
  }
  int64_t nbytes() const noexcept { return numel * static_cast<int64_t>(dtype_size(dtype)); }
};

enum class ReduceOp : uint8_t { kSum, kAvg, kMin, kMax };  // kMin/kMax: dense only
const char* reduce_op_name(ReduceOp op) noexcept;

}  // namespace gradcomm
