#include "compressors/philox.h"

namespace gradcomm::detail {
namespace {

// splitmix64's output function (Steele, Lea, Flood 2014): a bijection on 64 bits
// with full avalanche, so nearby inputs (step 7 vs 8, rank 0 vs 1) give unrelated ids.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

// Chained, not XORed together: mixing each input into the running state before the
// next one enters keeps (key, step, rank) and its permutations apart, e.g.
// (step 1, rank 2) and (step 2, rank 1) give different streams. rank -1 (shared
// draws) enters as its own value, 2^64 - 1, which no real rank takes.
uint64_t philox_stream_id(uint64_t key_hash, uint64_t step, int rank) {
  uint64_t h = splitmix64(key_hash);
  h = splitmix64(h ^ step);
  h = splitmix64(h ^ static_cast<uint64_t>(static_cast<int64_t>(rank)));
  return h;
}

}  // namespace gradcomm::detail
