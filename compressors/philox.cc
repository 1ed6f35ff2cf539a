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
// philox4x32_10's key schedule, k0 + r W0 and k1 + r W1 for rounds r = 0..9: the
// same for every block of a call, so the vector paths compute it once and broadcast.
struct RoundKeyWords {
  uint32_t k0[philox_internal::kRounds], k1[philox_internal::kRounds];
};

RoundKeyWords round_key_words(uint64_t seed) {
  using namespace philox_internal;
  RoundKeyWords w;
  w.k0[0] = static_cast<uint32_t>(seed);
  w.k1[0] = static_cast<uint32_t>(seed >> 32);
  for (int round = 1; round < kRounds; ++round) {
    w.k0[round] = w.k0[round - 1] + kWeyl0;
    w.k1[round] = w.k1[round - 1] + kWeyl1;
  }
  return w;
}

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

// Word j of the eight blocks, in block order: the low halves of e and o interleaved
// (as floats only for the shuffles below, which move bits without arithmetic).
__attribute__((target("avx2"))) __m256 block_words(const Lanes& c) {
  return _mm256_castsi256_ps(_mm256_blend_epi32(c.e, _mm256_slli_epi64(c.o, 32), 0xAA));
}

// The 16 uniforms of eight consecutive words: each word's 16-bit halves, low first (the
// order they sit in memory, so one zero-extension lines them up), scaled by 2^-16.
__attribute__((target("avx2"))) void store_word_halves(__m256i w, float* out) {
  const __m256 scale = _mm256_set1_ps(philox_internal::kUniform16Scale);
  const __m256i lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(w));
  const __m256i hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(w, 1));
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), scale));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), scale));
}

// The 64 uniforms of eight blocks, eight per block in block order: a 4 x 8 transpose
// of the word-major registers into block order (t* interleave words 0/1 and 2/3; v_i
// holds blocks i and i+4), then each register's words split in halves.
__attribute__((target("avx2"))) void store_uniforms8(const Blocks8& g, float* o) {
  const __m256 u0 = block_words(g.c[0]), u1 = block_words(g.c[1]);
  const __m256 u2 = block_words(g.c[2]), u3 = block_words(g.c[3]);
  const __m256 t0 = _mm256_unpacklo_ps(u0, u1), t1 = _mm256_unpackhi_ps(u0, u1);
  const __m256 t2 = _mm256_unpacklo_ps(u2, u3), t3 = _mm256_unpackhi_ps(u2, u3);
  const __m256 v0 = _mm256_shuffle_ps(t0, t2, 0x44), v1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 v2 = _mm256_shuffle_ps(t1, t3, 0x44), v3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  store_word_halves(_mm256_castps_si256(_mm256_permute2f128_ps(v0, v1, 0x20)), o);       // blocks 0, 1
  store_word_halves(_mm256_castps_si256(_mm256_permute2f128_ps(v2, v3, 0x20)), o + 16);  // blocks 2, 3
  store_word_halves(_mm256_castps_si256(_mm256_permute2f128_ps(v0, v1, 0x31)), o + 32);  // blocks 4, 5
  store_word_halves(_mm256_castps_si256(_mm256_permute2f128_ps(v2, v3, 0x31)), o + 48);  // blocks 6, 7
}

__attribute__((target("avx2"))) void uniform_blocks_avx2(const PhiloxStream& s, uint64_t block0, uint64_t blocks,
                                                          float* out) {
  const RoundKeyWords w = round_key_words(s.seed);
  RoundKeys rk;
  for (int round = 0; round < philox_internal::kRounds; ++round) {
    rk.k0[round] = _mm256_set1_epi32(static_cast<int>(w.k0[round]));
    rk.k1[round] = _mm256_set1_epi32(static_cast<int>(w.k1[round]));
  }
  const __m256i s0 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(s.stream)));
  const __m256i s1 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(s.stream >> 32)));
  uint64_t b = 0;
  for (; b + 8 <= blocks; b += 8) {
    Blocks8 g = counters8(block0 + b, s0, s1);
    philox_rounds(g, rk);
    store_uniforms8(g, out + 8 * b);
  }
  philox_uniform16_blocks_scalar(s, block0 + b, blocks - b, out + 8 * b);
}

// ---- AVX-512: sixteen blocks per iteration ----------------------------------------
// The layout of the AVX2 path in registers twice as wide: each counter word in two
// registers of eight 64-bit lanes, e for blocks b, b+2, .., b+14 and o for b+1, ..,
// b+15, the word in the low half of each lane, so one _mm512_mul_epu32 again gives
// both halves of eight products. What AVX-512F adds: one ternarylogic for the
// three-way XOR of each half round (3 instructions where AVX2 takes 4, on twice the
// blocks), a mask compare for counters that wrap the low word (no scalar slow path),
// and two-source permutes for the transpose. With 32 registers the state (8) and
// both multipliers never spill; round keys the registers do not hold are read as
// memory operands of the ternarylogic.
struct Lanes16 {
  __m512i e, o;
};
struct Blocks16 {
  Lanes16 c[4];
};
struct RoundKeys16 {
  __m512i k0[philox_internal::kRounds], k1[philox_internal::kRounds];
};

// half_round on sixteen blocks: (x, y) <- (hi(m c) ^ y ^ key, lo(m c)).
__attribute__((target("avx512f"))) void half_round16(Lanes16& x, Lanes16& y, const Lanes16& c, __m512i m,
                                                     __m512i key) {
  constexpr int kXor3 = 0x96;  // ternarylogic truth table of a ^ b ^ c
  const __m512i pe = _mm512_mul_epu32(c.e, m), po = _mm512_mul_epu32(c.o, m);
  x.e = _mm512_ternarylogic_epi32(_mm512_srli_epi64(pe, 32), y.e, key, kXor3);
  x.o = _mm512_ternarylogic_epi32(_mm512_srli_epi64(po, 32), y.o, key, kXor3);
  y.e = pe, y.o = po;
}

__attribute__((target("avx512f"))) void philox_rounds16(Blocks16& g, const RoundKeys16& rk) {
  using namespace philox_internal;
  const __m512i m0 = _mm512_set1_epi64(kMul0), m1 = _mm512_set1_epi64(kMul1);
  Lanes16(&c)[4] = g.c;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 10  // as in philox_rounds
#endif
  for (int round = 0; round < kRounds; ++round) {
    const Lanes16 x0 = c[0];
    half_round16(c[0], c[1], c[2], m1, rk.k0[round]);
    half_round16(c[2], c[3], x0, m0, rk.k1[round]);
  }
}

// Two groups of sixteen, their rounds interleaved: one group's round is a chain of
// multiply (5 cycles) -> shift -> ternarylogic per half round, which leaves the
// multiplier idle most of the time; the other group's independent chain fills it.
__attribute__((target("avx512f"))) void philox_rounds16x2(Blocks16& g, Blocks16& h, const RoundKeys16& rk) {
  using namespace philox_internal;
  const __m512i m0 = _mm512_set1_epi64(kMul0), m1 = _mm512_set1_epi64(kMul1);
  Lanes16(&c)[4] = g.c;
  Lanes16(&d)[4] = h.c;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 10
#endif
  for (int round = 0; round < kRounds; ++round) {
    const Lanes16 x0 = c[0], y0 = d[0];
    half_round16(c[0], c[1], c[2], m1, rk.k0[round]);
    half_round16(d[0], d[1], d[2], m1, rk.k0[round]);
    half_round16(c[2], c[3], x0, m0, rk.k1[round]);
    half_round16(d[2], d[3], y0, m0, rk.k1[round]);
  }
}

// Blocks first .. first + 15 before the rounds. Lane i's low word is first + i
// modulo 2^32; where that wrapped (it came out below i), the high word carries one,
// which also covers the wrap of the whole 64-bit counter.
__attribute__((target("avx512f"))) Blocks16 counters16(uint64_t first, __m512i s0, __m512i s1) {
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i lo = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(first))), iota);
  const __m512i hi0 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(first >> 32)));
  const __m512i hi = _mm512_mask_add_epi32(hi0, _mm512_cmplt_epu32_mask(lo, iota), hi0, _mm512_set1_epi32(1));
  return Blocks16{{{lo, _mm512_srli_epi64(lo, 32)}, {hi, _mm512_srli_epi64(hi, 32)}, {s0, s0}, {s1, s1}}};
}

// The 32 uniforms of sixteen consecutive words, as store_word_halves.
__attribute__((target("avx512f"))) void store_word_halves16(__m512i w, float* out) {
  const __m512 scale = _mm512_set1_ps(philox_internal::kUniform16Scale);
  const __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(w));
  const __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(w, 1));
  _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), scale));
  _mm512_storeu_ps(out + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), scale));
}

// The 128 uniforms of sixteen blocks in block order (the 64 words, then their halves). Pairing the low halves of two
// words' lanes gives 64-bit lanes that are half a block each: a = words 0-1 and
// b = words 2-3 of the even blocks, c and d the same of the odd ones (lane m: block
// 2m or 2m+1). Two rounds of two-source permutes on those halves then put blocks
// 4j .. 4j+3 in output register j.
__attribute__((target("avx512f"))) void store_uniforms16(const Blocks16& g, float* out) {
  const Lanes16(&c)[4] = g.c;
  constexpr __mmask16 kOdd = 0xAAAA;  // the high half of each 64-bit lane
  const __m512i a = _mm512_mask_blend_epi32(kOdd, c[0].e, _mm512_slli_epi64(c[1].e, 32));
  const __m512i b = _mm512_mask_blend_epi32(kOdd, c[2].e, _mm512_slli_epi64(c[3].e, 32));
  const __m512i cc = _mm512_mask_blend_epi32(kOdd, c[0].o, _mm512_slli_epi64(c[1].o, 32));
  const __m512i d = _mm512_mask_blend_epi32(kOdd, c[2].o, _mm512_slli_epi64(c[3].o, 32));
  // Indices 0-7 pick lanes of the first source, 8-15 of the second.
  const __m512i zip_lo = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
  const __m512i zip_hi = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
  const __m512i ab_lo = _mm512_permutex2var_epi64(a, zip_lo, b), ab_hi = _mm512_permutex2var_epi64(a, zip_hi, b);
  const __m512i cd_lo = _mm512_permutex2var_epi64(cc, zip_lo, d), cd_hi = _mm512_permutex2var_epi64(cc, zip_hi, d);
  // ab_lo = a0 b0 a1 b1 .. a3 b3 (blocks 0, 2, 4, 6), cd_lo the same for blocks 1, 3, 5, 7.
  const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  store_word_halves16(_mm512_permutex2var_epi64(ab_lo, first, cd_lo), out);        // blocks 0-3
  store_word_halves16(_mm512_permutex2var_epi64(ab_lo, second, cd_lo), out + 32);  // blocks 4-7
  store_word_halves16(_mm512_permutex2var_epi64(ab_hi, first, cd_hi), out + 64);   // blocks 8-11
  store_word_halves16(_mm512_permutex2var_epi64(ab_hi, second, cd_hi), out + 96);  // blocks 12-15
}

// Whole groups of sixteen; a remainder of 8 to 15 blocks takes one AVX2 group, the
// last 0 to 7 the scalar loop (both inside uniform_blocks_avx2).
__attribute__((target("avx512f"))) void uniform_blocks_avx512(const PhiloxStream& s, uint64_t block0,
                                                              uint64_t blocks, float* out) {
  const RoundKeyWords w = round_key_words(s.seed);
  RoundKeys16 rk;
  for (int round = 0; round < philox_internal::kRounds; ++round) {
    rk.k0[round] = _mm512_set1_epi32(static_cast<int>(w.k0[round]));
    rk.k1[round] = _mm512_set1_epi32(static_cast<int>(w.k1[round]));
  }
  const __m512i s0 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(s.stream)));
  const __m512i s1 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(s.stream >> 32)));
  uint64_t b = 0;
  for (; b + 32 <= blocks; b += 32) {
    Blocks16 g = counters16(block0 + b, s0, s1), h = counters16(block0 + b + 16, s0, s1);
    philox_rounds16x2(g, h, rk);
    store_uniforms16(g, out + 8 * b);
    store_uniforms16(h, out + 8 * (b + 16));
  }
  for (; b + 16 <= blocks; b += 16) {
    Blocks16 g = counters16(block0 + b, s0, s1);
    philox_rounds16(g, rk);
    store_uniforms16(g, out + 8 * b);
  }
  uniform_blocks_avx2(s, block0 + b, blocks - b, out + 8 * b);
}
#endif

}  // namespace

void philox_uniform16_blocks_scalar(const PhiloxStream& s, uint64_t block0, uint64_t blocks, float* out) {
  const uint32_t s0 = static_cast<uint32_t>(s.stream), s1 = static_cast<uint32_t>(s.stream >> 32);
  const uint32_t k0 = static_cast<uint32_t>(s.seed), k1 = static_cast<uint32_t>(s.seed >> 32);
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t block = block0 + b;
    const Philox4 r = philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), s0, s1, k0, k1);
    for (int lane = 0; lane < 4; ++lane) {
      out[8 * b + 2 * lane] = uniform_from_bits16(r.v[lane] & 0xFFFFu);
      out[8 * b + 2 * lane + 1] = uniform_from_bits16(r.v[lane] >> 16);
    }
  }
}

void philox_uniform16_blocks(const PhiloxStream& s, uint64_t block0, uint64_t blocks, float* out) {
#if GRADCOMM_X86_DISPATCH
  if (use_avx512_kernels()) {
    uniform_blocks_avx512(s, block0, blocks, out);
    return;
  }
  if (use_avx2_kernels()) {
    uniform_blocks_avx2(s, block0, blocks, out);
    return;
  }
#endif
  philox_uniform16_blocks_scalar(s, block0, blocks, out);
}

const char* philox_uniform_blocks_path() {
  if (use_avx512_kernels()) return "avx512";
  return use_avx2_kernels() ? "avx2" : "scalar";
}

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
