// fp16 and bf16 <-> fp32 conversions, shared by CPU and CUDA code so both round
// identically. Narrowing rounds to nearest, ties to even; NaN stays NaN; values
// past the largest finite become infinity (IEEE behaviour).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GRADCOMM_HD __host__ __device__ __forceinline__
#else
#define GRADCOMM_HD inline
#endif

namespace gradcomm::detail {

GRADCOMM_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

GRADCOMM_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// ---- bfloat16: the top 16 bits of an fp32 ----------------------------------
GRADCOMM_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

GRADCOMM_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even on the dropped 16 bits
  return static_cast<uint16_t>(u >> 16);
}

// ---- float16 (IEEE binary16) ------------------------------------------------
GRADCOMM_HD float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return bits_float(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_float(sign);  // +-0
  // Subnormal: value = mant * 2^-24, exact in fp32.
  float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

GRADCOMM_HD uint16_t float_to_half(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));  // NaN
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504: inf
  if (abs >= 0x38800000u) {  // normal half (>= 2^-14)
    uint32_t r = abs - 0x38000000u;           // rebias exponent 127 -> 15
    r += 0xFFFu + ((r >> 13) & 1u);           // round to nearest even on 13 dropped bits
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (abs < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): +-0
  // Subnormal half: shift the full significand so its unit is 2^-24, rounding to even.
  const uint32_t exp = abs >> 23;                 // 102..112
  const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - exp;              // 14..24
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

}  // namespace gradcomm::detail
