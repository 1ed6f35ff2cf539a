// Wire constants of the TCP store, shared by the server (tcp_store_server.cc, where
// the protocol is described in full) and the client (tcp_store_client.cc), and the
// parsers of every fixed-size frame header (tcp_store_protocol.cc).
// All integers are little-endian; every frame has a fixed-size header, so a reader
// always knows how many bytes it still needs and validates lengths before reading
// (let alone allocating) a body.
//
// The parsers are pure functions of the bytes and the limits, so the server and
// the client validate through the same code that tests/fuzz/fuzz_store_protocol.cc
// feeds arbitrary bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "bytes.h"

namespace gradcomm::detail::store_wire {

inline constexpr uint32_t kMagic = 0x54534347;  // bytes "GCST"
inline constexpr uint8_t kVersion = 1;

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // HMAC-SHA256 output

// Server -> client on connect: magic u32, version u8, flags u8, reserved u16 (0), nonce[32].
inline constexpr size_t kGreetingBytes = 8 + kNonceBytes;
inline constexpr uint8_t kFlagAuthRequired = 1;

// Server -> client once the connection may send requests (or was refused):
// magic u32, verdict u8, reserved[3] (0), max_key_bytes u64, max_value_bytes u64.
inline constexpr size_t kWelcomeBytes = 24;
enum class Verdict : uint8_t { kAccepted = 0, kRefused = 1 };

// Client -> server request: opcode u8, reserved[3] (0), key_len u32, value_len u64,
// then key bytes, then value bytes.
inline constexpr size_t kRequestHeaderBytes = 16;
enum class Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kErasePrefix = 4, kWill = 5 };

// Server -> client response: status u8, reserved[7] (0), value_len u64, then value bytes.
inline constexpr size_t kResponseHeaderBytes = 16;
enum class Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };
// Error texts the server sends are at most this long; a client rejects longer ones.
inline constexpr size_t kMaxErrorBytes = 4096;

// Integers are little-endian (base/bytes.h).
using detail::get_u32;
using detail::get_u64;
using detail::put_u32;
using detail::put_u64;

// ---- parsing ----------------------------------------------------------------------

// "SET", "GET", "ADD", "ERASE_PREFIX", "WILL", or "unknown" for any other opcode byte.
std::string_view op_name(uint8_t op);

struct RequestHeader {
  Op op = Op::kSet;
  uint64_t key_len = 0;
  uint64_t value_len = 0;
  // The whole frame, header included (parse_request_header refuses one that wraps).
  uint64_t frame_bytes() const { return kRequestHeaderBytes + key_len + value_len; }
};

// Validates a client's request header (the first kRequestHeaderBytes of a frame)
// before any of its body is read: opcode 1..5, reserved bytes zero, key_len <=
// max_key_bytes, value_len <= max_value_bytes for SET and WILL, == 8 for GET and
// ADD, == 0 for ERASE_PREFIX, and the whole frame within 64 bits (whatever limits
// the server was given).
// nullopt with `error` saying what was wrong (one line, for the server's log) when
// the header is refused, including when `header` is not exactly kRequestHeaderBytes.
std::optional<RequestHeader> parse_request_header(std::span<const uint8_t> header, uint64_t max_key_bytes,
                                                  uint64_t max_value_bytes, std::string& error);

// The i64 an ADD counter holds: decimal ASCII, an optional '-', at least one digit,
// nothing else, in range. nullopt for anything else (empty, spaces, '+', overflow).
std::optional<int64_t> parse_counter(std::span<const uint8_t> text);

struct Greeting {
  bool auth_required = false;
  std::array<uint8_t, kNonceBytes> nonce{};
};
// The server's greeting; nullopt unless it is exactly kGreetingBytes with this
// magic and version (another service, or another protocol version).
std::optional<Greeting> parse_greeting(std::span<const uint8_t> bytes);

struct Welcome {
  Verdict verdict = Verdict::kRefused;
  uint64_t max_key_bytes = 0;
  uint64_t max_value_bytes = 0;
};
// The server's welcome; nullopt unless it is exactly kWelcomeBytes with the magic
// and a known verdict.
std::optional<Welcome> parse_welcome(std::span<const uint8_t> bytes);

struct ResponseHeader {
  Status status = Status::kOk;
  uint64_t value_len = 0;
};
// The most value bytes a response of `status` may carry from a server that
// announced `max_value_bytes`: OK max(max_value_bytes, 8) (an ADD's reply is 8),
// ERROR kMaxErrorBytes, TIMEOUT 0.
uint64_t response_value_limit(Status status, uint64_t max_value_bytes);
// Validates a response header (exactly kResponseHeaderBytes) before its value is
// read: known status, value_len within response_value_limit. nullopt with `error`
// (one line) otherwise.
std::optional<ResponseHeader> parse_response_header(std::span<const uint8_t> header, uint64_t max_value_bytes,
                                                    std::string& error);

}  // namespace gradcomm::detail::store_wire
