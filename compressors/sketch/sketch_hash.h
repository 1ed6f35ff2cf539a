// Count-sketch hashing and the median estimate, shared by the CPU reference
// (count_sketch.cc) and the CUDA kernels (gpu_sketch.cu) so both hash every element
// to the same column and sign and take bitwise the same median. FORMAT.md,
// "Count sketch hashing": row r has salt_r = u64 draw r of the sketch's stream;
// z = fmix64(i ^ salt_r); column = (hi32(z) * cols) >> 32; sign = bit 0 of z.
#pragma once

#include <cstdint>

#include "compressors/philox.h"
#include "half.h"  // GRADCOMM_HD, float_bits, bits_float

namespace gradcomm::detail::sketch {

// Rows beyond this would only cost time (the median error falls like exp(-rows));
// the bound lets a GPU thread keep one element's votes in registers.
constexpr int kMaxRows = 64;

// MurmurHash3's 64-bit finalizer: a bijection with full avalanche.
GRADCOMM_HD uint64_t fmix64(uint64_t z) {
  z ^= z >> 33;
  z *= 0xFF51AFD7ED558CCDull;
  z ^= z >> 33;
  z *= 0xC4CEB9FE1A85EC53ull;
  z ^= z >> 33;
  return z;
}

GRADCOMM_HD uint64_t row_salt(const PhiloxStream& rng, int r) {
  const auto base = 2 * static_cast<uint64_t>(r);
  return static_cast<uint64_t>(philox_bits(rng, base)) | (static_cast<uint64_t>(philox_bits(rng, base + 1)) << 32);
}

GRADCOMM_HD uint64_t element_hash(uint64_t salt, uint64_t i) { return fmix64(i ^ salt); }
GRADCOMM_HD uint32_t column_of(uint64_t z, uint32_t cols) { return static_cast<uint32_t>(((z >> 32) * cols) >> 32); }
// s_r(i) * v, exact: flips the sign bit when bit 0 of z is set (branch-free).
GRADCOMM_HD float apply_sign(uint64_t z, float v) { return bits_float(float_bits(v) ^ (static_cast<uint32_t>(z & 1u) << 31)); }

// std::min / std::max on floats, spelled out so a GPU thread does the same with NaN:
// min(a, b) = b < a ? b : a, max(a, b) = a < b ? b : a.
GRADCOMM_HD float min_like_std(float a, float b) { return b < a ? b : a; }
GRADCOMM_HD float max_like_std(float a, float b) { return a < b ? b : a; }

// Sorts v[0, count) ascending with an odd-even transposition network (count rounds
// of compare-exchange): branch-free, the same on CPU and in a GPU thread.
GRADCOMM_HD void sort_small(float* v, int count) {
  for (int round = 0; round < count; ++round) {
    for (int a = round & 1; a + 1 < count; a += 2) {
      const float lo = min_like_std(v[a], v[a + 1]);
      const float hi = max_like_std(v[a], v[a + 1]);
      v[a] = lo;
      v[a + 1] = hi;
    }
  }
}

// Median of sorted v[0, rows): the middle value, or 0.5a + 0.5b of the two middle
// ones (cannot overflow). Each operation rounded separately: no FMA on the device.
GRADCOMM_HD float median_of_sorted(const float* v, int rows) {
  const int mid = rows / 2;
  if (rows & 1) return v[mid];
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(0.5f, v[mid - 1]), __fmul_rn(0.5f, v[mid]));
#else
  return 0.5f * v[mid - 1] + 0.5f * v[mid];
#endif
}

}  // namespace gradcomm::detail::sketch
