// Layout of a sparse payload (compressors/FORMAT.md, "Sparse payload"), shared by the CPU
// codec (sparse_payload.cc) and the CUDA one (gpu_sparse_payload.cu) through GRADCOMM_HD
// functions, so both compute the same sizes and write the same bytes.
//
// Indices travel raw (u32, or u64 from n = 2^32) or Elias–Fano coded (Elias 1974,
// Fano 1971; the form of Vigna, "Quasi-succinct indices", WSDM'13): for `count`
// strictly increasing indices below n, each index x is split into its L low bits,
// L = floor(log2(n / count)), stored packed, and its high part x >> L, stored in unary
// as bit (x_j >> L) + j of a bit vector of count + ((n - 1) >> L) bits. That is about
// L + 2 bits per index (log2(n/k) + 2), against 32, and the size depends only on
// (n, count), so payloads of the same count have the same size on every rank.
//
// Values travel as fp32, fp16 or bf16 (`values=`); the 16-bit forms round to nearest
// even (half.h) and error feedback keeps what the rounding dropped.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compressors/compressor_id.h"
#include "half.h"  // GRADCOMM_HD, the 16-bit casts

namespace gradcomm::detail {

// Header flag bits of a sparse payload.
constexpr uint16_t kSparseFlagU64Indices = 1u << 0;   // raw indices are u64: set iff n >= 2^32
constexpr uint16_t kSparseFlagFp16Values = 1u << 1;
constexpr uint16_t kSparseFlagBf16Values = 1u << 2;
constexpr uint16_t kSparseFlagCodedIndices = 1u << 3;  // Elias–Fano
constexpr uint16_t kSparseKnownFlags =
    kSparseFlagU64Indices | kSparseFlagFp16Values | kSparseFlagBf16Values | kSparseFlagCodedIndices;
constexpr uint64_t kSparseU32Limit = uint64_t{1} << 32;

GRADCOMM_HD unsigned sparse_value_bytes(ValueType t) { return t == ValueType::kFp32 ? 4u : 2u; }

GRADCOMM_HD uint16_t sparse_flags(uint64_t n, ValueType values, bool coded) {
  uint16_t f = n >= kSparseU32Limit ? kSparseFlagU64Indices : 0;
  if (values == ValueType::kFp16) f |= kSparseFlagFp16Values;
  if (values == ValueType::kBf16) f |= kSparseFlagBf16Values;
  if (coded) f |= kSparseFlagCodedIndices;
  return f;
}

// The value as it travels, and back: what a decoder adds for `x`.
GRADCOMM_HD uint16_t sparse_narrow(float x, ValueType t) {
  return t == ValueType::kFp16 ? float_to_half(x) : float_to_bf16(x);
}
GRADCOMM_HD float sparse_widen(uint16_t h, ValueType t) {
  return t == ValueType::kFp16 ? half_to_float(h) : bf16_to_float(h);
}
GRADCOMM_HD float sparse_round(float x, ValueType t) {
  return t == ValueType::kFp32 ? x : sparse_widen(sparse_narrow(x, t), t);
}

// What error feedback keeps of a transmitted value x sent as `sent`: x - sent, or 0
// where that is not finite (x or sent infinite or NaN: the non-finite value reaches
// every rank's output, and a residual of inf or NaN would poison every later step).
GRADCOMM_HD float sparse_rounding_residual(float x, float sent) {
  const float d = x - sent;
  return d - d == 0.0f ? d : 0.0f;  // d - d is 0 exactly for finite d, NaN otherwise
}

// Floor of log2 of v >= 1.
GRADCOMM_HD unsigned floor_log2_u64(uint64_t v) {
  unsigned l = 0;
  while (v >>= 1) ++l;
  return l;
}

// The index sections of `count` indices below n (count <= n, n < 2^63).
struct EliasFanoLayout {
  unsigned low_bits = 0;     // L
  uint64_t high_bits = 0;    // bits of the unary section: count + ((n - 1) >> L)
  uint64_t low_bytes = 0;    // ceil(count * L / 8)
  uint64_t high_bytes = 0;   // ceil(high_bits / 8)
};

GRADCOMM_HD EliasFanoLayout elias_fano_layout(uint64_t n, uint64_t count) {
  EliasFanoLayout e;
  if (count == 0 || n == 0) return e;
  e.low_bits = floor_log2_u64(n / count);
  e.high_bits = count + ((n - 1) >> e.low_bits);
  e.low_bytes = (count * e.low_bits + 7) / 8;
  e.high_bytes = (e.high_bits + 7) / 8;
  return e;
}

// Layout of a whole payload: header, values (offset 24, so aligned for their type),
// then the indices: raw (count x u32|u64) or coded (low section, then high section).
struct SparseLayout {
  uint64_t values_offset = 24;
  uint64_t indices_offset = 0;  // raw indices, or the coded low section
  uint64_t high_offset = 0;     // coded only: the unary section
  uint64_t total = 0;
  unsigned value_bytes = 4;
  unsigned index_bytes = 4;     // raw only
  EliasFanoLayout ef;           // coded only
};

GRADCOMM_HD SparseLayout sparse_layout(uint64_t n, uint64_t count, ValueType values, bool coded) {
  SparseLayout s;
  s.value_bytes = sparse_value_bytes(values);
  s.index_bytes = n >= kSparseU32Limit ? 8u : 4u;
  s.indices_offset = s.values_offset + count * s.value_bytes;
  if (coded) {
    s.ef = elias_fano_layout(n, count);
    s.high_offset = s.indices_offset + s.ef.low_bytes;
    s.total = s.high_offset + s.ef.high_bytes;
  } else {
    s.high_offset = s.indices_offset + count * s.index_bytes;
    s.total = s.high_offset;
  }
  return s;
}

// Low part of coded index j: bits [j*L, (j+1)*L) of the low section, least significant
// first, bit k being bit k % 8 of byte k / 8 (bitpack.h's order); L <= 63. Reads only
// the bytes that hold it.
GRADCOMM_HD uint64_t elias_fano_low(const uint8_t* low, uint64_t j, unsigned L) {
  if (L == 0) return 0;
  const uint64_t bit = j * L;
  const uint8_t* p = low + bit / 8;
  const unsigned shift = static_cast<unsigned>(bit % 8);
  const unsigned nbytes = (shift + L + 7) / 8;  // <= 9
  uint64_t v = 0;
  for (unsigned b = 0; b < nbytes; ++b) {
    const unsigned at = 8 * b;
    // Byte b holds bits [at - shift, at - shift + 8) of the value.
    v |= at >= shift ? static_cast<uint64_t>(p[b]) << (at - shift) : static_cast<uint64_t>(p[b]) >> shift;
  }
  return L == 64 ? v : v & ((uint64_t{1} << L) - 1);
}

}  // namespace gradcomm::detail
