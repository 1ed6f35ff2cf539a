// quant:bits=b,bucket=B,round=stochastic|nearest — per-bucket min/max uniform
// quantization to 2^b - 1 steps (b in {1, 2, 4, 8}).
//
// Payload (FORMAT.md, "quant (id 6)"): header (param0 = bits, param1 = bucket), then
// per bucket the pair (min, max) as fp32, then the n codes packed `bits` wide.
// Per element: s = clamp((x - min) * inv, 0, L) with inv = L / (max - min), code =
// round(s) (half up, or stochastically with u = philox_uniform16(rng, first + i));
// decode min + code * step with step = (max - min) / L. A bucket holding a NaN or an
// infinity (or whose max - min overflows) stores (NaN, NaN) and decodes to NaN.
#include <fmt/format.h>

#include <algorithm>

#include "compressors/cpu_kernels.h"
#include "compressors/dense/bitpack.h"
#include "compressors/dense/dense_simd.h"
#include "compressors/dense/dense_util.h"
#include "compressors/quantize/quantize.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

// The code loops, apart so that the compiler sees unaliased arrays and vectorizes
// them (the clamps become min/max, the casts cvttps2dq).
template <uint32_t kLevels>
void codes_nearest(const float* __restrict x, size_t m, float lo, float inv, uint32_t* __restrict codes) {
  for (size_t k = 0; k < m; ++k) codes[k] = round_half_up(quant_position(x[k], lo, inv, static_cast<float>(kLevels)));
}
template <uint32_t kLevels>
void codes_stochastic(const float* __restrict x, const float* __restrict u, size_t m, float lo, float inv,
                      uint32_t* __restrict codes) {
  for (size_t k = 0; k < m; ++k) {
    codes[k] = round_stochastic(quant_position(x[k], lo, inv, static_cast<float>(kLevels)), u[k]);
  }
}

// Encodes one run. Two passes per bucket (range, then codes), the bucket still in
// cache for the second; codes stream through `writer` across bucket boundaries.
// kAvx2: the loops of dense_simd.h instead of the scalar ones, same bytes. With
// `values`, each chunk's decoded values (times `scale`, a power of two, when not 1) go
// there right after its codes: what decode_average gives, without reading the payload.
template <unsigned kBits, bool kStochastic, bool kAvx2>
void encode_run(const float* in, int64_t n, int64_t bucket, uint8_t* scales, uint8_t* codes_out,
                const PhiloxStream& rng, int64_t first, float* values, float scale) {
  constexpr uint32_t kLevels = (1u << kBits) - 1u;
  constexpr float kLevelsF = static_cast<float>(kLevels);
  CodeWriter<kBits> writer(codes_out, kBits, kAvx2 ? &pack_codes_avx2 : nullptr);
  uint32_t codes[kDenseChunk];
  float uniforms[kDenseChunk + kUniformSlack];
  for (int64_t start = 0; start < n; start += bucket) {
    const size_t m = static_cast<size_t>(std::min(bucket, n - start));
    const float* x = in + start;
    const BucketRange r = kAvx2 ? bucket_range_avx2(x, m) : bucket_range(x, m);
    float lo = r.lo, hi = r.hi;
    if (!r.finite || !is_finite(add_rn(hi, -lo))) lo = hi = bits_float(kCanonicalNanBits);
    store_f32(scales, lo);
    store_f32(scales + 4, hi);
    scales += 8;
    const float inv = quant_inverse_step(lo, hi, kLevels);
    const float step = quant_step(lo, hi, kLevels);
    const DecodeStore store = scale == 1.0f ? DecodeStore::kSet : DecodeStore::kScale;
    for (size_t c = 0; c < m; c += kDenseChunk) {
      const size_t cm = std::min(kDenseChunk, m - c);
      const float* xc = x + c;
      if constexpr (kStochastic) {
        const float* u = fill_uniforms(rng, static_cast<uint64_t>(first + start) + c, cm, uniforms);
        if constexpr (kAvx2) {
          quant_codes_stochastic_avx2(xc, u, cm, lo, inv, kLevelsF, codes);
        } else {
          codes_stochastic<kLevels>(xc, u, cm, lo, inv, codes);
        }
      } else if constexpr (kAvx2) {
        quant_codes_nearest_avx2(xc, cm, lo, inv, kLevelsF, codes);
      } else {
        codes_nearest<kLevels>(xc, cm, lo, inv, codes);
      }
      writer.put(codes, cm);
      if (values == nullptr) continue;
      float* y = values + start + static_cast<int64_t>(c);
      if constexpr (kAvx2) {
        quant_values_avx2(codes, cm, kBits, lo, step, store, scale, y);
      } else if (store == DecodeStore::kSet) {
        for (size_t k = 0; k < cm; ++k) store_value<DecodeStore::kSet>(y[k], quant_value(lo, step, codes[k]), scale);
      } else {
        for (size_t k = 0; k < cm; ++k) store_value<DecodeStore::kScale>(y[k], quant_value(lo, step, codes[k]), scale);
      }
    }
  }
  writer.finish();
}

// encode_run for a width and rounding known at compile time, on the path
// use_avx2_kernels() picks once per call.
template <unsigned kBits>
void encode_bits(bool stochastic, const float* in, int64_t n, int64_t bucket, uint8_t* scales, uint8_t* codes,
                 const PhiloxStream& rng, int64_t first, float* values, float scale) {
  if (use_avx2_kernels()) {
    return stochastic ? encode_run<kBits, true, true>(in, n, bucket, scales, codes, rng, first, values, scale)
                      : encode_run<kBits, false, true>(in, n, bucket, scales, codes, rng, first, values, scale);
  }
  return stochastic ? encode_run<kBits, true, false>(in, n, bucket, scales, codes, rng, first, values, scale)
                    : encode_run<kBits, false, false>(in, n, bucket, scales, codes, rng, first, values, scale);
}

// Decodes one run, bucket by bucket: the per-bucket step here, the elements through
// quant_decode_avx2 (dense_simd.h) or the scalar loop on the path use_avx2_kernels()
// picks once per call.
template <unsigned kBits, DecodeStore kStore>
void decode_run(const uint8_t* scales, const uint8_t* packed, int64_t n, int64_t bucket, float scale, float* out) {
  constexpr uint32_t kLevels = (1u << kBits) - 1u;
  const bool avx2 = use_avx2_kernels();
  const CodeStream stream{packed, static_cast<uint64_t>(n), kBits};
  CodeReader<kBits> reader(packed, static_cast<uint64_t>(n), kBits);
  uint32_t codes[kDenseChunk];
  for (int64_t start = 0; start < n; start += bucket) {
    const size_t m = static_cast<size_t>(std::min(bucket, n - start));
    const float lo = load_f32(scales), hi = load_f32(scales + 4);
    scales += 8;
    const float step = quant_step(lo, hi, kLevels);
    float* y = out + start;
    if (avx2) {
      quant_decode_avx2(stream, static_cast<uint64_t>(start), m, lo, step, kStore, scale, y);
      continue;
    }
    for (size_t c = 0; c < m; c += kDenseChunk) {
      const size_t cm = std::min(kDenseChunk, m - c);
      reader.get(codes, cm);
      for (size_t k = 0; k < cm; ++k) {
        const float v = quant_value(lo, step, codes[k]);
        store_value<kStore>(y[c + k], v, scale);
      }
    }
  }
}

class QuantCodec final : public BucketCodec<QuantCodec> {
 public:
  QuantCodec(int bits, int64_t bucket, Rounding round) : BucketCodec(bucket), bits_(bits), round_(round) {}

  size_t encoded_bytes(int64_t n) const override {
    check_dense_numel("quant", n);
    return PayloadHeader::kBytes + scale_bytes(n) + packed_code_bytes(static_cast<uint64_t>(n), bits_);
  }

  void encode(const float* in, int64_t n, uint8_t* out, const PhiloxStream& rng, int64_t first) const override {
    encode_impl(in, n, out, rng, first, nullptr, 1.0f);
  }

  void encode_with_values(const float* in, int64_t n, uint8_t* out, const PhiloxStream& rng, int64_t first,
                          float* values, int64_t divisor) const override {
    float scale = 1.0f;
    if (divisor != 1 && !exact_reciprocal_f32(divisor, scale)) {  // (divisor < 1 is refused there)
      return DenseCodec::encode_with_values(in, n, out, rng, first, values, divisor);
    }
    if (values == nullptr && n > 0) throw InvalidArgument("quant codec: encode_with_values needs values");
    encode_impl(in, n, out, rng, first, values, scale);
  }

 private:
  void encode_impl(const float* in, int64_t n, uint8_t* out, const PhiloxStream& rng, int64_t first, float* values,
                   float scale) const {
    check_dense_encode("quant", n, first, bucket_);
    PayloadHeader h;
    h.id = CompressorId::kQuant;
    h.numel = static_cast<uint64_t>(n);
    h.param0 = static_cast<uint32_t>(bits_);
    h.param1 = static_cast<uint32_t>(bucket_);
    write_header(h, out);
    uint8_t* scales = out + PayloadHeader::kBytes;
    uint8_t* codes = scales + scale_bytes(n);
    const bool stochastic = round_ == Rounding::kStochastic;
    switch (bits_) {
      case 1: return encode_bits<1>(stochastic, in, n, bucket_, scales, codes, rng, first, values, scale);
      case 2: return encode_bits<2>(stochastic, in, n, bucket_, scales, codes, rng, first, values, scale);
      case 4: return encode_bits<4>(stochastic, in, n, bucket_, scales, codes, rng, first, values, scale);
      default: return encode_bits<8>(stochastic, in, n, bucket_, scales, codes, rng, first, values, scale);
    }
  }

  friend class BucketCodec<QuantCodec>;

  size_t scale_bytes(int64_t n) const { return 8 * static_cast<size_t>(bucket_count(n, bucket_)); }

  template <DecodeStore kStore>
  void decode_impl(std::span<const uint8_t> payload, int64_t n, float* out, float scale) const {
    check_dense_numel("quant", n);  // before any size is computed from n
    const DenseSections s =
        read_dense_sections(payload, CompressorId::kQuant, n, static_cast<uint32_t>(bits_),
                            static_cast<uint32_t>(bucket_), scale_bytes(n),
                            packed_code_bytes(static_cast<uint64_t>(n), bits_), static_cast<uint64_t>(n) * bits_);
    // Every code is on the grid (b bits hold exactly 0..2^b - 1), so only the
    // scales can be invalid: what an encoder writes is (NaN, NaN) or finite
    // min <= max with a finite range. Checked for all buckets before any write.
    const int64_t buckets = bucket_count(n, bucket_);
    for (int64_t b = 0; b < buckets; ++b) {
      const float lo = load_f32(s.scales + 8 * b), hi = load_f32(s.scales + 8 * b + 4);
      const bool poisoned = is_nan(lo) && is_nan(hi);
      const bool valid = is_finite(lo) && is_finite(hi) && lo <= hi && is_finite(add_rn(hi, -lo));
      if (!poisoned && !valid) {
        throw CorruptPayload(fmt::format("quant payload: bucket {} has min {} and max {}", b, lo, hi));
      }
    }
    switch (bits_) {
      case 1: return decode_run<1, kStore>(s.scales, s.codes, n, bucket_, scale, out);
      case 2: return decode_run<2, kStore>(s.scales, s.codes, n, bucket_, scale, out);
      case 4: return decode_run<4, kStore>(s.scales, s.codes, n, bucket_, scale, out);
      default: return decode_run<8, kStore>(s.scales, s.codes, n, bucket_, scale, out);
    }
  }

  int bits_;
  Rounding round_;
};

}  // namespace

std::unique_ptr<DenseCodec> make_quant_codec(int bits, int64_t bucket, Rounding round) {
  return std::make_unique<QuantCodec>(bits, bucket, round);
}

}  // namespace gradcomm::detail
