// The fixed header every compressed payload starts with, and bounds-checked
// little-endian readers/writers for the sections after it. Full layout of each
// compressor's payload: compressors/FORMAT.md.
//
//   magic u32 'GCP1' | version u8 | compressor id u8 | flags u16 | numel u64 |
//   param0 u32 | param1 u32                                  (24 bytes)
//
// Decoders treat payloads as untrusted: read_header checks magic, version, id and
// numel against what the caller expects, and Reader refuses to read past the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "compressors/compressor_id.h"

namespace gradcomm::detail {

struct PayloadHeader {
  static constexpr uint32_t kMagic = 0x31504347;  // "GCP1"
  static constexpr uint8_t kVersion = 1;
  static constexpr size_t kBytes = 24;

  CompressorId id = CompressorId::kNone;
  uint16_t flags = 0;
  uint64_t numel = 0;   // elements this payload describes
  uint32_t param0 = 0;  // compressor-specific (FORMAT.md)
  uint32_t param1 = 0;
};

void write_header(const PayloadHeader& header, uint8_t* out);
// CorruptPayload unless the bytes hold a header of `id` for exactly `numel` elements.
PayloadHeader read_header(std::span<const uint8_t> payload, CompressorId id, uint64_t numel);

// Sequential bounds-checked reader over an untrusted payload.
class PayloadReader {
 public:
  PayloadReader(std::span<const uint8_t> bytes, const char* what) : bytes_(bytes), what_(what) {}
  // Pointer to the next `size` bytes; CorruptPayload if fewer remain.
  const uint8_t* take(size_t size);
  template <class T>
  T get() {
    T value;
    std::memcpy(&value, take(sizeof value), sizeof value);
    return value;
  }
  size_t remaining() const { return bytes_.size() - offset_; }
  // CorruptPayload if anything is left over.
  void expect_end() const;

 private:
  std::span<const uint8_t> bytes_;
  const char* what_;
  size_t offset_ = 0;
};

}  // namespace gradcomm::detail
