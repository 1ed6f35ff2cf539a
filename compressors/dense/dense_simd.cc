// The AVX2 bulk loops of dense_simd.h, eight elements per register. Each function
// is compiled for AVX2 alone (target attribute, not a file-wide -mavx2), so the rest
// of the library still runs on any x86-64; the tails shorter than a register go
// through the scalar formulas of dense_math.h, inlined here.
#include "compressors/dense/dense_simd.h"

#include <climits>
#include <cstring>

#include "compressors/cpu_kernels.h"
#include "cpu_features.h"

#if GRADCOMM_X86_DISPATCH
#include <immintrin.h>
#endif

namespace gradcomm::detail {

#if GRADCOMM_X86_DISPATCH

namespace {

// Horizontal min/max of eight int32 lanes.
__attribute__((target("avx2"))) int32_t hmin_epi32(__m256i v) {
  __m128i m = _mm_min_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_min_epi32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_min_epi32(m, _mm_shuffle_epi32(m, 0xB1));
  return _mm_cvtsi128_si32(m);
}
__attribute__((target("avx2"))) int32_t hmax_epi32(__m256i v) {
  __m128i m = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0xB1));
  return _mm_cvtsi128_si32(m);
}

// quant_position for eight elements: (x + (-lo)) * inv, then max(s, 0) and
// min(s, levels). maxps returns its second operand unless the first is greater, so
// NaN goes to 0 and -0 to +0, as `s > 0 ? s : 0` does.
__attribute__((target("avx2"))) __m256 quant_position8(__m256 x, __m256 neg_lo, __m256 inv, __m256 levels) {
  const __m256 s = _mm256_mul_ps(_mm256_add_ps(x, neg_lo), inv);
  return _mm256_min_ps(_mm256_max_ps(s, _mm256_setzero_ps()), levels);
}

// round_stochastic for eight positions in [0, 2^24]: whole = trunc(s), frac = s -
// whole (exact: both are fp32 and whole <= s < whole + 1), plus one where u < frac.
__attribute__((target("avx2"))) __m256i round_stochastic8(__m256 s, __m256 u) {
  const __m256i whole = _mm256_cvttps_epi32(s);
  const __m256 frac = _mm256_sub_ps(s, _mm256_cvtepi32_ps(whole));
  return _mm256_sub_epi32(whole, _mm256_castps_si256(_mm256_cmp_ps(u, frac, _CMP_LT_OQ)));  // mask is -1
}

// The 32 codes c[0, 32), each < 256, as 32 bytes in order. packs/packus work within
// 128-bit halves, so they leave the dwords (4 codes each) in the order 0 2 4 6 1 3 5
// 7; the permutation puts them back.
__attribute__((target("avx2"))) __m256i codes_to_bytes(const uint32_t* c) {
  const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c));
  const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 8));
  const __m256i r2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 16));
  const __m256i r3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 24));
  const __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(r0, r1), _mm256_packs_epi32(r2, r3));
  return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The low byte of each 16-bit lane of v, in order (16 bytes).
__attribute__((target("avx2"))) __m128i low_bytes_of_words(__m256i v) {
  const __m256i packed = _mm256_packus_epi16(v, v);  // each half: its 8 bytes, twice
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

}  // namespace

__attribute__((target("avx2"))) BucketRange bucket_range_avx2(const float* x, size_t m) {
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i max_finite = _mm256_set1_epi32(0x7F7FFFFF);
  __m256i lo8 = _mm256_set1_epi32(INT32_MAX), hi8 = _mm256_set1_epi32(INT32_MIN), bad8 = _mm256_setzero_si256();
  size_t j = 0;
  for (; j + 8 <= m; j += 8) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
    const __m256i key = _mm256_xor_si256(b, _mm256_and_si256(_mm256_srai_epi32(b, 31), magnitude));  // float_order_key
    lo8 = _mm256_min_epi32(lo8, key);
    hi8 = _mm256_max_epi32(hi8, key);
    bad8 = _mm256_or_si256(bad8, _mm256_cmpgt_epi32(_mm256_and_si256(b, magnitude), max_finite));
  }
  int32_t lo = hmin_epi32(lo8), hi = hmax_epi32(hi8);
  bool finite = _mm256_testz_si256(bad8, bad8) != 0;
  for (; j < m; ++j) {
    const int32_t key = float_order_key(x[j]);
    lo = key < lo ? key : lo;
    hi = key > hi ? key : hi;
    finite = finite && is_finite(x[j]);
  }
  return BucketRange{order_key_float(lo), order_key_float(hi), finite};
}

__attribute__((target("avx2"))) float sum_squares_avx2(const float* x, size_t m) {
  __m256 acc = _mm256_setzero_ps();  // lane l: element j into lane j % 8, in increasing j
  size_t j = 0;
  for (; j + kSumLanes <= m; j += kSumLanes) {
    const __m256 v = _mm256_loadu_ps(x + j);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
  }
  alignas(32) float lane[kSumLanes];
  _mm256_store_ps(lane, acc);
  for (int l = 0; j + l < m; ++l) lane[l] = add_rn(lane[l], mul_rn(x[j + l], x[j + l]));
  return combine_lanes(lane);
}

__attribute__((target("avx2"))) void quant_codes_nearest_avx2(const float* x, size_t m, float lo, float inv,
                                                               float levels, uint32_t* codes) {
  const __m256 neg_lo = _mm256_set1_ps(-lo), inv8 = _mm256_set1_ps(inv), levels8 = _mm256_set1_ps(levels);
  const __m256 half = _mm256_set1_ps(0.5f);
  size_t k = 0;
  for (; k + 8 <= m; k += 8) {
    const __m256 s = quant_position8(_mm256_loadu_ps(x + k), neg_lo, inv8, levels8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + k), _mm256_cvttps_epi32(_mm256_add_ps(s, half)));
  }
  for (; k < m; ++k) codes[k] = round_half_up(quant_position(x[k], lo, inv, levels));
}

namespace {
// quant_codes_stochastic_avx2's loop sixteen at a time, over the whole groups of
// sixteen; returns how many it did. maxps/minps, cvttps2dq and the ordered compare
// behave lane for lane as their 256-bit forms, so the codes are the AVX2 loop's bits.
__attribute__((target("avx512f"))) size_t quant_codes_stochastic_avx512(const float* x, const float* u, size_t m,
                                                                        float lo, float inv, float levels,
                                                                        uint32_t* codes) {
  const __m512 neg_lo = _mm512_set1_ps(-lo), inv16 = _mm512_set1_ps(inv), levels16 = _mm512_set1_ps(levels);
  const __m512i one = _mm512_set1_epi32(1);
  size_t k = 0;
  for (; k + 16 <= m; k += 16) {
    __m512 s = _mm512_mul_ps(_mm512_add_ps(_mm512_loadu_ps(x + k), neg_lo), inv16);
    s = _mm512_min_ps(_mm512_max_ps(s, _mm512_setzero_ps()), levels16);
    const __m512i whole = _mm512_cvttps_epi32(s);
    const __m512 frac = _mm512_sub_ps(s, _mm512_cvtepi32_ps(whole));
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_loadu_ps(u + k), frac, _CMP_LT_OQ);
    _mm512_storeu_si512(codes + k, _mm512_mask_add_epi32(whole, up, whole, one));
  }
  return k;
}
}  // namespace

__attribute__((target("avx2"))) void quant_codes_stochastic_avx2(const float* x, const float* u, size_t m, float lo,
                                                                  float inv, float levels, uint32_t* codes) {
  const __m256 neg_lo = _mm256_set1_ps(-lo), inv8 = _mm256_set1_ps(inv), levels8 = _mm256_set1_ps(levels);
  size_t k = use_avx512_kernels() ? quant_codes_stochastic_avx512(x, u, m, lo, inv, levels, codes) : 0;
  for (; k + 8 <= m; k += 8) {
    const __m256 s = quant_position8(_mm256_loadu_ps(x + k), neg_lo, inv8, levels8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + k), round_stochastic8(s, _mm256_loadu_ps(u + k)));
  }
  for (; k < m; ++k) codes[k] = round_stochastic(quant_position(x[k], lo, inv, levels), u[k]);
}

__attribute__((target("avx2"))) void qsgd_codes_avx2(const float* x, const float* u, size_t m, float scale,
                                                      float levels, unsigned bits, uint32_t* codes) {
  const __m256 scale8 = _mm256_set1_ps(scale), levels8 = _mm256_set1_ps(levels);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m128i sign_shift = _mm_cvtsi32_si128(static_cast<int>(bits - 1));
  size_t k = 0;
  for (; k + 8 <= m; k += 8) {
    const __m256 v = _mm256_loadu_ps(x + k);
    // qsgd_position: |x| * scale clamped to [0, levels], NaN -> 0.
    __m256 l = _mm256_mul_ps(_mm256_and_ps(v, magnitude), scale8);
    l = _mm256_min_ps(_mm256_max_ps(l, _mm256_setzero_ps()), levels8);
    const __m256i level = round_stochastic8(l, _mm256_loadu_ps(u + k));
    const __m256i sign = _mm256_sll_epi32(_mm256_srli_epi32(_mm256_castps_si256(v), 31), sign_shift);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + k), _mm256_or_si256(level, sign));
  }
  for (; k < m; ++k) codes[k] = qsgd_code(x[k], round_stochastic(qsgd_position(x[k], scale, levels), u[k]), bits);
}

// Per 32 codes: bits 8 stores the bytes; 4 merges byte pairs b0 + 16 b1 (maddubs,
// no overflow: at most 255) and keeps the low bytes; 2 merges b0 + 4 b1 (maddubs),
// then word pairs w0 + 16 w1 (madd) into one byte per dword; 1 moves each byte's
// bit 0 to its sign bit and takes movemask's 32 bits. The stream is LSB-first
// (bitpack.h), so in every case code i lands at stream bits [i * bits, (i + 1) * bits).
__attribute__((target("avx2"))) size_t pack_codes_avx2(const uint32_t* codes, size_t count, unsigned bits,
                                                       uint8_t* out) {
  const size_t groups = count / 32;
  switch (bits) {
    case 8:
      for (size_t g = 0; g < groups; ++g) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * g), codes_to_bytes(codes + 32 * g));
      }
      break;
    case 4: {
      const __m256i nibble_pairs = _mm256_set1_epi16(0x1001);  // bytes (1, 16)
      for (size_t g = 0; g < groups; ++g) {
        const __m256i words = _mm256_maddubs_epi16(codes_to_bytes(codes + 32 * g), nibble_pairs);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * g), low_bytes_of_words(words));
      }
      break;
    }
    case 2: {
      const __m256i crumb_pairs = _mm256_set1_epi16(0x0401);  // bytes (1, 4)
      const __m256i word_pairs = _mm256_set1_epi32(0x00100001);  // words (1, 16)
      for (size_t g = 0; g < groups; ++g) {
        const __m256i dwords =
            _mm256_madd_epi16(_mm256_maddubs_epi16(codes_to_bytes(codes + 32 * g), crumb_pairs), word_pairs);
        // Dword j < 256 holds the byte for codes 4j..4j+3: to words, to bytes (each
        // 128-bit half repeats its 4 bytes), then bytes 0-3 and 16-19 side by side.
        const __m256i words = _mm256_packus_epi32(dwords, dwords);
        const __m256i b = _mm256_packus_epi16(words, words);
        const __m256i gathered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 8 * g), _mm256_castsi256_si128(gathered));
      }
      break;
    }
    case 1:
      for (size_t g = 0; g < groups; ++g) {
        const uint32_t mask = static_cast<uint32_t>(
            _mm256_movemask_epi8(_mm256_slli_epi16(codes_to_bytes(codes + 32 * g), 7)));
        std::memcpy(out + 4 * g, &mask, 4);
      }
      break;
    default:
      return 0;
  }
  return groups * 32;
}

#else  // no AVX2 dispatch on this platform: use_avx2_kernels() is false, never called

BucketRange bucket_range_avx2(const float* x, size_t m) { return bucket_range(x, m); }
float sum_squares_avx2(const float* x, size_t m) {
  return lane_sum(x, m, [](float v) { return mul_rn(v, v); });
}
void quant_codes_nearest_avx2(const float* x, size_t m, float lo, float inv, float levels, uint32_t* codes) {
  for (size_t k = 0; k < m; ++k) codes[k] = round_half_up(quant_position(x[k], lo, inv, levels));
}
void quant_codes_stochastic_avx2(const float* x, const float* u, size_t m, float lo, float inv, float levels,
                                 uint32_t* codes) {
  for (size_t k = 0; k < m; ++k) codes[k] = round_stochastic(quant_position(x[k], lo, inv, levels), u[k]);
}
void qsgd_codes_avx2(const float* x, const float* u, size_t m, float scale, float levels, unsigned bits,
                     uint32_t* codes) {
  for (size_t k = 0; k < m; ++k) {
    codes[k] = qsgd_code(x[k], round_stochastic(qsgd_position(x[k], scale, levels), u[k]), bits);
  }
}
size_t pack_codes_avx2(const uint32_t*, size_t, unsigned, uint8_t*) { return 0; }

#endif

}  // namespace gradcomm::detail
