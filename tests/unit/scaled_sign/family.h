// scaled_sign: the worked example of docs/adding-a-compressor.md, a whole compressor
// family in one folder. Each element travels as its sign; each bucket of `bucket`
// elements as one fp32 scale, the mean |x| over the bucket, so the decoded bucket
// keeps its L1 norm (the scaled sign of EF-signSGD). It is a DenseCodec with fixed-size
// payloads, so the engines run it over the compressed ring with error feedback,
// warm-up, min_numel and fusion as for any codec-ring family, and need no change.
//
// The shipped `sign` family (compressors/sign/) is this idea made fast: packed
// kernels, the CUDA codec, non-finite buckets poisoned. This one is written for
// reading. Payload: the 24-byte header (id 200, param1 = bucket), then an
// fp32 scale per bucket (little-endian), then one bit per element, LSB first, set
// where the element is >= 0, the bits past the last element zero.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "compressors/codec.h"
#include "compressors/family.h"
#include "compressors/payload.h"
#include "compressors/spec.h"
#include "gradcomm/errors.h"

namespace gradcomm::example {

using detail::CompressorId;
using detail::CompressorSpec;

constexpr auto kScaledSignId = static_cast<CompressorId>(200);  // an id no built-in uses
constexpr int64_t kMaxBucket = int64_t{1} << 20;

class ScaledSignCodec final : public detail::DenseCodec {
 public:
  explicit ScaledSignCodec(int64_t bucket) : bucket_(bucket) {}

  size_t encoded_bytes(int64_t n) const override {
    return detail::PayloadHeader::kBytes + static_cast<size_t>(buckets(n)) * sizeof(float) + bit_bytes(n);
  }

  void encode(const float* in, int64_t n, uint8_t* out, const detail::PhiloxStream&, int64_t first) const override {
    // Buckets count from the tensor's element 0, so a ring segment starts on a bucket.
    if (n < 0 || first < 0 || first % bucket_ != 0) {
      throw InvalidArgument(fmt::format("scaled_sign: run of {} at element {} (bucket {})", n, first, bucket_));
    }
    detail::PayloadHeader header;
    header.id = kScaledSignId;
    header.numel = static_cast<uint64_t>(n);
    header.param1 = static_cast<uint32_t>(bucket_);
    detail::write_header(header, out);
    uint8_t* scales = out + detail::PayloadHeader::kBytes;
    uint8_t* bits = scales + buckets(n) * sizeof(float);
    for (int64_t b = 0; b < buckets(n); ++b) {
      const int64_t lo = b * bucket_, hi = std::min(n, lo + bucket_);
      double sum = 0;
      for (int64_t i = lo; i < hi; ++i) sum += std::fabs(in[i]);
      const float scale = static_cast<float>(sum / static_cast<double>(hi - lo));
      std::memcpy(scales + b * sizeof(float), &scale, sizeof scale);
    }
    std::fill(bits, bits + bit_bytes(n), uint8_t{0});
    for (int64_t i = 0; i < n; ++i) {
      if (in[i] >= 0.0f) bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    }
  }

  void decode(std::span<const uint8_t> payload, int64_t n, float* out) const override { decode(payload, n, out, false); }
  void decode_add(std::span<const uint8_t> payload, int64_t n, float* out) const override {
    decode(payload, n, out, true);
  }
  int64_t alignment() const override { return bucket_; }

 private:
  int64_t buckets(int64_t n) const { return (n + bucket_ - 1) / bucket_; }
  static size_t bit_bytes(int64_t n) { return static_cast<size_t>((n + 7) / 8); }

  // Payloads are untrusted: the header, the exact length and the padding are checked
  // before anything is written.
  void decode(std::span<const uint8_t> payload, int64_t n, float* out, bool add) const {
    const detail::PayloadHeader h = detail::read_header(payload, kScaledSignId, static_cast<uint64_t>(n));
    if (h.flags != 0 || h.param0 != 0 || h.param1 != static_cast<uint32_t>(bucket_)) {
      throw CorruptPayload(fmt::format("scaled_sign payload: bucket {} where this codec writes {}", h.param1, bucket_));
    }
    detail::PayloadReader reader(payload.subspan(detail::PayloadHeader::kBytes), "scaled_sign payload");
    const uint8_t* scales = reader.take(static_cast<size_t>(buckets(n)) * sizeof(float));
    const uint8_t* bits = reader.take(bit_bytes(n));
    reader.expect_end();
    if (n % 8 != 0 && (bits[n / 8] >> (n % 8)) != 0) {
      throw CorruptPayload("scaled_sign payload: padding bits after the last element are not zero");
    }
    for (int64_t i = 0; i < n; ++i) {
      float scale;
      std::memcpy(&scale, scales + (i / bucket_) * sizeof(float), sizeof scale);
      const float v = (bits[i / 8] >> (i % 8)) & 1u ? scale : -scale;
      out[i] = add ? out[i] + v : v;
    }
  }

  int64_t bucket_;
};

// The family: its keys (its own first, then the common ones), how it reads and
// prints them, and its codec.
constexpr std::string_view kScaledSignKeys[] = {"bucket", "ef", "min_numel", "warmup", "seed"};

// The family's own keys: its block of the spec (CompressorSpec::params), which only the
// family reads.
struct ScaledSignParams final : detail::FamilyParams {
  static constexpr const char* kName = "scaled_sign's keys";
  int64_t bucket = 256;
};

inline std::shared_ptr<const detail::FamilyParams> parse_scaled_sign(const detail::SpecReader& reader,
                                                                     CompressorSpec& /*common*/) {
  auto p = std::make_shared<ScaledSignParams>();
  p->bucket = reader.integer("bucket", 1, kMaxBucket, 256);
  return p;
}

inline std::string canonical_scaled_sign(const CompressorSpec& spec) {
  return fmt::format("bucket={},", spec.family<ScaledSignParams>().bucket);
}

inline std::unique_ptr<detail::DenseCodec> make_scaled_sign(const CompressorSpec& spec) {
  return std::make_unique<ScaledSignCodec>(spec.family<ScaledSignParams>().bucket);
}

constexpr detail::Family kScaledSignFamily{.id = kScaledSignId,
                                           .name = "scaled_sign",
                                           .keys = kScaledSignKeys,
                                           .ef_default = true,  // sign compression needs error feedback
                                           .values_default = detail::ValueType::kFp32,
                                           .collective = detail::Collective::kCodecRing,
                                           .parse = parse_scaled_sign,
                                           .canonical = canonical_scaled_sign,
                                           .make_codec = make_scaled_sign};

}  // namespace gradcomm::example
