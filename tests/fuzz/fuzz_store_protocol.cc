// The TCP store's frame parsers (store/tcp_store_protocol.h), which the server
// runs on every client's bytes and the client on the server's, on arbitrary bytes.
//
// Input: kind u8 | body. kind % 5 picks the parser:
//   0 parse_request_header (server side): max_key_bytes u64 | max_value_bytes u64 |
//     header (16 bytes). A limit of 0xFF..FF in the input means the StoreLimits
//     default, so the common case is common. Verdict vs an independent check; an
//     accepted header's frame size must be exactly header + key + value (no wrap).
//   1 parse_counter (server side, ADD on a stored value): the body is the stored
//     text. Value vs an independent decimal parser; the value's own text parses back.
//   2 parse_greeting (client side): the body is the greeting.
//   3 parse_welcome (client side): the body is the welcome.
//   4 parse_response_header (client side): max_value_bytes u64 | header (16 bytes).
// Refusal messages must be one printable line of bounded length.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "store/store.h"
#include "store/tcp_store_protocol.h"

namespace wire = gradcomm::detail::store_wire;
using gradcomm::fuzz::ByteReader;
using gradcomm::fuzz::put;

namespace {

void check_line(const std::string& text, const char* what) {
  GRADCOMM_FUZZ_CHECK(!text.empty() && text.size() < 512, "%s of %zu bytes", what, text.size());
  for (unsigned char c : text) GRADCOMM_FUZZ_CHECK(c >= 0x20 && c <= 0x7E, "%s holds byte 0x%02x", what, c);
}

uint64_t limit_or_default(uint64_t v, uint64_t fallback) { return v == ~uint64_t{0} ? fallback : v; }

void fuzz_request(ByteReader in) {
  const gradcomm::detail::StoreLimits defaults;
  const uint64_t max_key = limit_or_default(in.take<uint64_t>(), defaults.max_key_bytes);
  const uint64_t max_value = limit_or_default(in.take<uint64_t>(), defaults.max_value_bytes);
  const std::vector<uint8_t> header(in.rest(), in.rest() + std::min<size_t>(in.remaining(), 24));
  std::string error;
  const auto parsed = wire::parse_request_header(header, max_key, max_value, error);

  // Reference, in 128-bit arithmetic: the frame must also fit 64 bits.
  bool valid = header.size() == wire::kRequestHeaderBytes;
  uint64_t key_len = 0, value_len = 0;
  if (valid) {
    const uint8_t op = header[0];
    std::memcpy(&key_len, header.data() + 4, 4);  // little-endian host (wire.cc asserts it)
    key_len &= 0xFFFFFFFFu;
    std::memcpy(&value_len, header.data() + 8, 8);
    // SET (1) and WILL (5) carry a value; GET (2) and ADD (3) a u64; ERASE_PREFIX (4) nothing.
    valid = op >= 1 && op <= 5 && header[1] == 0 && header[2] == 0 && header[3] == 0 && key_len <= max_key &&
            (op == 1 || op == 5 ? value_len <= max_value : value_len == (op == 4 ? 0u : 8u)) &&
            static_cast<unsigned __int128>(16) + key_len + value_len <= UINT64_MAX;
  }
  GRADCOMM_FUZZ_CHECK(parsed.has_value() == valid, "parse_request_header %s a header the reference %s (%s)",
                      parsed ? "accepted" : "refused", valid ? "accepts" : "refuses", error.c_str());
  if (!parsed) {
    check_line(error, "request error");
    return;
  }
  GRADCOMM_FUZZ_CHECK(static_cast<uint8_t>(parsed->op) == header[0] && parsed->key_len == key_len &&
                          parsed->value_len == value_len,
                      "fields differ from the bytes");
  GRADCOMM_FUZZ_CHECK(static_cast<unsigned __int128>(parsed->frame_bytes()) ==
                          static_cast<unsigned __int128>(16) + key_len + value_len,
                      "frame size wraps");
  GRADCOMM_FUZZ_CHECK(wire::op_name(header[0]) != "unknown", "accepted an opcode without a name");
}

// Independent decimal parser: optional '-', one or more digits, within int64.
std::optional<int64_t> reference_counter(const std::vector<uint8_t>& text) {
  size_t i = 0;
  const bool negative = !text.empty() && text[0] == '-';
  if (negative) ++i;
  if (i == text.size()) return std::nullopt;
  __int128 v = 0;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
    v = v * 10 + (text[i] - '0');
    if (v > (static_cast<__int128>(1) << 63)) return std::nullopt;
  }
  if (negative) v = -v;
  if (v > INT64_MAX || v < INT64_MIN) return std::nullopt;
  return static_cast<int64_t>(v);
}

void fuzz_counter(const std::vector<uint8_t>& text) {
  const auto parsed = wire::parse_counter(text);
  const auto expected = reference_counter(text);
  GRADCOMM_FUZZ_CHECK(parsed == expected, "parse_counter %s, reference %s", parsed ? "accepted" : "refused",
                      expected ? "accepts" : "refuses");
  if (parsed) {
    const std::string canonical = std::to_string(*parsed);
    const auto again = wire::parse_counter(std::vector<uint8_t>(canonical.begin(), canonical.end()));
    GRADCOMM_FUZZ_CHECK(again == parsed, "'%s' does not parse back", canonical.c_str());
  }
}

void fuzz_greeting(const std::vector<uint8_t>& bytes) {
  const auto parsed = wire::parse_greeting(bytes);
  const bool valid = bytes.size() == wire::kGreetingBytes && bytes[0] == 'G' && bytes[1] == 'C' && bytes[2] == 'S' &&
                     bytes[3] == 'T' && bytes[4] == wire::kVersion;
  GRADCOMM_FUZZ_CHECK(parsed.has_value() == valid, "parse_greeting %s, reference %s", parsed ? "accepted" : "refused",
                      valid ? "accepts" : "refuses");
  if (!parsed) return;
  GRADCOMM_FUZZ_CHECK(parsed->auth_required == ((bytes[5] & 1) != 0), "auth flag differs from the bytes");
  GRADCOMM_FUZZ_CHECK(std::memcmp(parsed->nonce.data(), bytes.data() + 8, wire::kNonceBytes) == 0,
                      "nonce differs from the bytes");
}

void fuzz_welcome(const std::vector<uint8_t>& bytes) {
  const auto parsed = wire::parse_welcome(bytes);
  const bool valid = bytes.size() == wire::kWelcomeBytes && bytes[0] == 'G' && bytes[1] == 'C' && bytes[2] == 'S' &&
                     bytes[3] == 'T' && bytes[4] <= 1;
  GRADCOMM_FUZZ_CHECK(parsed.has_value() == valid, "parse_welcome %s, reference %s", parsed ? "accepted" : "refused",
                      valid ? "accepts" : "refuses");
  if (!parsed) return;
  uint64_t max_key, max_value;
  std::memcpy(&max_key, bytes.data() + 8, 8);
  std::memcpy(&max_value, bytes.data() + 16, 8);
  GRADCOMM_FUZZ_CHECK(static_cast<uint8_t>(parsed->verdict) == bytes[4] && parsed->max_key_bytes == max_key &&
                          parsed->max_value_bytes == max_value,
                      "welcome fields differ from the bytes");
}

void fuzz_response(ByteReader in) {
  const uint64_t max_value = limit_or_default(in.take<uint64_t>(), gradcomm::detail::StoreLimits{}.max_value_bytes);
  const std::vector<uint8_t> header(in.rest(), in.rest() + std::min<size_t>(in.remaining(), 24));
  std::string error;
  const auto parsed = wire::parse_response_header(header, max_value, error);
  bool valid = header.size() == wire::kResponseHeaderBytes;
  uint64_t length = 0;
  if (valid) {
    std::memcpy(&length, header.data() + 8, 8);
    const uint8_t status = header[0];
    valid = (status == 0 && length <= std::max<uint64_t>(max_value, 8)) ||
            (status == 2 && length <= wire::kMaxErrorBytes) || (status == 1 && length == 0);
  }
  GRADCOMM_FUZZ_CHECK(parsed.has_value() == valid, "parse_response_header %s, reference %s (%s)",
                      parsed ? "accepted" : "refused", valid ? "accepts" : "refuses", error.c_str());
  if (!parsed) {
    check_line(error, "response error");
    return;
  }
  GRADCOMM_FUZZ_CHECK(static_cast<uint8_t>(parsed->status) == header[0] && parsed->value_len == length,
                      "response fields differ from the bytes");
}

std::vector<uint8_t> request(uint8_t op, uint32_t key_len, uint64_t value_len) {
  std::vector<uint8_t> out(wire::kRequestHeaderBytes, 0);
  out[0] = op;
  wire::put_u32(out.data() + 4, key_len);
  wire::put_u64(out.data() + 8, value_len);
  return out;
}

std::vector<uint8_t> with_limits(uint8_t kind, std::vector<uint64_t> limits, const std::vector<uint8_t>& body) {
  std::vector<uint8_t> out{kind};
  for (uint64_t l : limits) put(out, l);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

}  // namespace

void write_seeds(gradcomm::fuzz::SeedWriter& seeds) {
  const uint64_t kDefault = ~uint64_t{0};
  seeds.add("request_set", with_limits(0, {kDefault, kDefault}, request(1, 12, 300)));
  seeds.add("request_get", with_limits(0, {kDefault, kDefault}, request(2, 5, 8)));
  seeds.add("request_add", with_limits(0, {kDefault, kDefault}, request(3, 1024, 8)));
  seeds.add("request_key_over", with_limits(0, {kDefault, kDefault}, request(2, 1025, 8)));
  seeds.add("request_value_over", with_limits(0, {16, 1 << 20}, request(1, 4, (1 << 20) + 1)));
  seeds.add("request_huge_limits", with_limits(0, {~uint64_t{1}, ~uint64_t{1}}, request(1, 0xFFFFFFFF, ~uint64_t{0})));
  auto reserved = request(1, 3, 3);
  reserved[2] = 1;
  seeds.add("request_reserved", with_limits(0, {kDefault, kDefault}, reserved));
  seeds.add("request_opcode_4", with_limits(0, {kDefault, kDefault}, request(4, 3, 8)));
  seeds.add("request_erase_prefix", with_limits(0, {kDefault, kDefault}, request(4, 12, 0)));
  seeds.add("request_will", with_limits(0, {kDefault, kDefault}, request(5, 18, 300)));
  seeds.add("request_opcode_6", with_limits(0, {kDefault, kDefault}, request(6, 3, 8)));
  int i = 0;
  for (const char* text : {"0", "-12", "9223372036854775807", "-9223372036854775808", "9223372036854775808", "+3",
                           " 4", "12a", "-", ""}) {
    std::vector<uint8_t> body{1};
    body.insert(body.end(), text, text + std::strlen(text));
    seeds.add("counter_" + std::to_string(i++), body);
  }
  std::vector<uint8_t> greeting(wire::kGreetingBytes, 0);
  wire::put_u32(greeting.data(), wire::kMagic);
  greeting[4] = wire::kVersion;
  greeting[5] = wire::kFlagAuthRequired;
  for (size_t b = 0; b < wire::kNonceBytes; ++b) greeting[8 + b] = static_cast<uint8_t>(b * 7);
  greeting.insert(greeting.begin(), 2);
  seeds.add("greeting_auth", greeting);
  greeting[5] = 2;  // version 2
  seeds.add("greeting_v2", greeting);
  std::vector<uint8_t> welcome(wire::kWelcomeBytes, 0);
  wire::put_u32(welcome.data(), wire::kMagic);
  wire::put_u64(welcome.data() + 8, 1024);
  wire::put_u64(welcome.data() + 16, 1 << 20);
  welcome.insert(welcome.begin(), 3);
  seeds.add("welcome_accepted", welcome);
  welcome[5] = 1;
  seeds.add("welcome_refused", welcome);
  auto response = [](uint8_t status, uint64_t length) {
    std::vector<uint8_t> out(wire::kResponseHeaderBytes, 0);
    out[0] = status;
    wire::put_u64(out.data() + 8, length);
    return out;
  };
  seeds.add("response_ok", with_limits(4, {kDefault}, response(0, 100)));
  seeds.add("response_add", with_limits(4, {0}, response(0, 8)));
  seeds.add("response_error_long", with_limits(4, {kDefault}, response(2, 4097)));
  seeds.add("response_timeout", with_limits(4, {kDefault}, response(1, 0)));
  seeds.add("response_status_3", with_limits(4, {kDefault}, response(3, 0)));
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const uint8_t kind = in.take<uint8_t>();
  const std::vector<uint8_t> body(in.rest(), in.rest() + in.remaining());  // exact-size heap copy
  switch (kind % 5) {
    case 0: fuzz_request(in); break;
    case 1: fuzz_counter(body); break;
    case 2: fuzz_greeting(body); break;
    case 3: fuzz_welcome(body); break;
    default: fuzz_response(in); break;
  }
  return 0;
}
