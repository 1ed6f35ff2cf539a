// Job-token challenge for store connections. The server sends a fresh random
// nonce; the client proves it knows the token by answering
// HMAC-SHA256(key = token, message = nonce || kAuthContext). The token itself never
// travels, and a recorded proof is useless for any other nonce.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "store/tcp_store_protocol.h"

namespace gradcomm::detail {

// Binds the proof to this protocol, so it cannot be replayed as a MAC elsewhere.
inline constexpr std::string_view kAuthContext = "gradcomm-store-auth-v1";

using AuthNonce = std::array<uint8_t, store_wire::kNonceBytes>;
using AuthProof = std::array<uint8_t, store_wire::kProofBytes>;

// A nonce from OpenSSL's CSPRNG; TransportError if it cannot produce one.
AuthNonce make_auth_nonce();
// HMAC-SHA256(token, nonce || kAuthContext).
AuthProof make_auth_proof(std::string_view token, std::span<const uint8_t> nonce);
// Constant-time comparison (CRYPTO_memcmp): the time taken says nothing about how
// many leading bytes of a guess were right.
bool auth_proof_matches(const AuthProof& expected, std::span<const uint8_t> received);

// Integrity tag of a record in the store: HMAC-SHA256(token, message) with a job token,
// SHA-256(message) without one (a checksum: it catches garbage, not a forger).
using RecordTag = std::array<uint8_t, 32>;
RecordTag make_record_tag(std::string_view token, std::span<const uint8_t> message);

}  // namespace gradcomm::detail
