// FNV-1a 64: the checksum of the communicator's saved state (src/state.cc) and of
// the reference trainer's checkpoints. Detects corruption, not tampering.
#pragma once

#include <cstdint>
#include <span>

namespace gradcomm::detail {

inline uint64_t fnv1a64(std::span<const uint8_t> bytes) {
  uint64_t h = 14695981039346656037ull;
  for (uint8_t b : bytes) {
    h ^= b;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace gradcomm::detail
