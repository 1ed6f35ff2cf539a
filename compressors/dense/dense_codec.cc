// make_dense_codec (through the family, family.h), the argument and payload checks every dense codec
// shares, and DenseCodec::decode_average's plain form.
#include <fmt/format.h>

#include <cstdint>
#include <limits>

#include "compressors/codec.h"
#include "compressors/family.h"
#include "compressors/dense/dense_util.h"
#include "compressors/spec.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {

void DenseCodec::decode_average(std::span<const uint8_t> payload, int64_t n, float* out, int64_t divisor) const {
  if (divisor < 1) throw InvalidArgument(fmt::format("decode_average: divisor {} < 1", divisor));
  decode(payload, n, out);
  if (divisor > 1) divide_inplace(out, n, DType::kFloat32, divisor);
}

void DenseCodec::encode_with_values(const float* in, int64_t n, uint8_t* out, const PhiloxStream& rng, int64_t first,
                                    float* values, int64_t divisor) const {
  if (divisor < 1) throw InvalidArgument(fmt::format("encode_with_values: divisor {} < 1", divisor));
  encode(in, n, out, rng, first);
  decode_average(std::span<const uint8_t>(out, encoded_bytes(n)), n, values, divisor);
}

void check_dense_numel(const char* codec, int64_t n) {
  if (n < 0 || n > kMaxDenseNumel) {
    throw InvalidArgument(fmt::format("{} codec: element count {} outside [0, 2^48]", codec, n));
  }
}

void check_dense_encode(const char* codec, int64_t n, int64_t first, int64_t alignment) {
  check_dense_numel(codec, n);
  if (first < 0 || first % alignment != 0) {
    throw InvalidArgument(
        fmt::format("{} codec: run starts at element {}, which is not a multiple of the alignment {}", codec, first,
                    alignment));
  }
}

DenseSections read_dense_sections(std::span<const uint8_t> payload, CompressorId id, int64_t n, uint32_t param0,
                                  uint32_t param1, size_t scale_bytes, size_t code_bytes, uint64_t code_bits_total) {
  const char* name = compressor_name(id);
  check_dense_numel(name, n);
  const PayloadHeader h = read_header(payload, id, static_cast<uint64_t>(n));
  if (h.flags != 0 || h.param0 != param0 || h.param1 != param1) {
    throw CorruptPayload(fmt::format("{} payload: flags {} params ({}, {}) where this codec writes 0 ({}, {})", name,
                                     h.flags, h.param0, h.param1, param0, param1));
  }
  PayloadReader reader(payload.subspan(PayloadHeader::kBytes), name);
  DenseSections s;
  s.scales = reader.take(scale_bytes);
  s.codes = reader.take(code_bytes);
  reader.expect_end();
  const unsigned used = static_cast<unsigned>(code_bits_total % 8);
  if (used != 0 && (s.codes[code_bytes - 1] >> used) != 0) {
    throw CorruptPayload(fmt::format("{} payload: padding bits after the last code are not zero", name));
  }
  return s;
}

void check_bucket(const char* family, int64_t bucket) {
  if (bucket < 1 || bucket > std::numeric_limits<uint32_t>::max()) {
    throw InvalidArgument(fmt::format("{}: bucket={} outside [1, 2^32 - 1]", family, bucket));
  }
}

std::unique_ptr<DenseCodec> make_dense_codec(const CompressorSpec& spec) {
  const Family& family = family_of(spec.id);
  if (family.make_codec == nullptr) {
    std::string dense;
    for (const Family* f : registered_families()) {
      if (f->make_codec != nullptr) dense += fmt::format("{}{}", dense.empty() ? "" : ", ", f->name);
    }
    throw InvalidArgument(fmt::format("make_dense_codec: {} is not a dense codec (accepted: {})", family.name, dense));
  }
  return family.make_codec(spec);
}

}  // namespace gradcomm::detail
