// make_dense_codec, and the argument and payload checks every dense codec shares.
#include <fmt/format.h>

#include <cstdint>
#include <limits>

#include "compressors/codec.h"
#include "compressors/quantize/dense_util.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {

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

std::unique_ptr<DenseCodec> make_dense_codec(const CompressorSpec& spec) {
  const char* name = compressor_name(spec.id);
  auto check_bucket = [&] {
    // The bucket travels in the header's u32 param1.
    if (spec.bucket < 1 || spec.bucket > std::numeric_limits<uint32_t>::max()) {
      throw InvalidArgument(fmt::format("{}: bucket={} outside [1, 2^32 - 1]", name, spec.bucket));
    }
  };
  switch (spec.id) {
    case CompressorId::kFp16:
    case CompressorId::kBf16:
      return make_cast_codec(spec.id);
    case CompressorId::kQuant:
      check_bucket();
      if (spec.bits != 1 && spec.bits != 2 && spec.bits != 4 && spec.bits != 8) {
        throw InvalidArgument(fmt::format("quant: bits={} (accepted: 1, 2, 4, 8)", spec.bits));
      }
      return make_quant_codec(spec.bits, spec.bucket, spec.round);
    case CompressorId::kQsgd:
      check_bucket();
      // Levels must be exact in fp32 and fit the 25-bit codes of bitpack.h.
      if (spec.levels < 1 || spec.levels >= (1 << 24)) {
        throw InvalidArgument(fmt::format("qsgd: levels={} outside [1, 2^24 - 1]", spec.levels));
      }
      return make_qsgd_codec(spec.levels, spec.bucket);
    case CompressorId::kSign:
      check_bucket();
      return make_sign_codec(spec.bucket);
    default:
      throw InvalidArgument(
          fmt::format("make_dense_codec: {} is not a dense codec (accepted: fp16, bf16, quant, qsgd, sign)", name));
  }
}

}  // namespace gradcomm::detail
