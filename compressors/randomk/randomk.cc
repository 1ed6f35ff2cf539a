// Random-k indices (codec.h: randomk_indices): k distinct indices of [0, n),
// increasing, a function of (n, k, stream) only, so every rank drawing the same
// stream picks the same coordinates and only the k values need to travel.
//
// Floyd's algorithm (Bentley & Floyd, CACM 1987): for j = n-k .. n-1 draw t
// uniform in [0, j]; insert t, or j itself if t is already in. Exactly k draws,
// each k-subset equally likely. Draw number d (d = 0 .. k-1) uses 64 random bits,
// stream elements 2d (low word) and 2d+1 (high word), mapped to [0, j] by Lemire's
// multiply-shift with rejection (exactly uniform; a rejected draw is retried with
// the next unused 64-bit draw, counted from k upwards, so draws stay a pure
// function of the stream). Rejection has probability (2^64 mod (j+1)) / 2^64,
// below 2^-31 for any n < 2^33, so in practice draw d is always element pair d.
//
// The set is a bitmap over [0, n) when n < 512(k+1) (at most 64k bytes, 4x the
// hash table, and reading it out in order needs no sort), otherwise an open-addressing table of 2^p >= 2k
// slots followed by a sort of the k members: O(k log k), one allocation each.
// The indices do not depend on the data, so a CUDA rank computes them the same
// way on the host (or caches them per (key, step)).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "compressors/randomk/randomk.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

__extension__ typedef unsigned __int128 U128;  // 64x64 -> 128-bit products (CUDA: __umul64hi)

// Draws uniform integers in [0, range) from the stream; see the file comment.
class UniformDraws {
 public:
  UniformDraws(const PhiloxStream& s, uint64_t k) : s_(s), spare_(k) {}

  uint64_t draw(uint64_t d, uint64_t range) {
    uint64_t u = bits64(d);
    U128 m = static_cast<U128>(u) * range;
    auto low = static_cast<uint64_t>(m);
    if (low < range) {
      const uint64_t reject_below = (0 - range) % range;  // 2^64 mod range
      while (low < reject_below) {
        u = bits64(spare_++);
        m = static_cast<U128>(u) * range;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  // Draw d: stream elements 2d (low word) and 2d+1 (high word). Two draws share a
  // Philox block; consecutive calls reuse it.
  uint64_t bits64(uint64_t d) {
    const uint64_t block = d >> 1;
    if (block != block_index_) {
      block_ = philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                             static_cast<uint32_t>(s_.stream), static_cast<uint32_t>(s_.stream >> 32),
                             static_cast<uint32_t>(s_.seed), static_cast<uint32_t>(s_.seed >> 32));
      block_index_ = block;
    }
    const int lane = static_cast<int>(d & 1u) * 2;
    return static_cast<uint64_t>(block_.v[lane]) | (static_cast<uint64_t>(block_.v[lane + 1]) << 32);
  }

  PhiloxStream s_;
  uint64_t spare_;  // next draw index past the k regular ones
  uint64_t block_index_ = ~uint64_t{0};
  Philox4 block_{};
};

std::vector<uint64_t> floyd_bitmap(uint64_t n, uint64_t k, UniformDraws& draws) {
  std::vector<uint64_t> bits((n + 63) / 64, 0);
  for (uint64_t d = 0, j = n - k; j < n; ++d, ++j) {
    uint64_t t = draws.draw(d, j + 1);
    if (bits[t >> 6] >> (t & 63) & 1u) t = j;  // j > every earlier candidate: never present
    bits[t >> 6] |= uint64_t{1} << (t & 63);
  }
  std::vector<uint64_t> out;
  out.reserve(k);
  for (uint64_t w = 0; w < bits.size(); ++w) {
    for (uint64_t word = bits[w]; word != 0; word &= word - 1) {
      out.push_back(w * 64 + static_cast<uint64_t>(std::countr_zero(word)));
    }
  }
  return out;
}

std::vector<uint64_t> floyd_hashed(uint64_t n, uint64_t k, UniformDraws& draws) {
  // Slots hold index + 1 (0 = empty); load factor <= 1/2, linear probing.
  const uint64_t slots = std::bit_ceil(2 * k);
  const uint64_t mask = slots - 1;
  std::vector<uint64_t> table(slots, 0);
  std::vector<uint64_t> out;
  out.reserve(k);
  auto slot_of = [mask](uint64_t x) { return (x * 0x9E3779B97F4A7C15ull) >> 32 & mask; };
  for (uint64_t d = 0, j = n - k; j < n; ++d, ++j) {
    uint64_t t = draws.draw(d, j + 1);
    uint64_t s = slot_of(t);
    bool present = false;
    for (; table[s] != 0; s = (s + 1) & mask) {
      if (table[s] == t + 1) {
        present = true;
        break;
      }
    }
    if (present) {  // insert j instead; it is new, so probe for its own empty slot
      t = j;
      for (s = slot_of(t); table[s] != 0; s = (s + 1) & mask) {
      }
    }
    table[s] = t + 1;
    out.push_back(t);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<uint64_t> randomk_indices(int64_t n, int64_t k, const PhiloxStream& rng) {
  if (n < 0 || k < 0) throw InvalidArgument(fmt::format("randomk_indices: n = {} and k = {} must be >= 0", n, k));
  std::vector<uint64_t> out;
  if (k >= n) {
    out.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<uint64_t>(i);
    return out;
  }
  if (k == 0) return out;
  const auto un = static_cast<uint64_t>(n);
  const auto uk = static_cast<uint64_t>(k);
  UniformDraws draws(rng, uk);
  return un / 512 <= uk ? floyd_bitmap(un, uk, draws) : floyd_hashed(un, uk, draws);
}

}  // namespace gradcomm::detail
