// Wire constants of the TCP store, shared by the server (tcp_store_server.cc, where
// the protocol is described in full) and the client (tcp_store_client.cc).
// All integers are little-endian; every frame has a fixed-size header, so a reader
// always knows how many bytes it still needs and validates lengths before reading
// (let alone allocating) a body.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

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
enum class Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };

// Server -> client response: status u8, reserved[7] (0), value_len u64, then value bytes.
inline constexpr size_t kResponseHeaderBytes = 16;
enum class Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };
// Error texts the server sends are at most this long; a client rejects longer ones.
inline constexpr size_t kMaxErrorBytes = 4096;

inline void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
inline uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace gradcomm::detail::store_wire
