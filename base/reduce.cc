#include "reduce.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "gradcomm/errors.h"
#include "half.h"

namespace gradcomm::detail {
namespace {

// min/max propagate NaN (either side NaN gives NaN), matching cuda/reduce_op.cuh;
// std::min/max would silently drop a NaN on one side.
template <class T>
T combine_min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return a + b;
  }
  return b < a ? b : a;
}
template <class T>
T combine_max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return a + b;
  }
  return a < b ? b : a;
}

// Integer sums wrap (two's complement) instead of overflowing into UB.
template <class T>
T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

// Integers divide in int64 so a divisor past the type's range (uint8, N > 255) stays exact.
template <class T>
T divide(T a, int64_t divisor) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<int64_t>(a) / divisor);
  } else {
    return a / static_cast<T>(divisor);
  }
}

// A power-of-two divisor d of a floating type: x * (1/d) is x / d bit for bit (1/d is
// exact, and both round the same real number once), and a multiply costs a fraction
// of a division per lane. The average over 2, 4, 8... ranks takes this path.
template <class T>
bool exact_reciprocal(int64_t divisor, T& inverse) {
  if constexpr (std::is_floating_point_v<T>) {
    if (divisor > 1 && std::has_single_bit(static_cast<uint64_t>(divisor))) {
      inverse = T(1) / static_cast<T>(divisor);
      return true;
    }
  }
  return false;
}

// Plain types: the loops are simple enough for the compiler to vectorize. dst may be a
// (the in-place form), never b.
template <class T>
void reduce_plain(T* dst, const T* a, const T* __restrict b, int64_t n, ReduceOp op, int64_t divisor) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      if (T inverse; exact_reciprocal(divisor, inverse)) {
        for (int64_t i = 0; i < n; ++i) dst[i] = add(a[i], b[i]) * inverse;
      } else if (divisor > 1) {
        for (int64_t i = 0; i < n; ++i) dst[i] = divide(add(a[i], b[i]), divisor);
      } else {
        for (int64_t i = 0; i < n; ++i) dst[i] = add(a[i], b[i]);
      }
      return;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < n; ++i) dst[i] = combine_min(a[i], b[i]);
      return;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < n; ++i) dst[i] = combine_max(a[i], b[i]);
      return;
  }
}

// 16-bit floats: widen to fp32, combine, round once.
template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void reduce_half(uint16_t* dst, const uint16_t* a, const uint16_t* __restrict b, int64_t n, ReduceOp op,
                 int64_t divisor) {
  const float d = static_cast<float>(divisor);
  for (int64_t i = 0; i < n; ++i) {
    const float x = Widen(a[i]);
    const float y = Widen(b[i]);
    float r;
    switch (op) {
      case ReduceOp::kMin: r = combine_min(x, y); break;
      case ReduceOp::kMax: r = combine_max(x, y); break;
      default: r = divisor > 1 ? (x + y) / d : x + y; break;
    }
    dst[i] = Narrow(r);
  }
}

template <class T>
void divide_plain(T* data, int64_t n, int64_t divisor) {
  if (T inverse; exact_reciprocal(divisor, inverse)) {
    for (int64_t i = 0; i < n; ++i) data[i] *= inverse;
    return;
  }
  for (int64_t i = 0; i < n; ++i) data[i] = divide(data[i], divisor);
}

template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void divide_half(uint16_t* data, int64_t n, int64_t divisor) {
  const float d = static_cast<float>(divisor);
  for (int64_t i = 0; i < n; ++i) data[i] = Narrow(Widen(data[i]) / d);
}

}  // namespace

bool exact_reciprocal_f32(int64_t divisor, float& inverse) { return exact_reciprocal(divisor, inverse); }

void reduce_into(void* dst, const void* a, const void* b, int64_t n, DType dtype, ReduceOp op,
                 int64_t final_divisor) {
  switch (dtype) {
    case DType::kFloat32:
      return reduce_plain(static_cast<float*>(dst), static_cast<const float*>(a), static_cast<const float*>(b), n, op,
                          final_divisor);
    case DType::kFloat64:
      return reduce_plain(static_cast<double*>(dst), static_cast<const double*>(a), static_cast<const double*>(b), n,
                          op, final_divisor);
    case DType::kInt32:
      return reduce_plain(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a),
                          static_cast<const int32_t*>(b), n, op, final_divisor);
    case DType::kInt64:
      return reduce_plain(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                          static_cast<const int64_t*>(b), n, op, final_divisor);
    case DType::kUInt8:
      return reduce_plain(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a),
                          static_cast<const uint8_t*>(b), n, op, final_divisor);
    case DType::kFloat16:
      return reduce_half<half_to_float, float_to_half>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                                                       static_cast<const uint16_t*>(b), n, op, final_divisor);
    case DType::kBFloat16:
      return reduce_half<bf16_to_float, float_to_bf16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                                                       static_cast<const uint16_t*>(b), n, op, final_divisor);
  }
  throw InvalidArgument("reduce: unknown dtype");
}

void reduce_inplace(void* dst, const void* src, int64_t n, DType dtype, ReduceOp op, int64_t final_divisor) {
  reduce_into(dst, dst, src, n, dtype, op, final_divisor);
}

void divide_inplace(void* data, int64_t n, DType dtype, int64_t divisor) {
  if (divisor <= 1) return;
  switch (dtype) {
    case DType::kFloat32: return divide_plain(static_cast<float*>(data), n, divisor);
    case DType::kFloat64: return divide_plain(static_cast<double*>(data), n, divisor);
    case DType::kInt32: return divide_plain(static_cast<int32_t*>(data), n, divisor);
    case DType::kInt64: return divide_plain(static_cast<int64_t*>(data), n, divisor);
    case DType::kUInt8: return divide_plain(static_cast<uint8_t*>(data), n, divisor);
    case DType::kFloat16:
      return divide_half<half_to_float, float_to_half>(static_cast<uint16_t*>(data), n, divisor);
    case DType::kBFloat16:
      return divide_half<bf16_to_float, float_to_bf16>(static_cast<uint16_t*>(data), n, divisor);
  }
  throw InvalidArgument("divide: unknown dtype");
}

void accumulate_loss(float* __restrict residual, const float* __restrict value, const float* __restrict kept,
                     int64_t n) {
  for (int64_t i = 0; i < n; ++i) residual[i] += value[i] - kept[i];
}

}  // namespace gradcomm::detail
