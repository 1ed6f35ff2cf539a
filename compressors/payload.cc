#include "compressors/payload.h"

#include <fmt/format.h>

#include "gradcomm/errors.h"

namespace gradcomm::detail {

void write_header(const PayloadHeader& h, uint8_t* out) {
  const uint32_t magic = PayloadHeader::kMagic;
  std::memcpy(out + 0, &magic, 4);
  out[4] = PayloadHeader::kVersion;
  out[5] = static_cast<uint8_t>(h.id);
  std::memcpy(out + 6, &h.flags, 2);
  std::memcpy(out + 8, &h.numel, 8);
  std::memcpy(out + 16, &h.param0, 4);
  std::memcpy(out + 20, &h.param1, 4);
}

PayloadHeader read_header(std::span<const uint8_t> payload, CompressorId id, uint64_t numel) {
  if (payload.size() < PayloadHeader::kBytes) {
    throw CorruptPayload(fmt::format("{} payload: {} bytes, shorter than its {}-byte header", compressor_name(id),
                                     payload.size(), PayloadHeader::kBytes));
  }
  const uint8_t* p = payload.data();
  uint32_t magic;
  std::memcpy(&magic, p, 4);
  if (magic != PayloadHeader::kMagic) {
    throw CorruptPayload(fmt::format("{} payload: bad magic {:#010x}", compressor_name(id), magic));
  }
  if (p[4] != PayloadHeader::kVersion) {
    throw CorruptPayload(fmt::format("{} payload: format version {} (this build reads {})", compressor_name(id), p[4],
                                     PayloadHeader::kVersion));
  }
  PayloadHeader h;
  h.id = static_cast<CompressorId>(p[5]);
  if (h.id != id) {
    throw CorruptPayload(fmt::format("{} payload (id {}) where {} (id {}) was expected", compressor_name(h.id), p[5],
                                     compressor_name(id), static_cast<int>(id)));
  }
  std::memcpy(&h.flags, p + 6, 2);
  std::memcpy(&h.numel, p + 8, 8);
  std::memcpy(&h.param0, p + 16, 4);
  std::memcpy(&h.param1, p + 20, 4);
  if (h.numel != numel) {
    throw CorruptPayload(
        fmt::format("{} payload describes {} elements where {} were expected", compressor_name(id), h.numel, numel));
  }
  return h;
}

const uint8_t* PayloadReader::take(size_t size) {
  if (size > bytes_.size() - offset_) {
    throw CorruptPayload(fmt::format("{}: truncated at byte {} ({} bytes needed, {} left)", what_, offset_, size,
                                     bytes_.size() - offset_));
  }
  const uint8_t* p = bytes_.data() + offset_;
  offset_ += size;
  return p;
}

void PayloadReader::expect_end() const {
  if (offset_ != bytes_.size()) {
    throw CorruptPayload(fmt::format("{}: {} unexpected trailing bytes", what_, bytes_.size() - offset_));
  }
}

}  // namespace gradcomm::detail
