// Philox4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3",
// SC'11), a counter-based generator: the same (key, counter) gives the same numbers
// on CPU and GPU, in any order, in parallel. Shared by every compressor that draws
// random numbers. Everything but philox_stream_id is defined here, GRADCOMM_HD, so
// CUDA kernels compute bit-identical draws to the CPU reference.
//
// Checked against the Random123 known-answer vectors (tests/unit/test_philox.cc).
#pragma once

#include <cstdint>

#include "half.h"  // GRADCOMM_HD

namespace gradcomm::detail {

// One independent stream: `seed` is the Philox key; `stream` (from the tensor's
// key, its step and, where the draw is per rank, the rank) fills the upper
// counter words. Element i of a stream uses counter word 0/1 = i / 4 and lane i % 4.
struct PhiloxStream {
  uint64_t seed = 0;
  uint64_t stream = 0;
};

// stream id from (key hash, step, rank); rank = -1 for draws shared by all ranks.
uint64_t philox_stream_id(uint64_t key_hash, uint64_t step, int rank);

struct Philox4 {
  uint32_t v[4];
};

namespace philox_internal {

constexpr uint32_t kMul0 = 0xD2511F53u;   // round multipliers (paper, Table 2)
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // key schedule: golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // key schedule: sqrt(3) - 1
constexpr int kRounds = 10;
constexpr float kUniformScale = 5.9604644775390625e-8f;  // 2^-24: 24 random bits -> [0, 1)
constexpr float kUniform16Scale = 1.52587890625e-5f;      // 2^-16: 16 random bits -> [0, 1)

// High and low halves of the 64-bit product a * b.
GRADCOMM_HD uint32_t mulhi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

}  // namespace philox_internal

// The raw block for counter (c0..c3) under key (k0, k1). One round maps
// (x0, x1, x2, x3) to (hi(M1 x2) ^ x1 ^ k0, lo(M1 x2), hi(M0 x0) ^ x3 ^ k1, lo(M0 x0));
// the key advances by the Weyl constants between rounds (10 rounds, 9 bumps).
GRADCOMM_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  using namespace philox_internal;
#if defined(__CUDACC__)
#pragma unroll
#elif defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 10  // -O2 keeps the loop otherwise: a third slower on the CPU
#endif
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
#if defined(__CUDA_ARCH__)
    const uint32_t hi0 = mulhi(kMul0, c0);
    const uint32_t lo0 = kMul0 * c0;
    const uint32_t hi1 = mulhi(kMul1, c2);
    const uint32_t lo1 = kMul1 * c2;
#else
    // Both halves from one 64-bit product: x86 without a 32-bit vector multiply
    // would otherwise compute the low half through shifts and adds (~3x slower).
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
#endif
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// 32 random bits for element `index` of the stream. Four consecutive indices share
// one Philox block; callers that want all four can call philox4x32_10 directly with
// the same mapping (counter = (block lo, block hi, stream lo, stream hi)).
GRADCOMM_HD uint32_t philox_bits(const PhiloxStream& s, uint64_t index) {
  const uint64_t block = index >> 2;
  const Philox4 r = philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                                  static_cast<uint32_t>(s.stream), static_cast<uint32_t>(s.stream >> 32),
                                  static_cast<uint32_t>(s.seed), static_cast<uint32_t>(s.seed >> 32));
  return r.v[index & 3u];
}

// Uniform in [0, 1), 24-bit resolution, from 32 random bits: the top 24 bits scaled
// by 2^-24, exact in fp32, so the largest value is 1 - 2^-24 < 1 and "u < p" is an
// unbiased Bernoulli(p) draw for stochastic rounding.
GRADCOMM_HD float uniform_from_bits(uint32_t bits) {
  return static_cast<float>(bits >> 8) * philox_internal::kUniformScale;
}

// That uniform for element `index` of the stream.
GRADCOMM_HD float philox_uniform(const PhiloxStream& s, uint64_t index) {
  return uniform_from_bits(philox_bits(s, index));
}

// Uniform in [0, 1), 16-bit resolution: 16 random bits scaled by 2^-16 (exact), the
// largest 1 - 2^-16. What stochastic rounding draws (the dense codecs): "u < p" is then
// a Bernoulli(ceil(2^16 p) / 2^16) draw, off p by less than 2^-16, which is 2^-16 of a
// rounding step against a rounding noise of up to half a step. Half the random bits
// of a 24-bit uniform buy one Philox block per eight elements instead of four.
GRADCOMM_HD float uniform_from_bits16(uint32_t bits16) {
  return static_cast<float>(bits16) * philox_internal::kUniform16Scale;
}

// That uniform for element `index` of the stream: the low (index even) or high (odd)
// 16 bits of word index / 2, i.e. of Philox block index / 8, lane (index / 2) % 4.
GRADCOMM_HD float philox_uniform16(const PhiloxStream& s, uint64_t index) {
  return uniform_from_bits16((philox_bits(s, index >> 1) >> (16u * static_cast<uint32_t>(index & 1u))) & 0xFFFFu);
}

// Uniforms of whole blocks, the bulk path of stochastic rounding: out[8b + j] =
// philox_uniform16(s, 8 (block0 + b) + j) for j in [0, 8), b in [0, blocks). Sixteen
// blocks at a time in AVX-512 registers where the CPU has AVX-512F, eight in AVX2
// registers where it has AVX2 (philox.cc), bit-identical to the scalar definition
// above on every path. Host only.
void philox_uniform16_blocks(const PhiloxStream& s, uint64_t block0, uint64_t blocks, float* out);
// The same, one block at a time: the reference the vector path is tested against.
void philox_uniform16_blocks_scalar(const PhiloxStream& s, uint64_t block0, uint64_t blocks, float* out);
// "avx512", "avx2" or "scalar": the path philox_uniform16_blocks takes now
// (compressors/cpu_kernels.h).
const char* philox_uniform_blocks_path();

}  // namespace gradcomm::detail
