// F16C's conversions round to nearest even and keep NaNs NaN, as float_to_half does;
// they differ from half.h in one place only: widening a signalling NaN half, which
// the hardware quiets (sets the fp32 quiet bit) and half_to_float passes through
// unchanged. The vector path clears that bit again for those lanes, so both paths
// give the same bits for all 65536 halves (tests/unit/test_half_bulk.cc). Narrowing
// needs no fix-up: float_to_half also returns a quiet NaN with the top payload bits.
// The paths run with the default MXCSR (no flush-to-zero), as the rest of gradcomm.
#include "half_bulk.h"

#include "cpu_features.h"
#include "half.h"

#if GRADCOMM_X86_DISPATCH
#include <immintrin.h>
#endif

namespace gradcomm::detail {
namespace {

#if GRADCOMM_X86_DISPATCH
__attribute__((target("avx2,f16c"))) void narrow_f16c(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  floats_to_halves_scalar(in + i, out + i, n - i);
}

__attribute__((target("avx2,f16c"))) void widen_f16c(const uint16_t* in, float* out, size_t n, bool add) {
  const __m256i exp_quiet = _mm256_set1_epi32(0x7E00);  // exponent and the half's quiet bit
  const __m256i exp_only = _mm256_set1_epi32(0x7C00);
  const __m256i payload = _mm256_set1_epi32(0x03FF);
  const __m256i quiet32 = _mm256_set1_epi32(0x00400000);
  const __m256i zero = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m256i w = _mm256_cvtepu16_epi32(h);
    // Signalling NaN: all-ones exponent, quiet bit clear, payload not zero.
    const __m256i snan = _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_and_si256(w, payload), zero),
                                             _mm256_cmpeq_epi32(_mm256_and_si256(w, exp_quiet), exp_only));
    __m256 f = _mm256_cvtph_ps(h);
    f = _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_and_si256(snan, quiet32), _mm256_castps_si256(f)));
    if (add) f = _mm256_add_ps(_mm256_loadu_ps(out + i), f);
    _mm256_storeu_ps(out + i, f);
  }
  halves_to_floats_scalar(in + i, out + i, n - i, add);
}

// bf16: the top half of the float's bits. Widening is a shift; narrowing rounds to
// nearest even on the dropped 16 bits (the carry may reach the exponent: up to
// infinity, as IEEE) and keeps a NaN a quiet NaN, as float_to_bf16 does.
__attribute__((target("avx2"))) void widen_bf16_avx2(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  bf16s_to_floats_scalar(in + i, out + i, n - i);
}

__attribute__((target("avx2"))) void narrow_bf16_avx2(const float* in, uint16_t* out, size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  const __m256i half_ulp = _mm256_set1_epi32(0x7FFF);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x0040);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(in + i));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(half_ulp, odd)), 16);
    const __m256i quieted = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
    const __m256i r = _mm256_blendv_epi8(rounded, quieted, nan);
    // Eight 32-bit values (each < 2^16) to eight 16-bit ones: pack within each 128-bit
    // lane, then bring the two lanes' low halves together.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(packed));
  }
  floats_to_bf16s_scalar(in + i, out + i, n - i);
}
#endif

}  // namespace

void floats_to_halves_scalar(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = float_to_half(in[i]);
}

void halves_to_floats_scalar(const uint16_t* in, float* out, size_t n, bool add) {
  for (size_t i = 0; i < n; ++i) {
    const float v = half_to_float(in[i]);
    out[i] = add ? out[i] + v : v;
  }
}

void floats_to_halves(const float* in, uint16_t* out, size_t n) {
#if GRADCOMM_X86_DISPATCH
  if (cpu_has_avx2_f16c()) return narrow_f16c(in, out, n);
#endif
  floats_to_halves_scalar(in, out, n);
}

void halves_to_floats(const uint16_t* in, float* out, size_t n, bool add) {
#if GRADCOMM_X86_DISPATCH
  if (cpu_has_avx2_f16c()) return widen_f16c(in, out, n, add);
#endif
  halves_to_floats_scalar(in, out, n, add);
}

void floats_to_bf16s_scalar(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

void bf16s_to_floats_scalar(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

void floats_to_bf16s(const float* in, uint16_t* out, size_t n) {
#if GRADCOMM_X86_DISPATCH
  if (cpu_has_avx2()) return narrow_bf16_avx2(in, out, n);
#endif
  floats_to_bf16s_scalar(in, out, n);
}

void bf16s_to_floats(const uint16_t* in, float* out, size_t n) {
#if GRADCOMM_X86_DISPATCH
  if (cpu_has_avx2()) return widen_bf16_avx2(in, out, n);
#endif
  bf16s_to_floats_scalar(in, out, n);
}

const char* half_bulk_path() { return cpu_has_avx2_f16c() ? "f16c" : "scalar"; }

}  // namespace gradcomm::detail
