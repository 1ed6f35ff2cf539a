// Parsers of the TCP store's frame headers (declared, with the layout, in
// tcp_store_protocol.h). Everything here reads bytes another process wrote: the
// server parses clients' requests, the client parses the server's greeting,
// welcome and responses. Lengths are checked against the limits before anyone
// reads or allocates a body.
#include "store/tcp_store_protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

namespace gradcomm::detail::store_wire {

std::string_view op_name(uint8_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kSet: return "SET";
    case Op::kGet: return "GET";
    case Op::kAdd: return "ADD";
    case Op::kErasePrefix: return "ERASE_PREFIX";
    case Op::kWill: return "WILL";
  }
  return "unknown";
}

std::optional<RequestHeader> parse_request_header(std::span<const uint8_t> header, uint64_t max_key_bytes,
                                                  uint64_t max_value_bytes, std::string& error) {
  if (header.size() != kRequestHeaderBytes) {
    error = fmt::format("request header of {} bytes, expected {}", header.size(), kRequestHeaderBytes);
    return std::nullopt;
  }
  const uint8_t* h = header.data();
  const uint8_t op = h[0];
  if (h[1] != 0 || h[2] != 0 || h[3] != 0 || op < 1 || op > 5) {
    error = fmt::format("bad request header (opcode {}, reserved {:02x}{:02x}{:02x}; expected opcode 1..5, "
                        "reserved 0)",
                        op, h[1], h[2], h[3]);
    return std::nullopt;
  }
  RequestHeader out;
  out.op = static_cast<Op>(op);
  out.key_len = get_u32(h + 4);
  out.value_len = get_u64(h + 8);
  if (out.key_len > max_key_bytes) {
    error = fmt::format("{} key of {} bytes exceeds max_key_bytes={}", op_name(op), out.key_len, max_key_bytes);
    return std::nullopt;
  }
  // SET and WILL carry a value; GET's wait and ADD's delta are one u64; ERASE_PREFIX has none.
  const bool free_size = out.op == Op::kSet || out.op == Op::kWill;
  const uint64_t fixed = out.op == Op::kErasePrefix ? 0 : 8;
  if (free_size ? out.value_len > max_value_bytes : out.value_len != fixed) {
    error = fmt::format("{} value of {} bytes (expected {})", op_name(op), out.value_len,
                        free_size ? fmt::format("<= max_value_bytes={}", max_value_bytes) : std::to_string(fixed));
    return std::nullopt;
  }
  // Whatever limits the server was given, the frame size must not wrap.
  if (out.value_len > UINT64_MAX - kRequestHeaderBytes - out.key_len) {
    error = fmt::format("{} frame of {} + {} + {} bytes does not fit 64 bits", op_name(op), kRequestHeaderBytes,
                        out.key_len, out.value_len);
    return std::nullopt;
  }
  return out;
}

std::optional<int64_t> parse_counter(std::span<const uint8_t> text) {
  if (text.empty()) return std::nullopt;
  const char* first = reinterpret_cast<const char*>(text.data());
  const char* last = first + text.size();
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(first, last, value);
  if (ec != std::errc() || end != last) return std::nullopt;
  return value;
}

std::optional<Greeting> parse_greeting(std::span<const uint8_t> bytes) {
  if (bytes.size() != kGreetingBytes || get_u32(bytes.data()) != kMagic || bytes[4] != kVersion) return std::nullopt;
  Greeting out;
  out.auth_required = (bytes[5] & kFlagAuthRequired) != 0;
  std::copy_n(bytes.data() + 8, kNonceBytes, out.nonce.begin());
  return out;
}

std::optional<Welcome> parse_welcome(std::span<const uint8_t> bytes) {
  if (bytes.size() != kWelcomeBytes || get_u32(bytes.data()) != kMagic) return std::nullopt;
  if (bytes[4] != static_cast<uint8_t>(Verdict::kAccepted) && bytes[4] != static_cast<uint8_t>(Verdict::kRefused)) {
    return std::nullopt;
  }
  Welcome out;
  out.verdict = static_cast<Verdict>(bytes[4]);
  out.max_key_bytes = get_u64(bytes.data() + 8);
  out.max_value_bytes = get_u64(bytes.data() + 16);
  return out;
}

uint64_t response_value_limit(Status status, uint64_t max_value_bytes) {
  switch (status) {
    case Status::kOk: return std::max<uint64_t>(max_value_bytes, 8);
    case Status::kError: return kMaxErrorBytes;
    case Status::kTimeout: return 0;
  }
  return 0;
}

std::optional<ResponseHeader> parse_response_header(std::span<const uint8_t> header, uint64_t max_value_bytes,
                                                    std::string& error) {
  if (header.size() != kResponseHeaderBytes) {
    error = fmt::format("response header of {} bytes, expected {}", header.size(), kResponseHeaderBytes);
    return std::nullopt;
  }
  const uint8_t status = header[0];
  const uint64_t length = get_u64(header.data() + 8);
  const uint64_t limit = status <= 2 ? response_value_limit(static_cast<Status>(status), max_value_bytes) : 0;
  if (status > 2 || length > limit) {
    error = fmt::format("malformed reply (status {}, {} bytes; expected status 0..2 and at most {} bytes)", status,
                        length, limit);
    return std::nullopt;
  }
  return ResponseHeader{static_cast<Status>(status), length};
}

}  // namespace gradcomm::detail::store_wire
