// The AVX2 decoders of dense_simd.h: quant, qsgd and sign, and qsgd's level check.
//
// Unpacking. Eight codes starting at an element that is a multiple of 8 fill exactly
// `bits` whole bytes (bitpack.h), code j of the group at bits [j * bits, (j + 1) *
// bits) of them. One 16-byte load of the group, broadcast to both 128-bit halves,
// lets pshufb put into dword j the four bytes that start at byte (j * bits) / 8; a
// variable shift right by (j * bits) % 8 leaves code j in the low `bits` bits (at
// most 7 + 16 = 23 bits are needed, so four bytes hold it). The bits above it are the next codes' and each decoder masks or
// shifts them away. Shuffle and shift depend on `bits` alone: a table built at
// compile time.
//
// Bounds. The 16-byte load may run past the group's own bytes, so a group goes
// through the vector path only when its load stays inside the stream; the head of a
// run up to the next multiple of 8, the tail, and the last ~16 bytes of the stream
// go element by element through read_code and the scalar formulas of dense_math.h.
//
// Each function is compiled for AVX2 alone (target attribute, not a file-wide -mavx2),
// so the rest of the library still runs on any x86-64.
#include <algorithm>
#include <array>

#include "compressors/dense/bitpack.h"
#include "compressors/dense/dense_simd.h"
#include "cpu_features.h"

#if GRADCOMM_X86_DISPATCH
#include <immintrin.h>
#endif

namespace gradcomm::detail {

#if GRADCOMM_X86_DISPATCH

namespace {

// pshufb control and srlv counts for one code width (see the top of the file).
struct UnpackTable {
  alignas(32) uint8_t shuffle[32];
  alignas(32) uint32_t shift[8];
};

constexpr std::array<UnpackTable, kMaxAvx2DecodeBits + 1> make_unpack_tables() {
  std::array<UnpackTable, kMaxAvx2DecodeBits + 1> tables{};
  for (unsigned bits = 1; bits <= kMaxAvx2DecodeBits; ++bits) {
    for (unsigned j = 0; j < 8; ++j) {
      const unsigned first_bit = j * bits;
      tables[bits].shift[j] = first_bit % 8;
      for (unsigned b = 0; b < 4; ++b) {
        const unsigned byte = first_bit / 8 + b;  // within the half's copy of the 16 bytes
        tables[bits].shuffle[4 * j + b] = static_cast<uint8_t>(byte < 16 ? byte : 0x80);  // 0x80: zero
      }
    }
  }
  return tables;
}
constexpr std::array<UnpackTable, kMaxAvx2DecodeBits + 1> kUnpackTables = make_unpack_tables();

class GroupUnpacker {
 public:
  __attribute__((target("avx2"))) explicit GroupUnpacker(unsigned bits)
      : shuffle_(_mm256_load_si256(reinterpret_cast<const __m256i*>(kUnpackTables[bits].shuffle))),
        shift_(_mm256_load_si256(reinterpret_cast<const __m256i*>(kUnpackTables[bits].shift))) {}

  // Lane j: code j of the group at `group` in its low bits, later codes' bits above.
  __attribute__((target("avx2"))) __m256i raw(const uint8_t* group) const {
    const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group)));
    return _mm256_srlv_epi32(_mm256_shuffle_epi8(bytes, shuffle_), shift_);
  }

 private:
  __m256i shuffle_, shift_;
};

// Visits codes [first, first + m) of s in order: v.group(raw, k) for the eight codes
// from element first + k where the vector path may take them (raw as
// GroupUnpacker::raw), v.one(code, k) for each of the others.
template <class Visitor>
__attribute__((target("avx2"))) void walk_codes(const CodeStream& s, uint64_t first, size_t m, Visitor& v) {
  // Copies: the visitor's stores could alias `s` for all the compiler knows.
  const uint8_t* const packed = s.packed;
  const unsigned bits = s.bits;
  size_t k = 0;
  const size_t head = static_cast<size_t>(std::min<uint64_t>(m, (8 - first % 8) % 8));
  for (; k < head; ++k) v.one(read_code(packed, first + k, bits), k);
  const uint64_t bytes = packed_code_bytes(s.total, bits);
  if (bits <= kMaxAvx2DecodeBits && bytes >= 16) {
    const GroupUnpacker unpack(bits);
    // Group g (elements 8g..8g+7) starts at byte g * bits; its load needs
    // g * bits + 16 <= bytes, so g <= last_group.
    const uint64_t g = (first + k) / 8, last_group = (bytes - 16) / bits;
    const uint64_t groups = g > last_group ? 0 : std::min<uint64_t>((m - k) / 8, last_group - g + 1);
    const uint8_t* p = packed + g * bits;
    uint64_t i = 0;
    for (; i + 2 <= groups; i += 2, k += 16, p += 2 * bits) {  // two per trip: half the loop overhead
      v.group(unpack.raw(p), k);
      v.group(unpack.raw(p + bits), k + 8);
    }
    if (i < groups) {
      v.group(unpack.raw(p), k);
      k += 8;
    }
  }
  for (; k < m; ++k) v.one(read_code(packed, first + k, bits), k);
}

// The values of eight codes from their raw lanes, and of one code (the formula of
// dense_math.h it mirrors).
struct QuantValues {
  __attribute__((target("avx2"))) QuantValues(unsigned bits, float lo, float step)
      : mask8(_mm256_set1_epi32(static_cast<int>((1u << bits) - 1u))),
        lo8(_mm256_set1_ps(lo)),
        step8(_mm256_set1_ps(step)),
        lo1(lo),
        step1(step) {}
  // add_rn(lo, mul_rn(float(code), step)).
  __attribute__((target("avx2"))) __m256 group(__m256i raw) const {
    return _mm256_add_ps(lo8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(raw, mask8)), step8));
  }
  float one(uint32_t code) const { return quant_value(lo1, step1, code); }

  __m256i mask8;
  __m256 lo8, step8;
  float lo1, step1;
};

struct QsgdValues {
  __attribute__((target("avx2"))) QsgdValues(unsigned bits, float unit)
      : level_mask8(_mm256_set1_epi32(static_cast<int>((1u << (bits - 1)) - 1u))),
        sign_shift(_mm_cvtsi32_si128(static_cast<int>(bits - 1))),
        unit8(_mm256_set1_ps(unit)),
        unit1(unit),
        bits1(bits) {}
  // The sign is bit bits - 1 of the code: shifted down to bit 0, then up to bit 31,
  // which drops the later codes' bits above it.
  __attribute__((target("avx2"))) __m256 group(__m256i raw) const {
    const __m256 magnitude = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(raw, level_mask8)), unit8);
    const __m256i sign = _mm256_slli_epi32(_mm256_srl_epi32(raw, sign_shift), 31);
    return _mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign));
  }
  float one(uint32_t code) const { return qsgd_value(code, unit1, bits1); }

  __m256i level_mask8;
  __m128i sign_shift;
  __m256 unit8;
  float unit1;
  unsigned bits1;
};

struct SignValues {
  __attribute__((target("avx2"))) explicit SignValues(float scale) : scale8(_mm256_set1_ps(scale)), scale1(scale) {}
  // Bit 0 of each lane to bit 31 (the bits above it fall off), or'ed into the scale.
  __attribute__((target("avx2"))) __m256 group(__m256i raw) const {
    return _mm256_or_ps(scale8, _mm256_castsi256_ps(_mm256_slli_epi32(raw, 31)));
  }
  float one(uint32_t code) const { return sign_value(scale1, code); }

  __m256 scale8;
  float scale1;
};

// y[k] = v, y[k] += v or y[k] = v * scale (store_value).
template <DecodeStore kStore, class Values>
struct DecodeInto {
  __attribute__((target("avx2"))) void group(__m256i raw, size_t k) {
    __m256 v = values.group(raw);
    if constexpr (kStore == DecodeStore::kAdd) v = _mm256_add_ps(_mm256_loadu_ps(y + k), v);
    if constexpr (kStore == DecodeStore::kScale) v = _mm256_mul_ps(v, _mm256_set1_ps(scale));
    _mm256_storeu_ps(y + k, v);
  }
  void one(uint32_t code, size_t k) { store_value<kStore>(y[k], values.one(code), scale); }

  const Values& values;
  float scale;
  float* y;
};

template <class Values>
__attribute__((target("avx2"))) void decode_codes(const CodeStream& s, uint64_t first, size_t m,
                                                   const Values& values, DecodeStore store, float scale, float* y) {
  switch (store) {
    case DecodeStore::kSet: {
      DecodeInto<DecodeStore::kSet, Values> d{values, scale, y};
      return walk_codes(s, first, m, d);
    }
    case DecodeStore::kAdd: {
      DecodeInto<DecodeStore::kAdd, Values> d{values, scale, y};
      return walk_codes(s, first, m, d);
    }
    case DecodeStore::kScale: {
      DecodeInto<DecodeStore::kScale, Values> d{values, scale, y};
      return walk_codes(s, first, m, d);
    }
  }
}

// The largest code & mask: per lane over the groups, in `worst` over the others.
struct MaxLevel {
  __attribute__((target("avx2"))) void group(__m256i raw, size_t) {
    worst8 = _mm256_max_epu32(worst8, _mm256_and_si256(raw, mask8));
  }
  void one(uint32_t code, size_t) { worst = std::max(worst, code & mask); }

  __m256i mask8, worst8;
  uint32_t mask, worst;
};

}  // namespace

__attribute__((target("avx2"))) void quant_decode_avx2(const CodeStream& codes, uint64_t first, size_t m, float lo,
                                                        float step, DecodeStore store, float scale, float* y) {
  decode_codes(codes, first, m, QuantValues(codes.bits, lo, step), store, scale, y);
}

namespace {

// Whole codes, eight at a time, through a DecodeInto (their mask leaves them as they are).
template <class Into>
__attribute__((target("avx2"))) void values_into(const uint32_t* codes, size_t m, Into into) {
  size_t k = 0;
  for (; k + 8 <= m; k += 8) into.group(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + k)), k);
  for (; k < m; ++k) into.one(codes[k], k);
}

}  // namespace

// The same DecodeInto as quant_decode_avx2, so the values are the decoder's bit for bit.
__attribute__((target("avx2"))) void quant_values_avx2(const uint32_t* codes, size_t m, unsigned bits, float lo,
                                                        float step, DecodeStore store, float scale, float* y) {
  const QuantValues values(bits, lo, step);
  switch (store) {
    case DecodeStore::kSet: return values_into(codes, m, DecodeInto<DecodeStore::kSet, QuantValues>{values, scale, y});
    case DecodeStore::kAdd: return values_into(codes, m, DecodeInto<DecodeStore::kAdd, QuantValues>{values, scale, y});
    case DecodeStore::kScale:
      return values_into(codes, m, DecodeInto<DecodeStore::kScale, QuantValues>{values, scale, y});
  }
}

__attribute__((target("avx2"))) void qsgd_decode_avx2(const CodeStream& codes, uint64_t first, size_t m, float unit,
                                                       DecodeStore store, float scale, float* y) {
  decode_codes(codes, first, m, QsgdValues(codes.bits, unit), store, scale, y);
}

__attribute__((target("avx2"))) void sign_decode_avx2(const CodeStream& codes, uint64_t first, size_t m,
                                                       float sign_scale, DecodeStore store, float scale, float* y) {
  decode_codes(codes, first, m, SignValues(sign_scale), store, scale, y);
}

__attribute__((target("avx2"))) uint32_t max_level_avx2(const CodeStream& codes, uint32_t level_mask) {
  MaxLevel v{_mm256_set1_epi32(static_cast<int>(level_mask)), _mm256_setzero_si256(), level_mask, 0};
  walk_codes(codes, 0, static_cast<size_t>(codes.total), v);
  alignas(32) uint32_t lane[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane), v.worst8);
  return std::max(v.worst, *std::max_element(lane, lane + 8));
}

#else  // no AVX2 dispatch on this platform: use_avx2_kernels() is false, never called

namespace {

template <class Value>
void decode_codes(const CodeStream& s, uint64_t first, size_t m, DecodeStore store, float scale, float* y,
                  Value value) {
  for (size_t k = 0; k < m; ++k) {
    const float v = value(read_code(s.packed, first + k, s.bits));
    switch (store) {
      case DecodeStore::kSet: store_value<DecodeStore::kSet>(y[k], v, scale); break;
      case DecodeStore::kAdd: store_value<DecodeStore::kAdd>(y[k], v, scale); break;
      case DecodeStore::kScale: store_value<DecodeStore::kScale>(y[k], v, scale); break;
    }
  }
}

}  // namespace

void quant_decode_avx2(const CodeStream& codes, uint64_t first, size_t m, float lo, float step, DecodeStore store,
                       float scale, float* y) {
  decode_codes(codes, first, m, store, scale, y, [&](uint32_t c) { return quant_value(lo, step, c); });
}
void qsgd_decode_avx2(const CodeStream& codes, uint64_t first, size_t m, float unit, DecodeStore store, float scale,
                      float* y) {
  decode_codes(codes, first, m, store, scale, y, [&](uint32_t c) { return qsgd_value(c, unit, codes.bits); });
}
void quant_values_avx2(const uint32_t* codes, size_t m, unsigned, float lo, float step, DecodeStore store, float scale,
                       float* y) {
  for (size_t k = 0; k < m; ++k) {
    switch (store) {
      case DecodeStore::kSet: store_value<DecodeStore::kSet>(y[k], quant_value(lo, step, codes[k]), scale); break;
      case DecodeStore::kAdd: store_value<DecodeStore::kAdd>(y[k], quant_value(lo, step, codes[k]), scale); break;
      case DecodeStore::kScale: store_value<DecodeStore::kScale>(y[k], quant_value(lo, step, codes[k]), scale); break;
    }
  }
}
void sign_decode_avx2(const CodeStream& codes, uint64_t first, size_t m, float sign_scale, DecodeStore store,
                      float scale, float* y) {
  decode_codes(codes, first, m, store, scale, y, [&](uint32_t c) { return sign_value(sign_scale, c); });
}
uint32_t max_level_avx2(const CodeStream& codes, uint32_t level_mask) {
  uint32_t worst = 0;
  for (uint64_t i = 0; i < codes.total; ++i) {
    worst = std::max(worst, read_code(codes.packed, i, codes.bits) & level_mask);
  }
  return worst;
}

#endif

}  // namespace gradcomm::detail
