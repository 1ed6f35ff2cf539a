#include "transport/ucx/ucx_wire.h"

#include <algorithm>

#include "bytes.h"

namespace gradcomm::detail {

std::vector<uint8_t> encode_control(const ControlMessage& message, ControlKind kind, int sender) {
  const size_t text_bytes = std::min(message.text.size(), ControlMessage::kMaxText);
  std::vector<uint8_t> out(kControlHeaderBytes + text_bytes, 0);
  put_u32(out.data(), kControlMagic);
  out[4] = kControlVersion;
  out[5] = static_cast<uint8_t>(message.code);
  out[6] = static_cast<uint8_t>(kind);
  put_u32(out.data() + 8, static_cast<uint32_t>(message.origin));
  put_u32(out.data() + 12, static_cast<uint32_t>(text_bytes));
  put_u32(out.data() + 16, static_cast<uint32_t>(message.seq));
  put_u32(out.data() + 20, static_cast<uint32_t>(message.seq >> 32));
  put_u32(out.data() + 24, static_cast<uint32_t>(sender));
  std::copy_n(message.text.data(), text_bytes, out.data() + kControlHeaderBytes);
  return out;
}

std::optional<ControlFrame> decode_control(std::span<const uint8_t> bytes) {
  if (bytes.size() < kControlHeaderBytes) return std::nullopt;
  if (get_u32(bytes.data()) != kControlMagic || bytes[4] != kControlVersion) return std::nullopt;
  const uint8_t code = bytes[5];
  if (code < static_cast<uint8_t>(ErrorCode::kInvalidArgument) || code > static_cast<uint8_t>(ErrorCode::kCuda)) {
    return std::nullopt;
  }
  if (bytes[6] > static_cast<uint8_t>(kLastControlKind) || bytes[7] != 0) return std::nullopt;
  const uint32_t text_bytes = get_u32(bytes.data() + 12);
  if (text_bytes > ControlMessage::kMaxText || bytes.size() != kControlHeaderBytes + text_bytes) return std::nullopt;
  ControlFrame frame;
  frame.kind = static_cast<ControlKind>(bytes[6]);
  frame.sender = static_cast<int32_t>(get_u32(bytes.data() + 24));
  if (frame.kind != ControlKind::kAbort && text_bytes != 0) return std::nullopt;
  ControlMessage& message = frame.message;
  message.code = static_cast<ErrorCode>(code);
  message.origin = static_cast<int32_t>(get_u32(bytes.data() + 8));
  message.seq = get_u32(bytes.data() + 16) | (static_cast<uint64_t>(get_u32(bytes.data() + 20)) << 32);
  message.text.assign(reinterpret_cast<const char*>(bytes.data() + kControlHeaderBytes), text_bytes);
  return frame;
}

}  // namespace gradcomm::detail
