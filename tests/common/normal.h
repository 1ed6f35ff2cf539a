// n draws of a standard normal from std::mt19937 seeded with `seed`: the gradient-like
// input of tests that need one reproducible vector per (rank, step).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace gradcomm::testing {

inline std::vector<float> normal_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace gradcomm::testing
