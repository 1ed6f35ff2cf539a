// fp16 and bf16: every value narrowed to 16 bits with base/half.h (round to nearest
// even; NaN stays NaN; past the largest finite becomes infinity) and widened back
// exactly. Payload (FORMAT.md, "fp16 (id 1), bf16 (id 2)"): header (param0 = param1 =
// 0, flags 0), then n little-endian u16. No buckets, so any run boundary works:
// alignment 1.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "compressors/cast/cast.h"
#include "compressors/dense/dense_util.h"
#include "gradcomm/errors.h"
#include "half.h"
#include "half_bulk.h"

namespace gradcomm::detail {
namespace {

static_assert(std::endian::native == std::endian::little, "payload values are little-endian u16");

// Each format narrows and widens a run (at most kDenseChunk values) at a time.
struct Fp16 {  // F16C where the CPU has it (half_bulk.h), the same bits as half.h
  static constexpr CompressorId kId = CompressorId::kFp16;
  static void narrow(const float* in, uint16_t* out, size_t m) { floats_to_halves(in, out, m); }
  template <DecodeStore kStore>
  static void widen(const uint16_t* in, float* out, size_t m) {
    halves_to_floats(in, out, m, kStore == DecodeStore::kAdd);
  }
};
struct Bf16 {  // a rounding add and a shift: plain loops the compiler handles
  static constexpr CompressorId kId = CompressorId::kBf16;
  static void narrow(const float* in, uint16_t* out, size_t m) {
    for (size_t k = 0; k < m; ++k) out[k] = float_to_bf16(in[k]);
  }
  template <DecodeStore kStore>
  static void widen(const uint16_t* in, float* out, size_t m) {
    for (size_t k = 0; k < m; ++k) store_value<kStore>(out[k], bf16_to_float(in[k]), 1.0f);
  }
};

template <class Format>
class CastCodec final : public DenseCodec {
 public:
  size_t encoded_bytes(int64_t n) const override {
    check_dense_numel(name(), n);
    return PayloadHeader::kBytes + 2 * static_cast<size_t>(n);
  }

  void encode(const float* in, int64_t n, uint8_t* out, const PhiloxStream&, int64_t first) const override {
    check_dense_encode(name(), n, first, 1);
    PayloadHeader h;
    h.id = Format::kId;
    h.numel = static_cast<uint64_t>(n);
    write_header(h, out);
    // Narrow a chunk into an aligned buffer, then one memcpy: the payload itself may
    // be unaligned, and a plain loop into the buffer is what the compiler vectorizes.
    uint8_t* values = out + PayloadHeader::kBytes;
    uint16_t chunk[kDenseChunk];
    for (int64_t start = 0; start < n; start += static_cast<int64_t>(kDenseChunk)) {
      const size_t m = static_cast<size_t>(std::min<int64_t>(kDenseChunk, n - start));
      Format::narrow(in + start, chunk, m);
      std::memcpy(values + 2 * start, chunk, 2 * m);
    }
  }

  void decode(std::span<const uint8_t> payload, int64_t n, float* out) const override {
    decode_impl<DecodeStore::kSet>(payload, n, out, 1);
  }
  void decode_add(std::span<const uint8_t> payload, int64_t n, float* out) const override {
    decode_impl<DecodeStore::kAdd>(payload, n, out, 1);
  }
  // Each run divided while it is still in L1 (divide_inplace itself, so any divisor).
  void decode_average(std::span<const uint8_t> payload, int64_t n, float* out, int64_t divisor) const override {
    if (divisor < 1) return DenseCodec::decode_average(payload, n, out, divisor);  // refuses it
    decode_impl<DecodeStore::kSet>(payload, n, out, divisor);
  }

  int64_t alignment() const override { return 1; }

 private:
  static const char* name() { return compressor_name(Format::kId); }

  template <DecodeStore kStore>
  void decode_impl(std::span<const uint8_t> payload, int64_t n, float* out, int64_t divisor) const {
    // Every 16-bit pattern is a valid value, so only the framing can be wrong.
    const DenseSections s = read_dense_sections(payload, Format::kId, n, 0, 0, 0, 2 * static_cast<size_t>(n), 0);
    uint16_t chunk[kDenseChunk];
    for (int64_t start = 0; start < n; start += static_cast<int64_t>(kDenseChunk)) {
      const size_t m = static_cast<size_t>(std::min<int64_t>(kDenseChunk, n - start));
      std::memcpy(chunk, s.codes + 2 * start, 2 * m);
      Format::template widen<kStore>(chunk, out + start, m);
      if (divisor > 1) divide_inplace(out + start, static_cast<int64_t>(m), DType::kFloat32, divisor);
    }
  }
};

}  // namespace

std::unique_ptr<DenseCodec> make_cast_codec(CompressorId id) {
  if (id == CompressorId::kFp16) return std::make_unique<CastCodec<Fp16>>();
  if (id == CompressorId::kBf16) return std::make_unique<CastCodec<Bf16>>();
  throw InvalidArgument(fmt::format("make_cast_codec: {} is not a cast", compressor_name(id)));
}

}  // namespace gradcomm::detail
