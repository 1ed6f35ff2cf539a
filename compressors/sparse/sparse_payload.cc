// Sparse payloads: index/value pairs of an n-element vector (sparse.h: encode_sparse,
// decode_add_sparse, decode_sum_sparse), used by top-k and the sparse collectives.
//
//   header (24 bytes, payload.h): id = the caller's compressor, numel = n,
//     flags (sparse_code.h): u64 raw indices (set iff n >= 2^32), fp16 values, bf16
//     values, coded indices; param0 = count & 0xFFFFFFFF, param1 = count >> 32
//   values:  count x (fp32 | fp16 | bf16)
//   indices: raw, count x (u32 | u64); or Elias–Fano coded: low bits, then the unary
//     high section
//
// The layout (sparse_code.h, sparse_layout) and so the size depend only on n, count and
// the format. Full layout: compressors/FORMAT.md. Every decoder validates the whole
// payload before touching `out`, so a corrupt payload leaves the output as it was.
#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "compressors/sparse/sparse.h"
#include "compressors/payload.h"
#include "compressors/sparse/sparse_code.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

template <class T>
inline T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
inline void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

// Appends `width` (<= 64) bits of v at stream bit `bit` of a zeroed byte array.
inline void put_bits(uint8_t* out, uint64_t bit, uint64_t v, unsigned width) {
  for (unsigned done = 0; done < width;) {
    const uint64_t at = bit + done;
    const unsigned shift = static_cast<unsigned>(at % 8);
    const unsigned take = std::min(8u - shift, width - done);
    out[at / 8] |= static_cast<uint8_t>(((v >> done) & ((1u << take) - 1u)) << shift);
    done += take;
  }
}

// Writes the low section (count x L bits, L <= 63) of coded indices.
void write_low_bits(const std::vector<uint64_t>& indices, unsigned L, uint8_t* low) {
  if (L == 0) return;
  const uint64_t mask = (uint64_t{1} << L) - 1;
  uint64_t bit = 0;
  for (uint64_t x : indices) {
    put_bits(low, bit, x & mask, L);
    bit += L;
  }
}

}  // namespace

size_t sparse_payload_bytes(int64_t n, int64_t count, SparseFormat format) {
  return static_cast<size_t>(
      sparse_layout(static_cast<uint64_t>(n), static_cast<uint64_t>(count), format.values, format.coded).total);
}

void encode_sparse_into(CompressorId id, int64_t n, const SparseVector& v, SparseFormat format, uint8_t* out) {
  const uint64_t un = static_cast<uint64_t>(n);
  const uint64_t count = v.indices.size();
  const SparseLayout lay = sparse_layout(un, count, format.values, format.coded);
  std::memset(out, 0, lay.total);

  PayloadHeader h;
  h.id = id;
  h.numel = un;
  h.flags = sparse_flags(un, format.values, format.coded);
  h.param0 = static_cast<uint32_t>(count);
  h.param1 = static_cast<uint32_t>(count >> 32);
  write_header(h, out);
  if (count == 0) return;

  uint8_t* val = out + lay.values_offset;
  if (format.values == ValueType::kFp32) {
    std::memcpy(val, v.values.data(), count * 4);
  } else {
    for (uint64_t j = 0; j < count; ++j) store<uint16_t>(val + j * 2, sparse_narrow(v.values[j], format.values));
  }

  uint8_t* idx = out + lay.indices_offset;
  if (format.coded) {
    const unsigned L = lay.ef.low_bits;
    write_low_bits(v.indices, L, idx);
    uint8_t* high = out + lay.high_offset;
    for (uint64_t j = 0; j < count; ++j) {
      const uint64_t bit = (v.indices[j] >> L) + j;
      high[bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
    }
  } else if (lay.index_bytes == 8) {
    std::memcpy(idx, v.indices.data(), count * 8);
  } else {
    for (uint64_t j = 0; j < count; ++j) store<uint32_t>(idx + j * 4, static_cast<uint32_t>(v.indices[j]));
  }
}

std::vector<uint8_t> encode_sparse(CompressorId id, int64_t n, const SparseVector& v, SparseFormat format) {
  if (n < 0) throw InvalidArgument(fmt::format("encode_sparse: numel {} < 0", n));
  if (v.indices.size() != v.values.size()) {
    throw InvalidArgument(fmt::format("encode_sparse: {} indices but {} values", v.indices.size(), v.values.size()));
  }
  // Refuse what the decoder would refuse, so a bug here shows up at the sender.
  const uint64_t un = static_cast<uint64_t>(n);
  for (size_t j = 0; j < v.indices.size(); ++j) {
    if (v.indices[j] >= un || (j > 0 && v.indices[j] <= v.indices[j - 1])) {
      throw InvalidArgument(fmt::format("encode_sparse: index {} at position {} is out of range (numel {}) or "
                                        "not above its predecessor",
                                        v.indices[j], j, n));
    }
  }
  std::vector<uint8_t> out(sparse_payload_bytes(n, static_cast<int64_t>(v.indices.size()), format));
  encode_sparse_into(id, n, v, format, out.data());
  return out;
}

namespace {

// A payload that passed validation: its indices decoded (so coded and raw payloads
// look alike to the adders) and its values where they lie.
struct SparseView {
  std::vector<uint64_t> indices;
  const uint8_t* val = nullptr;
  ValueType values = ValueType::kFp32;

  uint64_t count() const { return indices.size(); }
  float value(uint64_t j) const {
    return values == ValueType::kFp32 ? load<float>(val + j * 4) : sparse_widen(load<uint16_t>(val + j * 2), values);
  }
};

[[noreturn]] void corrupt(const char* name, const std::string& what) {
  throw CorruptPayload(fmt::format("{} sparse payload: {}", name, what));
}

// Decodes the Elias–Fano sections into `out` (count indices), checking that the high
// section holds exactly `count` one bits and zero padding, and every index is below n
// and above its predecessor.
// elias_fano_low(low, j, L), with one unaligned 8-byte load where the value fits in it
// (shift + L <= 63) and the load stays inside the `readable` bytes from `low` (the low
// section and the high section after it): the shared byte loop costs some 35
// instructions an index, this 6.
inline uint64_t low_part(const uint8_t* low, uint64_t readable, uint64_t j, unsigned L) {
  const uint64_t bit = j * L;
  if (L <= 56 && bit / 8 + 8 <= readable) {
    const uint64_t word = load<uint64_t>(low + bit / 8);
    return (word >> (bit % 8)) & ((uint64_t{1} << L) - 1);
  }
  return elias_fano_low(low, j, L);
}

void decode_coded(const char* name, const uint8_t* low, const uint8_t* high, const EliasFanoLayout& ef,
                  uint64_t count, uint64_t n, std::vector<uint64_t>& out) {
  out.resize(count);
  const unsigned L = ef.low_bits;
  uint64_t j = 0, prev = 0;
  const uint64_t words = (ef.high_bits + 63) / 64;
  for (uint64_t w = 0; w < words; ++w) {
    const uint64_t base = w * 64;
    const size_t bytes = static_cast<size_t>(std::min<uint64_t>(8, ef.high_bytes - w * 8));
    uint64_t word = 0;
    std::memcpy(&word, high + w * 8, bytes);
    if (w + 1 == words && ef.high_bits % 64 != 0 && (word >> (ef.high_bits % 64)) != 0) {
      corrupt(name, fmt::format("padding bits after the {} bits of the high section are not zero", ef.high_bits));
    }
    while (word != 0) {
      const uint64_t pos = base + static_cast<uint64_t>(std::countr_zero(word));
      word &= word - 1;
      if (j == count) corrupt(name, fmt::format("high section has more than count = {} one bits", count));
      const uint64_t x = ((pos - j) << L) | low_part(low, ef.low_bytes + ef.high_bytes, j, L);
      if (x >= n || (j > 0 && x <= prev)) {
        corrupt(name, fmt::format("coded index {} at position {} is out of range (numel {}) or not above its "
                                  "predecessor {}",
                                  x, j, n, prev));
      }
      out[j++] = prev = x;
    }
  }
  if (j != count) corrupt(name, fmt::format("high section has {} one bits, count is {}", j, count));
  // The low section's padding bits (after count x L) must be zero.
  const uint64_t low_bits_used = count * L;
  if (low_bits_used % 8 != 0 && (low[low_bits_used / 8] >> (low_bits_used % 8)) != 0) {
    corrupt(name, "padding bits after the low section are not zero");
  }
}

SparseView validate_sparse(CompressorId id, std::span<const uint8_t> payload, int64_t n, const char* who) {
  if (n < 0) throw InvalidArgument(fmt::format("{}: numel {} < 0", who, n));
  const char* name = compressor_name(id);
  const uint64_t un = static_cast<uint64_t>(n);
  const PayloadHeader h = read_header(payload, id, un);

  // Flags: only known bits, one value type, and the raw index width n implies.
  if ((h.flags & ~kSparseKnownFlags) != 0) {
    corrupt(name, fmt::format("unknown flag bits {:#06x}", h.flags & ~kSparseKnownFlags));
  }
  const bool fp16 = (h.flags & kSparseFlagFp16Values) != 0;
  const bool bf16 = (h.flags & kSparseFlagBf16Values) != 0;
  if (fp16 && bf16) corrupt(name, "both fp16 and bf16 values flagged");
  const bool u64_flag = (h.flags & kSparseFlagU64Indices) != 0;
  if (u64_flag != (un >= kSparseU32Limit)) {
    corrupt(name, fmt::format("{}-bit indices flagged for numel {}", u64_flag ? 64 : 32, n));
  }
  const bool coded = (h.flags & kSparseFlagCodedIndices) != 0;
  const ValueType values = fp16 ? ValueType::kFp16 : bf16 ? ValueType::kBf16 : ValueType::kFp32;

  // Count: strictly increasing indices below n allow at most n of them; the byte count
  // must then be exact. Bound the count by the bytes first (every entry takes at least
  // its value's bytes), so the layout arithmetic cannot wrap for a count of 2^40 or 2^63.
  const uint64_t count = static_cast<uint64_t>(h.param0) | (static_cast<uint64_t>(h.param1) << 32);
  const size_t body = payload.size() - PayloadHeader::kBytes;
  if (count > un || count > body / sparse_value_bytes(values)) {
    corrupt(name, fmt::format("count {} of numel {} does not fit a body of {} bytes", count, n, body));
  }
  const SparseLayout lay = sparse_layout(un, count, values, coded);
  if (lay.total != payload.size()) {
    corrupt(name, fmt::format("count {} of numel {} ({} indices, {} values) needs {} bytes, payload has {}", count, n,
                              coded ? "coded" : "raw", values == ValueType::kFp32 ? "fp32" : "16-bit", lay.total,
                              payload.size()));
  }

  SparseView v;
  v.val = payload.data() + lay.values_offset;
  v.values = values;
  const uint8_t* idx = payload.data() + lay.indices_offset;
  if (coded) {
    decode_coded(name, idx, payload.data() + lay.high_offset, lay.ef, count, un, v.indices);
    return v;
  }
  v.indices.resize(count);
  uint64_t prev = 0;
  for (uint64_t j = 0; j < count; ++j) {
    const uint64_t i = lay.index_bytes == 8 ? load<uint64_t>(idx + j * 8) : load<uint32_t>(idx + j * 4);
    if (i >= un || (j > 0 && i <= prev)) {
      corrupt(name, fmt::format("index {} at position {} is out of range (numel {}) or not above its predecessor {}",
                                i, j, n, prev));
    }
    v.indices[j] = prev = i;
  }
  return v;
}

}  // namespace

// Scattered reads and writes of lines no pass has touched lately (about one line an
// entry at k = 1 %): each line is asked for this many entries ahead, so misses overlap.
constexpr size_t kPrefetchAhead = 24;

void keep_sparse_rounding(float* residual, std::span<const uint64_t> indices, const float* values, ValueType type) {
  const size_t ahead = indices.size() > kPrefetchAhead ? indices.size() - kPrefetchAhead : 0;
  for (size_t j = 0; j < indices.size(); ++j) {
    if (j < ahead) __builtin_prefetch(residual + indices[j + kPrefetchAhead], 1);
    residual[indices[j]] = sparse_rounding_residual(values[j], sparse_round(values[j], type));
  }
}

SparseVector decode_sparse(CompressorId id, std::span<const uint8_t> payload, int64_t n) {
  SparseView v = validate_sparse(id, payload, n, "decode_sparse");
  SparseVector out;
  out.values.resize(v.count());
  for (uint64_t j = 0; j < v.count(); ++j) out.values[j] = v.value(j);
  out.indices = std::move(v.indices);
  return out;
}

void decode_add_sparse(CompressorId id, std::span<const uint8_t> payload, int64_t n, float* out) {
  const SparseView v = validate_sparse(id, payload, n, "decode_add_sparse");
  for (uint64_t j = 0; j < v.count(); ++j) out[v.indices[j]] += v.value(j);  // only now is `out` written
}

void decode_sum_sparse(CompressorId id, std::span<const std::span<const uint8_t>> payloads, int64_t n, float* out,
                       int64_t divisor, SparseOutput output) {
  std::vector<SparseView> views;
  views.reserve(payloads.size());
  for (size_t i = 0; i < payloads.size(); ++i) {
    try {
      views.push_back(validate_sparse(id, payloads[i], n, "decode_sum_sparse"));
    } catch (const CorruptPayload& e) {
      throw CorruptPayload(fmt::format("payload {} of {}: {}", i, payloads.size(), e.what()));
    }
  }
  // Tile by tile: zero the tile (it stays in cache), then each payload in order adds
  // its entries that fall inside. Every element gets +0.0f, then its values in
  // payload order: the arithmetic of zeroing `out` and calling decode_add_sparse
  // per payload, with one write of the output instead of a fill plus a scattered
  // read-modify-write of every line the payloads touch.
  // A zeroed output (kZeroed) skips the fill: only the lines the payloads touch are
  // read and written. The average then divides only the elements some payload
  // touched, each once (`divided` marks them): every other element is +0.0, and
  // +0.0 / d is +0.0, so the result is bit for bit the whole tile's division.
  constexpr int64_t kTile = 16384;  // 64 KiB of fp32
  const bool zeroed = output == SparseOutput::kZeroed;
  const auto d = static_cast<float>(divisor);
  std::vector<uint64_t> next(views.size(), 0);  // each payload's first entry not yet added
  std::vector<uint64_t> first(views.size(), 0);  // ... and not yet divided (kZeroed)
  std::vector<uint64_t> divided(zeroed && divisor > 1 ? kTile / 64 : 0);
  for (int64_t begin = 0; begin < n; begin += kTile) {
    const int64_t end = std::min(n, begin + kTile);
    if (!zeroed) std::fill(out + begin, out + end, 0.0f);
    const auto tile_end = static_cast<uint64_t>(end);
    bool touched = false;
    for (size_t p = 0; p < views.size(); ++p) {
      const SparseView& v = views[p];
      uint64_t j = first[p] = next[p];
      const uint64_t* idx = v.indices.data();
      const uint64_t ahead = v.count() > kPrefetchAhead ? v.count() - kPrefetchAhead : 0;
      for (uint64_t i; j < v.count() && (i = idx[j]) < tile_end; ++j) {
        if (j < ahead) __builtin_prefetch(out + idx[j + kPrefetchAhead], 1);
        out[i] += v.value(j);
      }
      touched |= j != first[p];
      next[p] = j;
    }
    if (divisor <= 1) continue;
    if (!zeroed) {  // the average, while the tile is in cache: the same x / d as a pass after
      for (int64_t i = begin; i < end; ++i) out[i] = out[i] / d;
      continue;
    }
    if (!touched) continue;
    const auto base = static_cast<uint64_t>(begin);
    for (size_t p = 0; p < views.size(); ++p) {
      for (uint64_t j = first[p]; j < next[p]; ++j) {
        const uint64_t i = views[p].indices[j], t = i - base;
        const uint64_t bit = uint64_t{1} << (t % 64);
        if ((divided[t / 64] & bit) != 0) continue;
        divided[t / 64] |= bit;
        out[i] = out[i] / d;
      }
    }
    std::fill(divided.begin(), divided.end(), 0);
  }
}

}  // namespace gradcomm::detail
