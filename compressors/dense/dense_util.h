// CPU helpers shared by the bucketed dense codecs (quant, qsgd, sign): argument
// checks, batched Philox uniforms, the bucket reductions in the order dense_math.h
// fixes, and the payload framing every decoder validates before writing anything.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>

#include "compressors/codec.h"
#include "compressors/payload.h"
#include "compressors/philox.h"
#include "compressors/dense/dense_math.h"
#include "reduce.h"  // exact_reciprocal_f32

namespace gradcomm::detail {

// How a decoder stores each value v at y: y = v (decode), y += v (decode_add), or
// y = v * scale (decode_average over a power-of-two divisor d: scale = 1/d exactly,
// so v * scale is v / d bit for bit). The decoders' one difference.
enum class DecodeStore { kSet, kAdd, kScale };

template <DecodeStore kStore>
inline void store_value(float& y, float v, float scale) {
  if constexpr (kStore == DecodeStore::kAdd) {
    y += v;
  } else if constexpr (kStore == DecodeStore::kScale) {
    y = v * scale;
  } else {
    y = v;
  }
}

// The codecs with per-bucket scales (quant, qsgd, sign): decode, decode_add and
// decode_average forward to Derived::decode_impl<kStore>(payload, n, out, scale), and
// ring segments align to the bucket.
template <class Derived>
class BucketCodec : public DenseCodec {
 public:
  explicit BucketCodec(int64_t bucket) : bucket_(bucket) {}
  void decode(std::span<const uint8_t> payload, int64_t n, float* out) const final {
    derived().template decode_impl<DecodeStore::kSet>(payload, n, out, 1.0f);
  }
  void decode_add(std::span<const uint8_t> payload, int64_t n, float* out) const final {
    derived().template decode_impl<DecodeStore::kAdd>(payload, n, out, 1.0f);
  }
  void decode_average(std::span<const uint8_t> payload, int64_t n, float* out, int64_t divisor) const final {
    if (float inverse; exact_reciprocal_f32(divisor, inverse)) {
      derived().template decode_impl<DecodeStore::kScale>(payload, n, out, inverse);
    } else {
      DenseCodec::decode_average(payload, n, out, divisor);
    }
  }
  int64_t alignment() const final { return bucket_; }

 protected:
  const int64_t bucket_;  // elements per scale

 private:
  const Derived& derived() const { return static_cast<const Derived&>(*this); }
};

// Elements an encoder or decoder handles per inner chunk: codes and uniforms for one
// chunk live on the stack (8 KiB), so nothing is allocated per call.
constexpr size_t kDenseChunk = 1024;

// Largest n a dense payload may describe: keeps n * bits and the section sizes far
// from overflow (2^48 elements is a petabyte of fp32).
constexpr int64_t kMaxDenseNumel = int64_t{1} << 48;

// InvalidArgument unless 0 <= n <= kMaxDenseNumel.
void check_dense_numel(const char* codec, int64_t n);
// InvalidArgument unless n is valid and first >= 0 is a multiple of alignment.
void check_dense_encode(const char* codec, int64_t n, int64_t first, int64_t alignment);

inline int64_t bucket_count(int64_t n, int64_t bucket) { return (n + bucket - 1) / bucket; }

inline void store_f32(uint8_t* out, float v) { std::memcpy(out, &v, 4); }
inline float load_f32(const uint8_t* in) {
  float v;
  std::memcpy(&v, in, 4);
  return v;
}

// u[k] = philox_uniform16(rng, pos + k) for k in [0, count), computing each Philox
// block once for its eight elements (philox.h: element i is in block i / 8).
// `scratch` holds count + kUniformSlack floats; returns the pointer u (inside scratch).
constexpr size_t kUniformSlack = 16;
inline const float* fill_uniforms(const PhiloxStream& rng, uint64_t pos, size_t count, float* scratch) {
  philox_uniform16_blocks(rng, pos / 8, (pos % 8 + count + 7) / 8, scratch);
  return scratch + pos % 8;
}

// Sum of f(x[j]) over a bucket in the lane order of dense_math.h (kSumLanes lanes,
// element j into lane j % 8, then combine_lanes). Written as 8 independent lane
// accumulators so the compiler keeps them in two vector registers.
template <class F>
inline float lane_sum(const float* x, size_t m, F f) {
  float lane[kSumLanes] = {};
  size_t j = 0;
  for (; j + kSumLanes <= m; j += kSumLanes) {
    for (int l = 0; l < kSumLanes; ++l) lane[l] = add_rn(lane[l], f(x[j + l]));
  }
  for (int l = 0; j + l < m; ++l) lane[l] = add_rn(lane[l], f(x[j + l]));
  return combine_lanes(lane);
}

// Min and max of a bucket, and whether every element is finite. They are taken on
// order keys (dense_math.h), integers that order floats as their values do with -0
// below +0, so the result is unique (no first-of-equals choice between -0 and +0)
// and the loop is a plain integer min/max reduction the compiler vectorizes. The
// extremes matter only when every element is finite (otherwise the bucket is poisoned).
struct BucketRange {
  float lo, hi;
  bool finite;
};
inline BucketRange bucket_range(const float* __restrict x, size_t m) {
  int32_t lo = INT32_MAX, hi = INT32_MIN;
  uint32_t bad = 0;
  for (size_t j = 0; j < m; ++j) {
    const int32_t key = float_order_key(x[j]);
    lo = key < lo ? key : lo;
    hi = key > hi ? key : hi;
    bad |= (float_bits(x[j]) & 0x7FFFFFFFu) >= 0x7F800000u ? 1u : 0u;
  }
  return BucketRange{order_key_float(lo), order_key_float(hi), bad == 0};
}

// The sections of a validated payload: everything after the header, with the
// exact length the spec requires for n elements.
struct DenseSections {
  const uint8_t* scales;  // scale_bytes bytes
  const uint8_t* codes;   // code_bytes bytes
};
// CorruptPayload unless `payload` is a header of `id` for n elements with the given
// params and flags 0, followed by exactly scale_bytes + code_bytes bytes, the bits
// past the last of `code_bits_total` code bits zero.
DenseSections read_dense_sections(std::span<const uint8_t> payload, CompressorId id, int64_t n, uint32_t param0,
                                  uint32_t param1, size_t scale_bytes, size_t code_bytes, uint64_t code_bits_total);

// Buckets travel in the header's u32 param1; a spec takes at most int32's range.
constexpr int64_t kMaxBucket = INT32_MAX;
// InvalidArgument naming the family unless bucket is in [1, 2^32 - 1].
void check_bucket(const char* family, int64_t bucket);

}  // namespace gradcomm::detail
