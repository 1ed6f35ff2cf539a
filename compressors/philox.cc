#include "compressors/philox.h"

#include "compressors/cpu_kernels.h"
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
// Eight blocks per iteration, the round function of philox4x32_10 on all of them at
// once. AVX2 multiplies only the even 32-bit lanes (the low half of each 64-bit lane)
// into full 64-bit products, so each counter word lives in two registers of four
// 64-bit lanes, `e` for blocks b, b+2, b+4, b+6 and `o` for b+1, b+3, b+5, b+7, the
// word in the low half of each lane. Then one multiply gives both halves, the low
// half already where the next round wants it: lo(M x) is the product itself and
// hi(M x) one 64-bit shift. The high halves of the lanes carry leftovers that never
// reach a result: the multiplies read only low halves, shifts and XORs keep the
// halves apart, and the outputs take only the low halves.
struct Lanes {
  __m256i e, o;
};
// Counter words 0..3 of eight consecutive blocks.
struct Blocks8 {
  Lanes c[4];
};

// The round keys k0 + r W0, k1 + r W1 (r = 0..9), broadcast once per call.
struct RoundKeys {
  __m256i k0[philox_internal::kRounds], k1[philox_internal::kRounds];
};

// Half of a round, for the e and o lanes alike: (x, y) <- (hi(m c) ^ y ^ key, lo(m c)).
__attribute__((target("avx2"))) void half_round(Lanes& x, Lanes& y, const Lanes& c, __m256i m, __m256i key) {
  const __m256i pe = _mm256_mul_epu32(c.e, m), po = _mm256_mul_epu32(c.o, m);
  x.e = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(pe, 32), y.e), key);
  x.o = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(po, 32), y.o), key);
  y.e = pe, y.o = po;
}

// The ten rounds on eight blocks. Each round is four independent chains (the two
// multiplies, e and o lanes) of multiply, shift and two XORs. Interleaving a second
// group of eight to hide the multiply latency measured slower: with 16 registers
// its state spills.
__attribute__((target("avx2"))) void philox_rounds(Blocks8& g, const RoundKeys& rk) {
  using namespace philox_internal;
  const __m256i m0 = _mm256_set1_epi64x(kMul0), m1 = _mm256_set1_epi64x(kMul1);
  Lanes(&c)[4] = g.c;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 10  // rolled, -O2 spends a third of the loop on register moves
#endif
  for (int round = 0; round < kRounds; ++round) {
    const Lanes x0 = c[0];  // both multiplies read the words from before the round
    half_round(c[0], c[1], c[2], m1, rk.k0[round]);  // c0 <- hi(M1 c2) ^ c1 ^ k0, c1 <- lo(M1 c2)
    half_round(c[2], c[3], x0, m0, rk.k1[round]);    // c2 <- hi(M0 c0) ^ c3 ^ k1, c3 <- lo(M0 c0)
  }
}

// Blocks first .. first + 7 of the stream, before the rounds.
__attribute__((target("avx2"))) Blocks8 counters8(uint64_t first, __m256i s0, __m256i s1) {
  __m256i lo, hi;  // the block counters' low and high words, lane i for block first + i
  if (static_cast<uint32_t>(first) <= 0xFFFFFFFFu - 7) {  // the high word is the same in all eight
    lo = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(first))),
                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    hi = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(first >> 32)));
  } else {
    alignas(32) uint32_t lo_words[8], hi_words[8];
    for (int i = 0; i < 8; ++i) {
      lo_words[i] = static_cast<uint32_t>(first + static_cast<uint64_t>(i));
      hi_words[i] = static_cast<uint32_t>((first + static_cast<uint64_t>(i)) >> 32);
    }
    lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo_words));
    hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi_words));
  }
  return Blocks8{{{lo, _mm256_srli_epi64(lo, 32)}, {hi, _mm256_srli_epi64(hi, 32)}, {s0, s0}, {s1, s1}}};
}

// Uniforms of word j of the eight blocks, in block order: the low halves of e and o
// interleaved, then the top 24 bits scaled by 2^-24 (exact: a 24-bit integer, then
// a power of two).
__attribute__((target("avx2"))) __m256 word_uniforms(const Lanes& c) {
  const __m256i w = _mm256_blend_epi32(c.e, _mm256_slli_epi64(c.o, 32), 0xAA);
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(w, 8)), _mm256_set1_ps(philox_internal::kUniformScale));
}

// The 32 uniforms of eight blocks, four per block in block order: a 4 x 8
// transpose of the word-major registers. t* interleave words 0/1 and 2/3; v_i
// holds blocks i and i+4.
__attribute__((target("avx2"))) void store_uniforms8(const Blocks8& g, float* o) {
  const __m256 u0 = word_uniforms(g.c[0]), u1 = word_uniforms(g.c[1]);
  const __m256 u2 = word_uniforms(g.c[2]), u3 = word_uniforms(g.c[3]);
  const __m256 t0 = _mm256_unpacklo_ps(u0, u1), t1 = _mm256_unpackhi_ps(u0, u1);
  const __m256 t2 = _mm256_unpacklo_ps(u2, u3), t3 = _mm256_unpackhi_ps(u2, u3);
  const __m256 v0 = _mm256_shuffle_ps(t0, t2, 0x44), v1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 v2 = _mm256_shuffle_ps(t1, t3, 0x44), v3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  _mm256_storeu_ps(o, _mm256_permute2f128_ps(v0, v1, 0x20));       // blocks 0, 1
  _mm256_storeu_ps(o + 8, _mm256_permute2f128_ps(v2, v3, 0x20));   // blocks 2, 3
  _mm256_storeu_ps(o + 16, _mm256_permute2f128_ps(v0, v1, 0x31));  // blocks 4, 5
  _mm256_storeu_ps(o + 24, _mm256_permute2f128_ps(v2, v3, 0x31));  // blocks 6, 7
}

__attribute__((target("avx2"))) void uniform_blocks_avx2(const PhiloxStream& s, uint64_t block0, uint64_t blocks,
                                                          float* out) {
  using namespace philox_internal;
  RoundKeys rk;
  uint32_t k0 = static_cast<uint32_t>(s.seed), k1 = static_cast<uint32_t>(s.seed >> 32);
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    rk.k0[round] = _mm256_set1_epi32(static_cast<int>(k0));
    rk.k1[round] = _mm256_set1_epi32(static_cast<int>(k1));
  }
  const __m256i s0 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(s.stream)));
  const __m256i s1 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(s.stream >> 32)));
  uint64_t b = 0;
  for (; b + 8 <= blocks; b += 8) {
    Blocks8 g = counters8(block0 + b, s0, s1);
    philox_rounds(g, rk);
    store_uniforms8(g, out + 4 * b);
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
  if (use_avx2_kernels()) {
    uniform_blocks_avx2(s, block0, blocks, out);
    return;
  }
#endif
  philox_uniform_blocks_scalar(s, block0, blocks, out);
}

const char* philox_uniform_blocks_path() { return use_avx2_kernels() ? "avx2" : "scalar"; }

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
