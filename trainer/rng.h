// The trainer's random numbers: xoshiro256** seeded through splitmix64 from
// (seed, stream). Its whole state is four words, saved in checkpoints, so a
// resumed run draws exactly what the uninterrupted one would have.
#pragma once

#include <array>
#include <cstdint>

namespace gradcomm::train {

class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (stream * 0x9E3779B97F4A7C15ull);
    for (auto& word : s_) word = splitmix64(x);
  }
  explicit Rng(const std::array<uint64_t, 4>& state) : s_(state) {}

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [lo, hi): 24 random bits, exactly representable as float.
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }
  // Uniform in [0, n), n > 0, without modulo bias: draws at or above the largest
  // multiple of n are rejected.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    while (true) {
      const uint64_t x = next();
      if (x < limit) return x % n;
    }
  }
  const std::array<uint64_t, 4>& state() const { return s_; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::array<uint64_t, 4> s_{};
};

}  // namespace gradcomm::train
