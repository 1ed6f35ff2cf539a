// Sparse payloads: index/value pairs of an n-element vector (codec.h:
// encode_sparse / decode_add_sparse), shared by topk, randomk and sketch.
//
//   header (24 bytes, payload.h): id = the caller's compressor, numel = n,
//     flags bit0 = u64 indices (set iff n >= 2^32), bit1 = fp16 values, others 0,
//     param0 = count & 0xFFFFFFFF, param1 = count >> 32
//   indices: count x (u32 | u64), strictly increasing, each < n
//   values:  count x (fp32 | fp16)
//
// The payload is exactly 24 + count * (index bytes + value bytes) long. Full
// layout: FORMAT_sparse.md. decode_add_sparse validates the whole payload before
// touching `out`, so a corrupt payload leaves the output as it was.
#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "compressors/codec.h"
#include "compressors/payload.h"
#include "gradcomm/errors.h"
#include "half.h"

namespace gradcomm::detail {
namespace {

constexpr uint16_t kFlagU64Indices = 1u << 0;
constexpr uint16_t kFlagFp16Values = 1u << 1;
constexpr uint16_t kKnownFlags = kFlagU64Indices | kFlagFp16Values;
constexpr uint64_t kU32Limit = uint64_t{1} << 32;

// Section widths implied by n and the value type.
struct Layout {
  size_t index_bytes;
  size_t value_bytes;
};

Layout layout_for(uint64_t n, bool fp16) { return Layout{n >= kU32Limit ? 8u : 4u, fp16 ? 2u : 4u}; }

template <class T>
inline T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline uint64_t load_index(const uint8_t* p, size_t width) {
  return width == 8 ? load<uint64_t>(p) : load<uint32_t>(p);
}

}  // namespace

std::vector<uint8_t> encode_sparse(CompressorId id, int64_t n, const SparseVector& v, ValueType values) {
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
  const bool fp16 = values == ValueType::kFp16;
  const Layout lay = layout_for(un, fp16);
  const uint64_t count = v.indices.size();

  PayloadHeader h;
  h.id = id;
  h.numel = un;
  h.flags = static_cast<uint16_t>((lay.index_bytes == 8 ? kFlagU64Indices : 0) | (fp16 ? kFlagFp16Values : 0));
  h.param0 = static_cast<uint32_t>(count);
  h.param1 = static_cast<uint32_t>(count >> 32);

  std::vector<uint8_t> out(PayloadHeader::kBytes + count * (lay.index_bytes + lay.value_bytes));
  write_header(h, out.data());
  if (count == 0) return out;  // (memcpy from an empty vector's null data() is UB)
  uint8_t* idx = out.data() + PayloadHeader::kBytes;
  uint8_t* val = idx + count * lay.index_bytes;
  if (lay.index_bytes == 8) {
    std::memcpy(idx, v.indices.data(), count * 8);
  } else {
    for (uint64_t j = 0; j < count; ++j) {
      const auto i32 = static_cast<uint32_t>(v.indices[j]);
      std::memcpy(idx + j * 4, &i32, 4);
    }
  }
  if (fp16) {
    for (uint64_t j = 0; j < count; ++j) {
      const uint16_t hv = float_to_half(v.values[j]);
      std::memcpy(val + j * 2, &hv, 2);
    }
  } else {
    std::memcpy(val, v.values.data(), count * 4);
  }
  return out;
}

namespace {

// A payload that passed validation: `count` entries, indices strictly increasing
// and below n.
struct SparseView {
  uint64_t count = 0;
  const uint8_t* idx = nullptr;
  const uint8_t* val = nullptr;
  size_t index_bytes = 4;
  bool fp16 = false;

  uint64_t index(uint64_t j) const { return load_index(idx + j * index_bytes, index_bytes); }
  float value(uint64_t j) const { return fp16 ? half_to_float(load<uint16_t>(val + j * 2)) : load<float>(val + j * 4); }
};

SparseView validate_sparse(CompressorId id, std::span<const uint8_t> payload, int64_t n, const char* who) {
  if (n < 0) throw InvalidArgument(fmt::format("{}: numel {} < 0", who, n));
  const char* name = compressor_name(id);
  const uint64_t un = static_cast<uint64_t>(n);
  const PayloadHeader h = read_header(payload, id, un);

  // Flags: only known bits, and the index width must be the one n implies.
  if ((h.flags & ~kKnownFlags) != 0) {
    throw CorruptPayload(fmt::format("{} sparse payload: unknown flag bits {:#06x}", name, h.flags & ~kKnownFlags));
  }
  const bool u64_flag = (h.flags & kFlagU64Indices) != 0;
  if (u64_flag != (un >= kU32Limit)) {
    throw CorruptPayload(fmt::format("{} sparse payload: {}-bit indices flagged for numel {}", name,
                                     u64_flag ? 64 : 32, n));
  }
  const Layout lay = layout_for(un, (h.flags & kFlagFp16Values) != 0);

  // Count: strictly increasing indices below n allow at most n of them; the byte
  // count must then be exact. Divide rather than multiply so a huge count (2^40,
  // 2^63) cannot wrap the size arithmetic.
  const uint64_t count = static_cast<uint64_t>(h.param0) | (static_cast<uint64_t>(h.param1) << 32);
  const size_t body = payload.size() - PayloadHeader::kBytes;
  const size_t per = lay.index_bytes + lay.value_bytes;
  if (count > un || count > body / per || count * per != body) {
    throw CorruptPayload(fmt::format("{} sparse payload: count {} of numel {} needs {}-byte entries, body has {} bytes",
                                     name, count, n, per, body));
  }

  SparseView v;
  v.count = count;
  v.idx = payload.data() + PayloadHeader::kBytes;
  v.val = v.idx + count * lay.index_bytes;
  v.index_bytes = lay.index_bytes;
  v.fp16 = lay.value_bytes == 2;
  // Every index < n and above its predecessor.
  uint64_t prev = 0;
  for (uint64_t j = 0; j < count; ++j) {
    const uint64_t i = v.index(j);
    if (i >= un || (j > 0 && i <= prev)) {
      throw CorruptPayload(fmt::format("{} sparse payload: index {} at position {} is out of range (numel {}) or "
                                       "not above its predecessor {}",
                                       name, i, j, n, prev));
    }
    prev = i;
  }
  return v;
}

}  // namespace

void decode_add_sparse(CompressorId id, std::span<const uint8_t> payload, int64_t n, float* out) {
  const SparseView v = validate_sparse(id, payload, n, "decode_add_sparse");
  for (uint64_t j = 0; j < v.count; ++j) out[v.index(j)] += v.value(j);  // only now is `out` written
}

void decode_sum_sparse(CompressorId id, std::span<const std::span<const uint8_t>> payloads, int64_t n, float* out,
                       int64_t divisor) {
  std::vector<SparseView> views;
  views.reserve(payloads.size());
  for (const auto& p : payloads) views.push_back(validate_sparse(id, p, n, "decode_sum_sparse"));
  // Tile by tile: zero the tile (it stays in cache), then each payload in order adds
  // its entries that fall inside. Every element gets +0.0f, then its values in
  // payload order: the arithmetic of zeroing `out` and calling decode_add_sparse
  // per payload, with one write of the output instead of a fill plus a scattered
  // read-modify-write of every line the payloads touch.
  constexpr int64_t kTile = 16384;  // 64 KiB of fp32
  std::vector<uint64_t> next(views.size(), 0);  // each payload's first entry not yet added
  for (int64_t begin = 0; begin < n; begin += kTile) {
    const int64_t end = std::min(n, begin + kTile);
    std::fill(out + begin, out + end, 0.0f);
    const auto tile_end = static_cast<uint64_t>(end);
    for (size_t p = 0; p < views.size(); ++p) {
      const SparseView& v = views[p];
      uint64_t j = next[p];
      for (uint64_t i; j < v.count && (i = v.index(j)) < tile_end; ++j) out[i] += v.value(j);
      next[p] = j;
    }
    if (divisor > 1) {  // the average, while the tile is in cache: the same x / d as a pass after
      const auto d = static_cast<float>(divisor);
      for (int64_t i = begin; i < end; ++i) out[i] = out[i] / d;
    }
  }
}

}  // namespace gradcomm::detail
