// The per-element arithmetic of the bucketed dense codecs (quant, qsgd, sign), in
// one place so the CPU reference and the CUDA kernels compute bit-identical codes
// and decoded values. Every formula is a fixed sequence of fp32 operations, each
// rounded to nearest even; nothing may be fused (the device path uses the _rn
// intrinsics, which nvcc never contracts into FMAs; the CPU files build with
// -ffp-contract=off). FORMAT.md, "Dense codecs", spells the same sequences out.
#pragma once

#include <cmath>
#include <cstdint>

#include "half.h"  // GRADCOMM_HD, float_bits, bits_float

namespace gradcomm::detail {

// fp32 a * b and a + b, never contracted into a fused multiply-add.
GRADCOMM_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
GRADCOMM_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Correctly rounded square root (IEEE on both sides).
GRADCOMM_HD float sqrt_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

constexpr uint32_t kCanonicalNanBits = 0x7FC00000u;  // what a poisoned bucket stores
constexpr float kMaxFinite = 3.40282346638528859812e+38f;

GRADCOMM_HD bool is_finite(float x) { return (float_bits(x) & 0x7FFFFFFFu) < 0x7F800000u; }
GRADCOMM_HD bool is_nan(float x) { return (float_bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }

// ---- bucket reductions ---------------------------------------------------------
// Order key: a signed integer ordered exactly as the float values are, with -0 < +0
// (negative floats have their magnitude bits flipped). Its own inverse.
GRADCOMM_HD int32_t float_order_key(float x) {
  const int32_t b = static_cast<int32_t>(float_bits(x));
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}
GRADCOMM_HD float order_key_float(int32_t key) {
  return bits_float(static_cast<uint32_t>(key ^ ((key >> 31) & 0x7FFFFFFF)));
}

// Sums over a bucket (sign's mean |x|, qsgd's squared norm) are taken in a fixed
// order so every implementation gets the same bits: element j of the bucket (j
// counted from the bucket start) is added, in increasing j, to lane j % 8, each lane
// starting at +0; then the lanes are combined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)).
constexpr int kSumLanes = 8;
GRADCOMM_HD float combine_lanes(const float* lane) {
  const float a = add_rn(add_rn(lane[0], lane[1]), add_rn(lane[2], lane[3]));
  const float b = add_rn(add_rn(lane[4], lane[5]), add_rn(lane[6], lane[7]));
  return add_rn(a, b);
}

// ---- quant: per-bucket min/max, uniform grid of 2^bits - 1 steps -----------------
// Scale factor the encoder multiplies by: levels / (hi - lo). A constant bucket, a
// poisoned (NaN) one, or a range so small the factor overflows gets 0: every code 0.
GRADCOMM_HD float quant_inverse_step(float lo, float hi, uint32_t levels) {
  const float range = add_rn(hi, -lo);
  if (!(range > 0.0f)) return 0.0f;
  const float inv = static_cast<float>(levels) / range;
  return inv <= kMaxFinite ? inv : 0.0f;
}
// The grid step the decoder multiplies by: (hi - lo) / levels.
GRADCOMM_HD float quant_step(float lo, float hi, uint32_t levels) {
  return add_rn(hi, -lo) / static_cast<float>(levels);
}
// Position of x on the grid, clamped to [0, levels]; NaN maps to 0 (only reachable
// in a poisoned bucket, whose decode is NaN anyway).
GRADCOMM_HD float quant_position(float x, float lo, float inv, float levels) {
  float s = mul_rn(add_rn(x, -lo), inv);
  s = s > 0.0f ? s : 0.0f;
  return s < levels ? s : levels;
}
// Round half up: trunc(s + 0.5), the sum rounded in fp32 (s in [0, 255]).
GRADCOMM_HD uint32_t round_half_up(float s) {
  return static_cast<uint32_t>(static_cast<int32_t>(add_rn(s, 0.5f)));
}
// floor(s) + (u < frac(s)) for s in [0, 2^24], u uniform in [0, 1): unbiased, and
// never above ceil(s), so a clamped position never yields a code past the grid.
GRADCOMM_HD uint32_t round_stochastic(float s, float u) {
  const int32_t whole = static_cast<int32_t>(s);
  const float frac = add_rn(s, -static_cast<float>(whole));
  return static_cast<uint32_t>(whole) + (u < frac ? 1u : 0u);
}
GRADCOMM_HD float quant_value(float lo, float step, uint32_t code) {
  return add_rn(lo, mul_rn(static_cast<float>(code), step));
}

// ---- qsgd: per-bucket L2 norm, levels 0..s plus a sign bit -----------------------
// Bits per element: 1 sign bit + ceil(log2(s + 1)) level bits.
GRADCOMM_HD unsigned qsgd_code_bits(uint32_t levels) {
  unsigned level_bits = 0;
  while ((uint64_t{1} << level_bits) < static_cast<uint64_t>(levels) + 1) ++level_bits;
  return 1 + level_bits;
}
// levels / norm; 0 for a zero or poisoned norm (every level 0). When the factor
// overflows (subnormal norm) it is +inf and qsgd_position clamps to [0, levels].
GRADCOMM_HD float qsgd_scale(float norm, uint32_t levels) {
  if (!(norm > 0.0f)) return 0.0f;
  return static_cast<float>(levels) / norm;
}
// |x| * scale clamped to [0, levels] (NaN -> 0, +inf -> levels).
GRADCOMM_HD float qsgd_position(float x, float scale, float levels) {
  float l = mul_rn(bits_float(float_bits(x) & 0x7FFFFFFFu), scale);
  l = l > 0.0f ? l : 0.0f;
  return l < levels ? l : levels;
}
// code = level | sign << (bits - 1); sign = the sign bit of x.
GRADCOMM_HD uint32_t qsgd_code(float x, uint32_t level, unsigned bits) {
  return level | ((float_bits(x) >> 31) << (bits - 1));
}
// Decode: the magnitude unit = norm / levels per bucket, then +-(level * unit).
GRADCOMM_HD float qsgd_unit(float norm, uint32_t levels) { return norm / static_cast<float>(levels); }
GRADCOMM_HD float qsgd_value(uint32_t code, float unit, unsigned bits) {
  const uint32_t level = code & ((1u << (bits - 1)) - 1u);
  const uint32_t sign = code >> (bits - 1);
  return bits_float(float_bits(mul_rn(static_cast<float>(level), unit)) ^ (sign << 31));
}

// ---- sign: 1 bit per element, per-bucket scale = mean |x| ------------------------
// bit = the sign bit of x (1 for negative values, -0.0 and negative NaNs included).
GRADCOMM_HD uint32_t sign_bit(float x) { return float_bits(x) >> 31; }
// +-scale; scale >= 0 or NaN, so setting the sign bit negates it.
GRADCOMM_HD float sign_value(float scale, uint32_t bit) { return bits_float(float_bits(scale) | (bit << 31)); }

}  // namespace gradcomm::detail
