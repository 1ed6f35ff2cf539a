// Closed-form test values shared by the thread tests and the multi-process worker:
// rank r contributes v(r, i) = (3r + i) mod 13 - 6, small integers whose sums over
// up to 8 ranks are exact in every dtype, and the expected bytes of each result.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gradcomm/types.h"
#include "half.h"

namespace gradcomm::testing {

inline double contribution(int rank, int64_t i) { return static_cast<double>((3 * rank + i) % 13) - 6.0; }

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

// The expected bytes of allreduce(op) over n ranks where rank r contributes
// value(r, i), computed independently of any collective.
template <class Value>
std::vector<uint8_t> expected_allreduce(DType dtype, ReduceOp op, int n, int64_t numel, Value value) {
  std::vector<uint8_t> out(numel * dtype_size(dtype));
  for (int64_t i = 0; i < numel; ++i) {
    double sum = 0, lo = value(0, i), hi = lo;
    for (int r = 0; r < n; ++r) {
      const double v = value(r, i);
      sum += v;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    switch (op) {
      case ReduceOp::kSum: store_value(dtype, out.data(), i, sum); break;
      case ReduceOp::kAvg: store_average(dtype, out.data(), i, sum, n); break;
      case ReduceOp::kMin: store_value(dtype, out.data(), i, lo); break;
      case ReduceOp::kMax: store_value(dtype, out.data(), i, hi); break;
    }
  }
  return out;
}

}  // namespace gradcomm::testing
