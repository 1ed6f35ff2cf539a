#include "store/auth.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <vector>

#include "gradcomm/errors.h"

namespace gradcomm::detail {

namespace {

std::string openssl_error() {
  unsigned long code = ERR_get_error();
  if (code == 0) return "no OpenSSL error queued";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

}  // namespace

AuthNonce make_auth_nonce() {
  AuthNonce nonce{};
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    throw TransportError(fmt::format("store auth: RAND_bytes could not produce a {}-byte nonce: {}", nonce.size(),
                                     openssl_error()));
  }
  return nonce;
}

AuthProof make_auth_proof(std::string_view token, std::span<const uint8_t> nonce) {
  std::vector<uint8_t> message(nonce.begin(), nonce.end());
  message.insert(message.end(), kAuthContext.begin(), kAuthContext.end());
  AuthProof proof{};
  unsigned int length = 0;
  // One-shot HMAC(): not deprecated in OpenSSL 3 (unlike HMAC_CTX), and no state to leak.
  const uint8_t* out = HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), message.data(),
                            message.size(), proof.data(), &length);
  if (out == nullptr || length != proof.size()) {
    throw TransportError(fmt::format("store auth: HMAC-SHA256 failed (expected {} bytes, got {}): {}", proof.size(),
                                     length, openssl_error()));
  }
  return proof;
}

bool auth_proof_matches(const AuthProof& expected, std::span<const uint8_t> received) {
  if (received.size() != expected.size()) return false;
  return CRYPTO_memcmp(expected.data(), received.data(), expected.size()) == 0;
}

RecordTag make_record_tag(std::string_view token, std::span<const uint8_t> message) {
  RecordTag tag{};
  unsigned int length = 0;
  const bool ok =
      token.empty()
          ? EVP_Digest(message.data(), message.size(), tag.data(), &length, EVP_sha256(), nullptr) == 1
          : HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), message.data(), message.size(),
                 tag.data(), &length) != nullptr;
  if (!ok || length != tag.size()) {
    throw TransportError(fmt::format("store record: {} failed: {}", token.empty() ? "SHA-256" : "HMAC-SHA256",
                                     openssl_error()));
  }
  return tag;
}

}  // namespace gradcomm::detail
