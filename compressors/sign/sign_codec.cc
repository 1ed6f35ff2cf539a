// sign:bucket=B — scaled signSGD (EF-SignSGD, Karimireddy et al., ICML 2019): one
// bit per element plus a per-bucket scale, the mean |x| of the bucket, so that the
// decoded bucket has the same l1 norm as the input.
//
// Payload (FORMAT.md, "sign (id 7)"): header (param0 = 0, param1 = bucket), then per
// bucket the scale as fp32, then n sign bits packed LSB first (1 = sign bit set: negative,
// -0.0 included). Decode: +-scale. A bucket whose scale is not finite (a NaN or an
// infinity in it, or |x| summing past fp32 range) stores NaN and decodes to NaN.
#include <fmt/format.h>

#include <algorithm>

#include "compressors/cpu_kernels.h"
#include "compressors/dense/bitpack.h"
#include "compressors/dense/dense_simd.h"
#include "compressors/dense/dense_util.h"
#include "compressors/sign/sign.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

class SignCodec final : public BucketCodec<SignCodec> {
 public:
  explicit SignCodec(int64_t bucket) : BucketCodec(bucket) {}

  size_t encoded_bytes(int64_t n) const override {
    check_dense_numel("sign", n);
    return PayloadHeader::kBytes + scale_bytes(n) + packed_code_bytes(static_cast<uint64_t>(n), 1);
  }

  void encode(const float* in, int64_t n, uint8_t* out, const PhiloxStream&, int64_t first) const override {
    check_dense_encode("sign", n, first, bucket_);
    PayloadHeader h;
    h.id = CompressorId::kSign;
    h.numel = static_cast<uint64_t>(n);
    h.param1 = static_cast<uint32_t>(bucket_);
    write_header(h, out);
    uint8_t* scales = out + PayloadHeader::kBytes;
    CodeWriter<1> writer(scales + scale_bytes(n), 1);
    uint32_t bits[kDenseChunk];
    // Two passes per bucket: mean |x| (lane_sum order), then the sign bits.
    for (int64_t start = 0; start < n; start += bucket_) {
      const size_t m = static_cast<size_t>(std::min(bucket_, n - start));
      const float* x = in + start;
      const float sum = lane_sum(x, m, [](float v) { return bits_float(float_bits(v) & 0x7FFFFFFFu); });
      float scale = sum / static_cast<float>(m);
      if (!is_finite(scale)) scale = bits_float(kCanonicalNanBits);
      store_f32(scales, scale);
      scales += 4;
      for (size_t c = 0; c < m; c += kDenseChunk) {
        const size_t cm = std::min(kDenseChunk, m - c);
        for (size_t k = 0; k < cm; ++k) bits[k] = sign_bit(x[c + k]);
        writer.put(bits, cm);
      }
    }
    writer.finish();
  }

 private:
  friend class BucketCodec<SignCodec>;

  size_t scale_bytes(int64_t n) const { return 4 * static_cast<size_t>(bucket_count(n, bucket_)); }

  template <DecodeStore kStore>
  void decode_impl(std::span<const uint8_t> payload, int64_t n, float* out, float out_scale) const {
    check_dense_numel("sign", n);  // before any size is computed from n
    const DenseSections s =
        read_dense_sections(payload, CompressorId::kSign, n, 0, static_cast<uint32_t>(bucket_), scale_bytes(n),
                            packed_code_bytes(static_cast<uint64_t>(n), 1), static_cast<uint64_t>(n));
    // An encoder writes a finite scale >= 0, or NaN for a poisoned bucket.
    const int64_t buckets = bucket_count(n, bucket_);
    for (int64_t b = 0; b < buckets; ++b) {
      const float scale = load_f32(s.scales + 4 * b);
      if (!is_nan(scale) && !(is_finite(scale) && scale >= 0.0f)) {
        throw CorruptPayload(fmt::format("sign payload: bucket {} has scale {}", b, scale));
      }
    }
    // Bucket by bucket, the elements through sign_decode_avx2 (dense/dense_simd.h)
    // or the scalar loop, on the path use_avx2_kernels() picks once per call.
    const bool avx2 = use_avx2_kernels();
    const CodeStream stream{s.codes, static_cast<uint64_t>(n), 1};
    CodeReader<1> reader(s.codes, static_cast<uint64_t>(n), 1);
    uint32_t bits[kDenseChunk];
    for (int64_t start = 0; start < n; start += bucket_) {
      const size_t m = static_cast<size_t>(std::min(bucket_, n - start));
      const float scale = load_f32(s.scales + 4 * (start / bucket_));
      float* y = out + start;
      if (avx2) {
        sign_decode_avx2(stream, static_cast<uint64_t>(start), m, scale, kStore, out_scale, y);
        continue;
      }
      for (size_t c = 0; c < m; c += kDenseChunk) {
        const size_t cm = std::min(kDenseChunk, m - c);
        reader.get(bits, cm);
        for (size_t k = 0; k < cm; ++k) {
          const float v = sign_value(scale, bits[k]);
          store_value<kStore>(y[c + k], v, out_scale);
        }
      }
    }
  }

};

}  // namespace

std::unique_ptr<DenseCodec> make_sign_codec(int64_t bucket) { return std::make_unique<SignCodec>(bucket); }

}  // namespace gradcomm::detail
