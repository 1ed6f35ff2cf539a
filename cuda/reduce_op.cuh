// Element-wise arithmetic of the reduce contract, shared by the CUDA kernels
// (cuda/reduce.cu) and CPU code (the reference in tests, and base/reduce.cc if it
// includes this), so both produce the same bits. It mirrors base/reduce.h; a change
// to the contract changes both. Compiles with the host compiler too: it needs no
// CUDA header (the __host__ __device__ markers come from half.h's GRADCOMM_HD).
//
// Per element, with a = dst[i] and b = src[i]:
//   1. widen   fp16/bf16 -> fp32 (base/half.h); other types stay as they are.
//   2. combine kSum/kAvg add; integers wrap (two's complement, no UB).
//              kMin/kMax: NaN propagates (either input NaN gives NaN); otherwise
//              the smaller/larger, and on a tie (including -0 vs +0) a, the dst
//              value, is kept.
//   3. divide  only when divisor > 1 (avg's final hop, divide_inplace): in fp32
//              for fp16/bf16, in the type's own arithmetic otherwise (float /
//              float(d), double / double(d)); integers truncate toward zero.
//   4. NaN     a floating result that is NaN is stored as the canonical quiet NaN
//              (fp32 0x7FC00000, fp64 0x7FF8000000000000, fp16 0x7E00, bf16
//              0x7FC0). IEEE leaves NaN payloads unspecified and x86 and NVIDIA
//              GPUs pick differently; canonical NaNs keep CPU and GPU ranks bitwise
//              equal.
//   5. narrow  fp32 -> fp16/bf16, round to nearest even, once.
// Each step is one IEEE-rounded operation, so CPU and GPU agree bit for bit as
// long as neither is built with fast-math (no FTZ, IEEE division).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "gradcomm/errors.h"
#include "gradcomm/types.h"
#include "half.h"

namespace gradcomm::detail {

// What happens to each pair before the optional divide. kKeep ignores src
// (divide_inplace is kKeep with a divisor).
enum class ElementOp : uint8_t { kAdd, kMin, kMax, kKeep };

GRADCOMM_HD double bits_double(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
#endif
}

// ---- per-type arithmetic ---------------------------------------------------------
// Compute: the type the combine and divide happen in. widen/narrow convert from
// and to the storage type T.
template <class T>
struct ElementTraits;

struct Fp32Arithmetic {
  using Compute = float;
  static constexpr bool kFloating = true;
  GRADCOMM_HD static float add(float a, float b) { return a + b; }
  GRADCOMM_HD static float divide(float a, int64_t d) { return a / static_cast<float>(d); }
  GRADCOMM_HD static float canonical_nan() { return bits_float(0x7FC00000u); }
};

template <>
struct ElementTraits<float> : Fp32Arithmetic {
  GRADCOMM_HD static float widen(float v) { return v; }
  GRADCOMM_HD static float narrow(float v) { return v; }
};

template <>
struct ElementTraits<Half> : Fp32Arithmetic {
  GRADCOMM_HD static float widen(Half v) { return half_to_float(v.bits); }
  GRADCOMM_HD static Half narrow(float v) { return Half{float_to_half(v)}; }
};

template <>
struct ElementTraits<BFloat16> : Fp32Arithmetic {
  GRADCOMM_HD static float widen(BFloat16 v) { return bf16_to_float(v.bits); }
  GRADCOMM_HD static BFloat16 narrow(float v) { return BFloat16{float_to_bf16(v)}; }
};

template <>
struct ElementTraits<double> {
  using Compute = double;
  static constexpr bool kFloating = true;
  GRADCOMM_HD static double widen(double v) { return v; }
  GRADCOMM_HD static double narrow(double v) { return v; }
  GRADCOMM_HD static double add(double a, double b) { return a + b; }
  GRADCOMM_HD static double divide(double a, int64_t d) { return a / static_cast<double>(d); }
  GRADCOMM_HD static double canonical_nan() { return bits_double(0x7FF8000000000000ull); }
};

template <class T>
struct IntegerArithmetic {
  using Compute = T;
  static constexpr bool kFloating = false;
  GRADCOMM_HD static T widen(T v) { return v; }
  GRADCOMM_HD static T narrow(T v) { return v; }
  // Unsigned addition wraps by definition; converting back is modular (C++20).
  GRADCOMM_HD static T add(T a, T b) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  }
  // In int64 so a divisor past the type's range still truncates correctly; the
  // quotient's magnitude is at most |a|, so it fits T. d > 1: no INT64_MIN / -1.
  GRADCOMM_HD static T divide(T a, int64_t d) { return static_cast<T>(static_cast<int64_t>(a) / d); }
  GRADCOMM_HD static T canonical_nan() { return T{}; }
};

template <>
struct ElementTraits<int32_t> : IntegerArithmetic<int32_t> {};
template <>
struct ElementTraits<int64_t> : IntegerArithmetic<int64_t> {};
template <>
struct ElementTraits<uint8_t> : IntegerArithmetic<uint8_t> {};

// ---- the per-element functor -----------------------------------------------------
// result = narrow(canonical(divide?(combine(widen(dst), widen(src))))), see the
// header comment. `divisor` <= 1 means no divide.
template <class T, ElementOp Op>
struct ReduceElement {
  using Traits = ElementTraits<T>;
  using Compute = typename Traits::Compute;

  int64_t divisor = 1;

  GRADCOMM_HD T operator()(T dst, T src) const {
    const Compute a = Traits::widen(dst);
    Compute r;
    if constexpr (Op == ElementOp::kAdd) {
      r = Traits::add(a, Traits::widen(src));
    } else if constexpr (Op == ElementOp::kMin) {
      const Compute b = Traits::widen(src);
      r = (b < a) ? b : a;
      if constexpr (Traits::kFloating) {
        if (a != a || b != b) r = Traits::canonical_nan();
      }
    } else if constexpr (Op == ElementOp::kMax) {
      const Compute b = Traits::widen(src);
      r = (a < b) ? b : a;
      if constexpr (Traits::kFloating) {
        if (a != a || b != b) r = Traits::canonical_nan();
      }
    } else {
      r = a;
    }
    if (divisor > 1) r = Traits::divide(r, divisor);
    if constexpr (Traits::kFloating) {
      if (r != r) r = Traits::canonical_nan();
    }
    return Traits::narrow(r);
  }
};

// ---- host-side dispatch ----------------------------------------------------------
// A type as a value (std::type_identity is C++20; nvcc may compile .cu as C++17).
template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the storage type of `dtype`; every branch
// must return the same type. Throws InvalidArgument for a value outside the enum.
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(TypeTag<float>{});
    case DType::kFloat16: return f(TypeTag<Half>{});
    case DType::kBFloat16: return f(TypeTag<BFloat16>{});
    case DType::kFloat64: return f(TypeTag<double>{});
    case DType::kInt32: return f(TypeTag<int32_t>{});
    case DType::kInt64: return f(TypeTag<int64_t>{});
    case DType::kUInt8: return f(TypeTag<uint8_t>{});
  }
  throw InvalidArgument("reduce: unknown dtype value " + std::to_string(static_cast<int>(dtype)));
}

// kSum and kAvg both add (avg's division is the separate final divisor).
inline ElementOp element_op_for(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return ElementOp::kAdd;
    case ReduceOp::kMin: return ElementOp::kMin;
    case ReduceOp::kMax: return ElementOp::kMax;
  }
  throw InvalidArgument("reduce: unknown reduce op value " + std::to_string(static_cast<int>(op)));
}

// Calls f(std::integral_constant<ElementOp, Op>{}) for the runtime `op`.
template <class F>
decltype(auto) visit_element_op(ElementOp op, F&& f) {
  switch (op) {
    case ElementOp::kAdd: return f(std::integral_constant<ElementOp, ElementOp::kAdd>{});
    case ElementOp::kMin: return f(std::integral_constant<ElementOp, ElementOp::kMin>{});
    case ElementOp::kMax: return f(std::integral_constant<ElementOp, ElementOp::kMax>{});
    case ElementOp::kKeep: return f(std::integral_constant<ElementOp, ElementOp::kKeep>{});
  }
  throw InvalidArgument("reduce: unknown element op");
}

// Host loop over the functor: the CPU reference of the contract, no validation
// (callers check n >= 0, pointers, divisor >= 1). For kKeep pass src == dst.
template <class T, ElementOp Op>
void reduce_elements_host(T* dst, const T* src, int64_t n, int64_t divisor) {
  const ReduceElement<T, Op> f{divisor};
  for (int64_t i = 0; i < n; ++i) dst[i] = f(dst[i], src[i]);
}

}  // namespace gradcomm::detail
