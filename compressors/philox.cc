#include "compressors/philox.h"

#include "cpu_features.h"

#if GRADCOMM_X86_DISPATCH
#include <immintrin.h>
#endif

namespace gradcomm::detail {
namespace {

// splitmix64's output function (Steele, Lea, Flood 2014): a bijection on 64 bits
// with full avalanche, so nearby inputs (step 7 vs 8, rank 0 vs 1) give unrelated ids.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

#if GRADCOMM_X86_DISPATCH
// Eight blocks per iteration, one per 32-bit lane: word j of the eight counters in
// register cj, the round function of philox4x32_10 on all of them at once. AVX2
// multiplies only the even 32-bit lanes into 64-bit products, so each of the two
// multiplies per round takes two (even lanes, then the odd ones shifted down), and
// the high and low halves are blended back into lane order. The four output
// registers (word j of blocks b..b+7) are transposed into block order, four floats
// per block, before the store.
__attribute__((target("avx2"))) __m256i mul_lo(__m256i even, __m256i odd) {
  return _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}
__attribute__((target("avx2"))) __m256i mul_hi(__m256i even, __m256i odd) {
  return _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

__attribute__((target("avx2"))) void uniform_blocks_avx2(const PhiloxStream& s, uint64_t block0, uint64_t blocks,
                                                          float* out) {
  using namespace philox_internal;
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kMul0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(kMul1));
  const __m256i s0 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(s.stream)));
  const __m256i s1 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(s.stream >> 32)));
  const __m256 scale = _mm256_set1_ps(philox_internal::kUniformScale);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  uint64_t b = 0;
  for (; b + 8 <= blocks; b += 8) {
    const uint64_t first = block0 + b;
    __m256i c0, c1;
    if (static_cast<uint32_t>(first) <= 0xFFFFFFFFu - 7) {  // the high word is the same in all eight
      c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(first))), iota);
      c1 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(first >> 32)));
    } else {
      alignas(32) uint32_t lo[8], hi[8];
      for (int i = 0; i < 8; ++i) {
        lo[i] = static_cast<uint32_t>(first + static_cast<uint64_t>(i));
        hi[i] = static_cast<uint32_t>((first + static_cast<uint64_t>(i)) >> 32);
      }
      c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
      c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
    }
    __m256i c2 = s0, c3 = s1;
    uint32_t k0 = static_cast<uint32_t>(s.seed), k1 = static_cast<uint32_t>(s.seed >> 32);
    for (int round = 0; round < kRounds; ++round) {
      if (round > 0) {
        k0 += kWeyl0;
        k1 += kWeyl1;
      }
      const __m256i e0 = _mm256_mul_epu32(c0, m0), o0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
      const __m256i e1 = _mm256_mul_epu32(c2, m1), o1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
      const __m256i hi0 = mul_hi(e0, o0), lo0 = mul_lo(e0, o0);
      const __m256i hi1 = mul_hi(e1, o1), lo1 = mul_lo(e1, o1);
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
      c1 = lo1;
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
      c3 = lo0;
    }
    // Uniforms (exact: a 24-bit integer, then a power of two), still word-major.
    const __m256 u0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c0, 8)), scale);
    const __m256 u1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c1, 8)), scale);
    const __m256 u2 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c2, 8)), scale);
    const __m256 u3 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c3, 8)), scale);
    // 4 x 8 transpose: t* interleave words 0/1 and 2/3; v_i holds blocks i and i+4.
    const __m256 t0 = _mm256_unpacklo_ps(u0, u1), t1 = _mm256_unpackhi_ps(u0, u1);
    const __m256 t2 = _mm256_unpacklo_ps(u2, u3), t3 = _mm256_unpackhi_ps(u2, u3);
    const __m256 v0 = _mm256_shuffle_ps(t0, t2, 0x44), v1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 v2 = _mm256_shuffle_ps(t1, t3, 0x44), v3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    float* o = out + 4 * b;
    _mm256_storeu_ps(o, _mm256_permute2f128_ps(v0, v1, 0x20));       // blocks 0, 1
    _mm256_storeu_ps(o + 8, _mm256_permute2f128_ps(v2, v3, 0x20));   // blocks 2, 3
    _mm256_storeu_ps(o + 16, _mm256_permute2f128_ps(v0, v1, 0x31));  // blocks 4, 5
    _mm256_storeu_ps(o + 24, _mm256_permute2f128_ps(v2, v3, 0x31));  // blocks 6, 7
  }
  philox_uniform_blocks_scalar(s, block0 + b, blocks - b, out + 4 * b);
}
#endif


}  // namespace

void philox_uniform_blocks_scalar(const PhiloxStream& s, uint64_t block0, uint64_t blocks, float* out) {
  const uint32_t s0 = static_cast<uint32_t>(s.stream), s1 = static_cast<uint32_t>(s.stream >> 32);
  const uint32_t k0 = static_cast<uint32_t>(s.seed), k1 = static_cast<uint32_t>(s.seed >> 32);
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t block = block0 + b;
    const Philox4 r = philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), s0, s1, k0, k1);
    for (int lane = 0; lane < 4; ++lane) out[4 * b + lane] = uniform_from_bits(r.v[lane]);
  }
}

void philox_uniform_blocks(const PhiloxStream& s, uint64_t block0, uint64_t blocks, float* out) {
#if GRADCOMM_X86_DISPATCH
  if (cpu_has_avx2()) {
    uniform_blocks_avx2(s, block0, blocks, out);
    return;
  }
#endif
  philox_uniform_blocks_scalar(s, block0, blocks, out);
}

const char* philox_uniform_blocks_path() { return cpu_has_avx2() ? "avx2" : "scalar"; }

// Chained, not XORed together: mixing each input into the running state before the
// next one enters keeps (key, step, rank) and its permutations apart, e.g.
// (step 1, rank 2) and (step 2, rank 1) give different streams. rank -1 (shared
// draws) enters as its own value, 2^64 - 1, which no real rank takes.
uint64_t philox_stream_id(uint64_t key_hash, uint64_t step, int rank) {
  uint64_t h = splitmix64(key_hash);
  h = splitmix64(h ^ step);
  h = splitmix64(h ^ static_cast<uint64_t>(static_cast<int64_t>(rank)));
  return h;
}

}  // namespace gradcomm::detail
