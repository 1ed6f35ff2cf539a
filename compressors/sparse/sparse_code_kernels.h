// The per-thread steps of the CUDA sparse codec (gpu_sparse_payload.cu) as GRADCOMM_HD
// functions on plain arrays, so tests/unit/test_sparse_code_kernels.cc can run the
// kernels' exact decomposition on the CPU (a loop over "threads") and hold it byte for
// byte to encode_sparse / decode_sparse. Layout and formulas: sparse_code.h; format:
// compressors/FORMAT.md, "Sparse payload (topk)".
//
// Encoding writes every byte of the payload exactly once, with no atomics and no fill
// beforehand (the output is scratch from earlier steps):
//   header                thread 0
//   values, raw indices   one entry j per thread
//   low section           one 32-bit word w per thread: stream bits [32w, 32w + 32) hold
//                         (parts of) the low parts of indices j in [32w / L, (32w + 31) / L]
//   high section          one 32-bit word w per thread: index j sets bit (x_j >> L) + j,
//                         which increases strictly with j, so the bits inside the word come
//                         from a run of consecutive j starting at the first j whose bit is
//                         >= 32w (a binary search); at most 32 of them
// A word is stored as up to 4 single bytes, cut at its section's end: the coded sections
// start at any byte offset (after count 16-bit values, after the low section), and the
// bits past the last index come out 0, which is the format's padding.
//
// Decoding coded indices is a rank/select over the high section:
//   count   one 64-bit word of the high section per thread: its popcount
//   scan    exclusive sum of the counts (CUB): the rank of each word's first one bit
//   emit    per word: its k-th one bit, at position p, is index j = rank + k, and
//           x_j = ((p - j) << L) | low_j; the last word's thread checks that the total
//           number of one bits is count
//   check   per index: < n and above its predecessor (as for raw indices)
// Each step's result depends only on the payload, so the decode is deterministic. A
// word's rank is exact (the scan of true popcounts), so p >= j always, and for a header
// that passed check_sparse_header, ((p - j) << L) < 2n cannot wrap.
#pragma once

#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <bit>
#endif

#include "compressors/compressor_id.h"
#include "compressors/sparse/sparse_code.h"
#include "half.h"

namespace gradcomm::detail::sparse_kernels {

// ---- faults (the values of PayloadFault in cuda/device_status.h; this header must not
// need CUDA, so gpu_sparse_payload.cu static_asserts that the two agree) -----------------
enum class SparseFault : uint32_t {
  kNone = 0,
  kBadHeader = 1,
  kBadNumel = 2,
  kBadLength = 3,
  kIndexOutOfRange = 4,
  kIndexOrder = 5,
  kBadPadding = 6,
  kBadCode = 7,  // coded indices: the high section's one bits are not `count` (a = found, b = count)
};
struct SparseFaultRecord {
  SparseFault fault;
  int64_t a, b;  // details as PayloadFault documents
};

constexpr uint32_t kSparseMagic = 0x31504347u;  // "GCP1", PayloadHeader::kMagic
constexpr uint8_t kSparseVersion = 1;
constexpr uint64_t kSparseHeaderBytes = 24;

GRADCOMM_HD int64_t s64(uint64_t v) { return static_cast<int64_t>(v); }

// ---- bits and little-endian bytes at any alignment -------------------------------------
GRADCOMM_HD unsigned popcount64(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return static_cast<unsigned>(__popcll(v));
#else
  return static_cast<unsigned>(std::popcount(v));
#endif
}
// Position of the lowest one bit; v != 0.
GRADCOMM_HD unsigned lowest_bit(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return static_cast<unsigned>(__ffsll(static_cast<long long>(v)) - 1);
#else
  return static_cast<unsigned>(std::countr_zero(v));
#endif
}
GRADCOMM_HD uint64_t load_le(const uint8_t* p, unsigned bytes) {  // bytes <= 8
  uint64_t v = 0;
  for (unsigned b = 0; b < bytes; ++b) v |= static_cast<uint64_t>(p[b]) << (8 * b);
  return v;
}
GRADCOMM_HD void store_le(uint8_t* p, uint64_t v, unsigned bytes) {
  for (unsigned b = 0; b < bytes; ++b) p[b] = static_cast<uint8_t>(v >> (8 * b));
}

// ---- header ---------------------------------------------------------------------------------
GRADCOMM_HD uint64_t header_count(const uint8_t* p) { return load_le(p + 16, 8); }  // param0 | param1 << 32

GRADCOMM_HD void write_sparse_header(uint8_t* out, uint8_t id, uint64_t n, uint64_t count, ValueType values,
                                     bool coded) {
  store_le(out, kSparseMagic, 4);
  out[4] = kSparseVersion;
  out[5] = id;
  store_le(out + 6, sparse_flags(n, values, coded), 2);
  store_le(out + 8, n, 8);
  store_le(out + 16, count, 8);
}

// validate_sparse's framing checks for a payload of the expected format (flags must be
// exactly sparse_flags(n, values, coded)): size >= header, magic, version, id, numel,
// flags, count <= n and <= what the body's bytes can hold (first, so the layout
// arithmetic cannot wrap), the exact total, and zero padding bits in the last byte of
// each coded section. Reads only bytes [0, size) of p.
GRADCOMM_HD SparseFaultRecord check_sparse_header(const uint8_t* p, uint64_t size, uint8_t id, uint64_t n,
                                                  ValueType values, bool coded) {
  if (size < kSparseHeaderBytes) return {SparseFault::kBadLength, s64(size), s64(kSparseHeaderBytes)};
  const uint32_t magic = static_cast<uint32_t>(load_le(p, 4));
  if (magic != kSparseMagic) return {SparseFault::kBadHeader, magic, kSparseMagic};
  if (p[4] != kSparseVersion) return {SparseFault::kBadHeader, p[4], kSparseVersion};
  if (p[5] != id) return {SparseFault::kBadHeader, p[5], id};
  const uint64_t numel = load_le(p + 8, 8);
  if (numel != n) return {SparseFault::kBadNumel, s64(numel), s64(n)};
  const uint16_t flags = static_cast<uint16_t>(load_le(p + 6, 2));
  const uint16_t expected = sparse_flags(n, values, coded);
  if (flags != expected) return {SparseFault::kBadHeader, flags, expected};
  const uint64_t count = header_count(p);
  const uint64_t body = size - kSparseHeaderBytes;
  if (count > n || count > body / sparse_value_bytes(values)) return {SparseFault::kBadLength, s64(body), -1};
  const SparseLayout lay = sparse_layout(n, count, values, coded);
  if (lay.total != size) return {SparseFault::kBadLength, s64(size), s64(lay.total)};
  if (coded) {
    const unsigned low_used = static_cast<unsigned>((count * lay.ef.low_bits) % 8);
    if (low_used != 0 && (p[lay.high_offset - 1] >> low_used) != 0) {
      return {SparseFault::kBadPadding, p[lay.high_offset - 1], s64(lay.high_offset - 1)};
    }
    const unsigned high_used = static_cast<unsigned>(lay.ef.high_bits % 8);
    if (high_used != 0 && (p[lay.total - 1] >> high_used) != 0) {
      return {SparseFault::kBadPadding, p[lay.total - 1], s64(lay.total - 1)};
    }
  }
  return {SparseFault::kNone, 0, 0};
}

// ---- values ---------------------------------------------------------------------------------
// The bits value x travels as (fp32 bits, or the 16-bit code), and back.
GRADCOMM_HD uint32_t value_bits(float x, ValueType t) {
  return t == ValueType::kFp32 ? float_bits(x) : static_cast<uint32_t>(sparse_narrow(x, t));
}
GRADCOMM_HD float value_from_bits(uint32_t bits, ValueType t) {
  return t == ValueType::kFp32 ? bits_float(bits) : sparse_widen(static_cast<uint16_t>(bits), t);
}

// ---- encode: one 32-bit word of a coded section ------------------------------------------------
// 32-bit words covering a section of `bytes` bytes.
GRADCOMM_HD uint64_t section_words(uint64_t bytes) { return (bytes + 3) / 4; }

// Stores word w of a section of `bytes` bytes: its bytes [4w, 4w + 4) that lie inside.
GRADCOMM_HD void store_section_word(uint8_t* section, uint64_t bytes, uint64_t w, uint32_t v) {
  for (unsigned b = 0; b < 4; ++b) {
    const uint64_t at = 4 * w + b;
    if (at < bytes) section[at] = static_cast<uint8_t>(v >> (8 * b));
  }
}

// Word w of the low section of x[0, count): stream bits [32w, 32w + 32), index j's low
// L bits at [jL, (j+1)L); L in [1, 63] (L = 0 has no low section).
GRADCOMM_HD uint32_t ef_low_word(const uint64_t* x, uint64_t count, unsigned L, uint64_t w) {
  const uint64_t first = 32 * w;
  const uint64_t mask = (uint64_t{1} << L) - 1;
  const uint64_t end = (first + 31) / L + 1;  // one past the last index with a bit in the word
  uint32_t word = 0;
  for (uint64_t j = first / L; j < end && j < count; ++j) {
    const uint64_t low = x[j] & mask;
    const uint64_t at = j * L;  // below `first` only for the first j, whose low part straddles
    word |= at >= first ? static_cast<uint32_t>(low << (at - first)) : static_cast<uint32_t>(low >> (first - at));
  }
  return word;
}

// The first j in [0, count) whose high bit (x_j >> L) + j is >= bit, or count. The bits
// increase strictly with j and are >= j, so the answer is at most `bit`.
GRADCOMM_HD uint64_t ef_high_lower_bound(const uint64_t* x, uint64_t count, unsigned L, uint64_t bit) {
  uint64_t lo = 0, hi = count < bit ? count : bit;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if ((x[mid] >> L) + mid < bit) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Word w of the high section of x[0, count): bits [32w, 32w + 32).
GRADCOMM_HD uint32_t ef_high_word(const uint64_t* x, uint64_t count, unsigned L, uint64_t w) {
  const uint64_t first = 32 * w;
  uint32_t word = 0;
  for (uint64_t j = ef_high_lower_bound(x, count, L, first); j < count; ++j) {
    const uint64_t at = (x[j] >> L) + j - first;
    if (at >= 32) break;
    word |= 1u << at;
  }
  return word;
}

// ---- decode: rank / select over the high section -------------------------------------------
// 64-bit words covering the high section's bits, and a bound on them for any payload of
// at most max_count entries: high_bits = count + ((n - 1) >> L) < 3 count, because
// n < (floor(n / count) + 1) count <= 2^(L+1) count.
GRADCOMM_HD uint64_t ef_high_words(const EliasFanoLayout& ef) { return (ef.high_bits + 63) / 64; }
GRADCOMM_HD uint64_t ef_high_words_bound(uint64_t max_count) { return (3 * max_count + 63) / 64; }

// Word w of the high section (high_bytes bytes), bytes past the section read as 0.
GRADCOMM_HD uint64_t ef_load_high_word(const uint8_t* high, uint64_t high_bytes, uint64_t w) {
  const uint64_t at = 8 * w;
  const uint64_t left = high_bytes - at;
  return load_le(high + at, left < 8 ? static_cast<unsigned>(left) : 8u);
}

// The indices whose one bits lie in high word w, the first of them being index `rank`
// (the number of one bits before the word), into out[rank, ...). Indices >= count are
// not written (too many one bits: the total check reports it).
GRADCOMM_HD void ef_emit_word(uint64_t word, uint64_t w, uint64_t rank, const uint8_t* low, unsigned L,
                              uint64_t count, uint64_t* out) {
  for (; word != 0 && rank < count; ++rank) {
    const uint64_t pos = 64 * w + lowest_bit(word);
    word &= word - 1;
    out[rank] = ((pos - rank) << L) | elias_fano_low(low, rank, L);
  }
}

// The last word's verdict on the one bits: their total must be count.
GRADCOMM_HD SparseFaultRecord ef_check_total(uint64_t total, uint64_t count) {
  if (total != count) return {SparseFault::kBadCode, s64(total), s64(count)};
  return {SparseFault::kNone, 0, 0};
}

// ---- both forms: index j against n and its predecessor ----------------------------------------
GRADCOMM_HD SparseFaultRecord check_index(uint64_t x, uint64_t j, uint64_t prev, uint64_t n) {
  if (x >= n) return {SparseFault::kIndexOutOfRange, s64(x), s64(j)};
  if (j > 0 && x <= prev) return {SparseFault::kIndexOrder, s64(x), s64(j)};
  return {SparseFault::kNone, 0, 0};
}

}  // namespace gradcomm::detail::sparse_kernels
