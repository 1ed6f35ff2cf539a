// quant:bits=b,bucket=B,round=... on the GPU: its payload layout and its policy for
// the shared dense kernels (../dense/gpu_dense_logic.h says what a policy provides), as
// GRADCOMM_HD code over the formulas of dense_math.h, so the CPU unit test
// (tests/unit/test_gpu_dense_logic.cc) runs exactly what the kernels run. Host and
// device code; needs no CUDA. The kernels: gpu_quant_codec.cu.
#pragma once

#include <climits>
#include <cstdint>

#include "compressors/dense/gpu_dense_logic.h"
#include "compressors/dense/dense_math.h"
#include "compressors/compressor_id.h"

namespace gradcomm::detail {

// The header carries param0 = bits, param1 = the bucket; the scales are (lo, hi), 8
// bytes a bucket; codes are b bits. No validation here: the caller has run the spec
// through the family's make_codec checks.
inline DenseLayout quant_layout(int bits, int64_t bucket, uint64_t n) {
  return DenseLayout{CompressorId::kQuant,          n, static_cast<uint32_t>(bits), static_cast<uint32_t>(bucket),
                     static_cast<uint64_t>(bucket), 8, static_cast<unsigned>(bits)};
}

// quant: order-key min and max plus a non-finite flag (order-free, so lanes combine in any order).
struct QuantAcc {
  int32_t lo, hi;
  uint32_t bad;
};
struct QuantPolicy {
  static constexpr bool kBucketed = true;
  uint32_t levels;  // 2^bits - 1
  unsigned bits;
  bool stochastic;

  using Acc = QuantAcc;
  struct Params {
    float lo, inv, step;
  };
  GRADCOMM_HD Acc identity() const { return {INT32_MAX, INT32_MIN, 0u}; }
  GRADCOMM_HD Acc accumulate(Acc a, float x) const {
    const int32_t key = float_order_key(x);
    a.lo = key < a.lo ? key : a.lo;
    a.hi = key > a.hi ? key : a.hi;
    a.bad |= (float_bits(x) & 0x7FFFFFFFu) >= 0x7F800000u ? 1u : 0u;
    return a;
  }
  GRADCOMM_HD Acc combine(Acc a, Acc b) const {
    return {b.lo < a.lo ? b.lo : a.lo, b.hi > a.hi ? b.hi : a.hi, a.bad | b.bad};
  }
  // quant_codec.cc: a bucket with a non-finite element or range stores (NaN, NaN).
  GRADCOMM_HD void finalize(Acc a, uint64_t, uint8_t* scale) const {
    float lo = order_key_float(a.lo), hi = order_key_float(a.hi);
    if (a.bad != 0 || !is_finite(add_rn(hi, -lo))) lo = hi = bits_float(kCanonicalNanBits);
    store_f32le(scale, lo);
    store_f32le(scale + 4, hi);
  }
  GRADCOMM_HD Params encode_params(const uint8_t* scale) const {
    const float lo = load_f32le(scale), hi = load_f32le(scale + 4);
    return {lo, quant_inverse_step(lo, hi, levels), quant_step(lo, hi, levels)};
  }
  GRADCOMM_HD Params decode_params(const uint8_t* scale) const {
    const float lo = load_f32le(scale), hi = load_f32le(scale + 4);
    return {lo, 0.0f, quant_step(lo, hi, levels)};
  }
  GRADCOMM_HD uint32_t code(float x, const Params& p, float u) const {
    const float s = quant_position(x, p.lo, p.inv, static_cast<float>(levels));
    return stochastic ? round_stochastic(s, u) : round_half_up(s);
  }
  GRADCOMM_HD float value(uint32_t code, const Params& p) const { return quant_value(p.lo, p.step, code); }
  // (NaN, NaN), or finite lo <= hi with a finite range.
  GRADCOMM_HD bool scale_valid(const uint8_t* scale) const {
    const float lo = load_f32le(scale), hi = load_f32le(scale + 4);
    const bool poisoned = is_nan(lo) && is_nan(hi);
    const bool valid = is_finite(lo) && is_finite(hi) && lo <= hi && is_finite(add_rn(hi, -lo));
    return poisoned || valid;
  }
  GRADCOMM_HD bool check_codes() const { return false; }  // every b-bit code is on the grid
  GRADCOMM_HD bool code_valid(uint32_t) const { return true; }
};

// The policy for a layout of quant_layout's (the width and the rounding are run-time
// fields, uniform branches in the kernels, which keeps one instantiation). Decoding
// never rounds: stochastic = false there.
inline QuantPolicy quant_policy(const DenseLayout& l, bool stochastic) {
  return QuantPolicy{(1u << l.code_bits) - 1u, l.code_bits, stochastic};
}

struct GpuDenseKernels;
extern const GpuDenseKernels kQuantGpuKernels;  // gpu_quant_codec.cu (CUDA builds); Family::gpu_dense

}  // namespace gradcomm::detail
