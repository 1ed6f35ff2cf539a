// qsgd:levels=s,bucket=B — QSGD (Alistarh et al., NeurIPS 2017): per bucket the L2
// norm; each element becomes a sign bit and a level in 0..s drawn so that
// E[level] = |x| / norm * s, hence E[decode] = x.
//
// Payload (FORMAT.md, "qsgd (id 5)"): header (param0 = s, param1 = bucket), then per
// bucket the norm as fp32, then n codes of 1 + ceil(log2(s + 1)) bits, each
// level | sign << (bits - 1). Decode: +-(level * (norm / s)). A bucket whose fp32
// norm is not finite (a NaN or infinity in it, or squares summing past fp32 range)
// stores NaN and decodes to NaN.
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

// The code loop, apart so that the compiler sees unaliased arrays and vectorizes it.
void qsgd_codes(const float* __restrict x, const float* __restrict u, size_t m, float scale, float levels,
                unsigned bits, uint32_t* __restrict codes) {
  for (size_t k = 0; k < m; ++k) codes[k] = qsgd_code(x[k], round_stochastic(qsgd_position(x[k], scale, levels), u[k]), bits);
}

// Two passes per bucket: the squared norm (lane_sum order), then levels. kAvx2: the
// loops of dense_simd.h instead of the scalar ones, same bytes.
template <unsigned kBits, bool kAvx2>
void encode_run(const float* in, int64_t n, int64_t bucket, uint32_t levels, unsigned bits, uint8_t* scales,
                uint8_t* codes_out, const PhiloxStream& rng, int64_t first) {
  const float levels_f = static_cast<float>(levels);
  CodeWriter<kBits> writer(codes_out, bits, kAvx2 ? &pack_codes_avx2 : nullptr);
  uint32_t codes[kDenseChunk];
  float uniforms[kDenseChunk + kUniformSlack];
  for (int64_t start = 0; start < n; start += bucket) {
    const size_t m = static_cast<size_t>(std::min(bucket, n - start));
    const float* x = in + start;
    const float squares = kAvx2 ? sum_squares_avx2(x, m) : lane_sum(x, m, [](float v) { return mul_rn(v, v); });
    float norm = sqrt_rn(squares);
    if (!is_finite(norm)) norm = bits_float(kCanonicalNanBits);
    store_f32(scales, norm);
    scales += 4;
    const float scale = qsgd_scale(norm, levels);
    for (size_t c = 0; c < m; c += kDenseChunk) {
      const size_t cm = std::min(kDenseChunk, m - c);
      const float* xc = x + c;
      const float* u = fill_uniforms(rng, static_cast<uint64_t>(first + start) + c, cm, uniforms);
      if constexpr (kAvx2) {
        qsgd_codes_avx2(xc, u, cm, scale, levels_f, bits, codes);
      } else {
        qsgd_codes(xc, u, cm, scale, levels_f, bits, codes);
      }
      writer.put(codes, cm);
    }
  }
  writer.finish();
}

// encode_run on the path use_avx2_kernels() picks once per call.
template <unsigned kBits>
void encode_width(const float* in, int64_t n, int64_t bucket, uint32_t levels, unsigned bits, uint8_t* scales,
                  uint8_t* codes_out, const PhiloxStream& rng, int64_t first) {
  if (use_avx2_kernels()) return encode_run<kBits, true>(in, n, bucket, levels, bits, scales, codes_out, rng, first);
  encode_run<kBits, false>(in, n, bucket, levels, bits, scales, codes_out, rng, first);
}

// Whether qsgd's AVX2 decoder (dense_simd.h) takes codes of this width on this CPU.
bool avx2_decode(unsigned bits) { return bits <= kMaxAvx2DecodeBits && use_avx2_kernels(); }

// Checks every level is <= s (a b-bit field can hold up to 2^(b-1) - 1), before the
// decoder writes anything. Skipped when s + 1 is a power of two: every field is valid.
template <unsigned kBits>
bool levels_in_range(const uint8_t* packed, int64_t n, uint32_t levels, unsigned bits) {
  const uint32_t level_mask = (1u << (bits - 1)) - 1u;
  if (avx2_decode(bits)) {
    return max_level_avx2(CodeStream{packed, static_cast<uint64_t>(n), bits}, level_mask) <= levels;
  }
  CodeReader<kBits> reader(packed, static_cast<uint64_t>(n), bits);
  uint32_t codes[kDenseChunk];
  uint32_t worst = 0;
  for (int64_t start = 0; start < n; start += static_cast<int64_t>(kDenseChunk)) {
    const size_t cm = static_cast<size_t>(std::min<int64_t>(kDenseChunk, n - start));
    reader.get(codes, cm);
    for (size_t k = 0; k < cm; ++k) worst = std::max(worst, codes[k] & level_mask);
  }
  return worst <= levels;
}

// Decodes one run, bucket by bucket: the per-bucket unit here, the elements through
// qsgd_decode_avx2 or the scalar loop (avx2_decode, read once per call).
template <unsigned kBits, DecodeStore kStore>
void decode_run(const uint8_t* scales, const uint8_t* packed, int64_t n, int64_t bucket, uint32_t levels,
                unsigned bits, float scale, float* out) {
  const bool avx2 = avx2_decode(bits);
  const CodeStream stream{packed, static_cast<uint64_t>(n), bits};
  CodeReader<kBits> reader(packed, static_cast<uint64_t>(n), bits);
  uint32_t codes[kDenseChunk];
  for (int64_t start = 0; start < n; start += bucket) {
    const size_t m = static_cast<size_t>(std::min(bucket, n - start));
    const float unit = qsgd_unit(load_f32(scales), levels);
    scales += 4;
    float* y = out + start;
    if (avx2) {
      qsgd_decode_avx2(stream, static_cast<uint64_t>(start), m, unit, kStore, scale, y);
      continue;
    }
    for (size_t c = 0; c < m; c += kDenseChunk) {
      const size_t cm = std::min(kDenseChunk, m - c);
      reader.get(codes, cm);
      for (size_t k = 0; k < cm; ++k) {
        const float v = qsgd_value(codes[k], unit, bits);
        store_value<kStore>(y[c + k], v, scale);
      }
    }
  }
}

class QsgdCodec final : public BucketCodec<QsgdCodec> {
 public:
  QsgdCodec(int levels, int64_t bucket)
      : BucketCodec(bucket), levels_(static_cast<uint32_t>(levels)), bits_(qsgd_code_bits(levels_)) {}

  size_t encoded_bytes(int64_t n) const override {
    check_dense_numel("qsgd", n);
    return PayloadHeader::kBytes + scale_bytes(n) + packed_code_bytes(static_cast<uint64_t>(n), bits_);
  }

  void encode(const float* in, int64_t n, uint8_t* out, const PhiloxStream& rng, int64_t first) const override {
    check_dense_encode("qsgd", n, first, bucket_);
    PayloadHeader h;
    h.id = CompressorId::kQsgd;
    h.numel = static_cast<uint64_t>(n);
    h.param0 = levels_;
    h.param1 = static_cast<uint32_t>(bucket_);
    write_header(h, out);
    uint8_t* scales = out + PayloadHeader::kBytes;
    uint8_t* codes = scales + scale_bytes(n);
    // Compile-time widths for the common small level counts (s <= 127).
    switch (bits_) {
      case 2: return encode_width<2>(in, n, bucket_, levels_, bits_, scales, codes, rng, first);
      case 3: return encode_width<3>(in, n, bucket_, levels_, bits_, scales, codes, rng, first);
      case 4: return encode_width<4>(in, n, bucket_, levels_, bits_, scales, codes, rng, first);
      case 5: return encode_width<5>(in, n, bucket_, levels_, bits_, scales, codes, rng, first);
      case 6: return encode_width<6>(in, n, bucket_, levels_, bits_, scales, codes, rng, first);
      case 7: return encode_width<7>(in, n, bucket_, levels_, bits_, scales, codes, rng, first);
      case 8: return encode_width<8>(in, n, bucket_, levels_, bits_, scales, codes, rng, first);
      default: return encode_width<0>(in, n, bucket_, levels_, bits_, scales, codes, rng, first);
    }
  }

 private:
  friend class BucketCodec<QsgdCodec>;

  size_t scale_bytes(int64_t n) const { return 4 * static_cast<size_t>(bucket_count(n, bucket_)); }

  template <unsigned kBits, DecodeStore kStore>
  void validate_and_decode(const DenseSections& s, int64_t n, float* out, float scale) const {
    if (((levels_ + 1) & levels_) != 0 && !levels_in_range<kBits>(s.codes, n, levels_, bits_)) {
      throw CorruptPayload(fmt::format("qsgd payload: a level above s = {}", levels_));
    }
    decode_run<kBits, kStore>(s.scales, s.codes, n, bucket_, levels_, bits_, scale, out);
  }

  template <DecodeStore kStore>
  void decode_impl(std::span<const uint8_t> payload, int64_t n, float* out, float scale) const {
    check_dense_numel("qsgd", n);  // before any size is computed from n
    const DenseSections s =
        read_dense_sections(payload, CompressorId::kQsgd, n, levels_, static_cast<uint32_t>(bucket_), scale_bytes(n),
                            packed_code_bytes(static_cast<uint64_t>(n), bits_), static_cast<uint64_t>(n) * bits_);
    // An encoder writes a finite norm >= 0, or NaN for a poisoned bucket.
    const int64_t buckets = bucket_count(n, bucket_);
    for (int64_t b = 0; b < buckets; ++b) {
      const float norm = load_f32(s.scales + 4 * b);
      if (!is_nan(norm) && !(is_finite(norm) && norm >= 0.0f)) {
        throw CorruptPayload(fmt::format("qsgd payload: bucket {} has norm {}", b, norm));
      }
    }
    switch (bits_) {
      case 2: return validate_and_decode<2, kStore>(s, n, out, scale);
      case 3: return validate_and_decode<3, kStore>(s, n, out, scale);
      case 4: return validate_and_decode<4, kStore>(s, n, out, scale);
      case 5: return validate_and_decode<5, kStore>(s, n, out, scale);
      case 6: return validate_and_decode<6, kStore>(s, n, out, scale);
      case 7: return validate_and_decode<7, kStore>(s, n, out, scale);
      case 8: return validate_and_decode<8, kStore>(s, n, out, scale);
      default: return validate_and_decode<0, kStore>(s, n, out, scale);
    }
  }

  uint32_t levels_;
  unsigned bits_;
};

}  // namespace

std::unique_ptr<DenseCodec> make_qsgd_codec(int levels, int64_t bucket) {
  return std::make_unique<QsgdCodec>(levels, bucket);
}

}  // namespace gradcomm::detail
