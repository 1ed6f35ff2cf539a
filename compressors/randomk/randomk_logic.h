// The arithmetic of random-k index drawing, shared by the CPU reference
// (randomk.cc's Floyd sampling) and the CUDA version (gpu_randomk.cu), which
// reaches the same index set in parallel. GRADCOMM_HD, so
// tests/unit/test_gpu_sparse_logic.cc can check the parallel decomposition against
// randomk_indices() on a machine without a GPU.
//
// Floyd's algorithm (Bentley & Floyd 1987), with base = n - k: for d = 0 .. k-1,
// j = base + d, draw t_d uniform in [0, j]; insert t_d, or j when t_d is already in.
// Call step d "collided" (c_d) when it inserts j. The parallel form rests on:
//
//   c_d  <=>  dup_d  or  (base <= t_d < base + d  and  c_{t_d - base})
//
// where dup_d = "some e < d drew t_e == t_d". Proof: the set before step d is
// V = {t_e : e < d, not c_e} u {base + e : e < d, c_e}. t_d equals a member of the
// first part iff t_d = t_e for a non-collided e < d; if instead t_d = t_e for a
// collided e, then t_e was already in the set before step e, hence in V, so
// "t_d in V or equal to an earlier draw" is exactly dup_d. t_d is in the second part
// iff t_d = base + e with e < d (so base <= t_d < base + d) and c_e. Since t_d - base
// < d, the recursion runs down a strictly decreasing chain and ends.
// Step d inserts v_d = c_d ? base + d : t_d; the k values are distinct (Floyd) and
// their sorted order is randomk_indices()' output.
//
// Draw d maps u64 draw d of the stream to [0, j] by Lemire's multiply-shift with
// rejection; a rejected draw is retried with spare u64 draws numbered k, k+1, ... in
// order of use (increasing d). Rejection has probability < 2^-31 for n < 2^33, so the
// GPU draws every d in parallel and fixes the rare rejected ones up in order.
#pragma once

#include <cstdint>

#include "compressors/philox.h"
#include "compressors/sparse/topk_logic.h"  // mulhi64

namespace gradcomm::detail::randomk {

// u64 draw d: stream elements 2d (low word) and 2d + 1 (high word).
GRADCOMM_HD uint64_t draw_bits64(const PhiloxStream& s, uint64_t d) {
  const uint64_t block = d >> 1;
  const Philox4 r = philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                                  static_cast<uint32_t>(s.stream), static_cast<uint32_t>(s.stream >> 32),
                                  static_cast<uint32_t>(s.seed), static_cast<uint32_t>(s.seed >> 32));
  const int lane = static_cast<int>(d & 1u) * 2;
  return static_cast<uint64_t>(r.v[lane]) | (static_cast<uint64_t>(r.v[lane + 1]) << 32);
}

// Lemire: u -> floor(u * range / 2^64) in [0, range), rejecting the low products
// below 2^64 mod range so the result is exactly uniform. False when rejected.
GRADCOMM_HD bool lemire_map(uint64_t u, uint64_t range, uint64_t* t) {
  const uint64_t low = u * range;  // low 64 bits of the product
  if (low < range) {
    const uint64_t reject_below = (0 - range) % range;  // 2^64 mod range
    if (low < reject_below) return false;
  }
  *t = topk::mulhi64(u, range);
  return true;
}

// c_d by walking the chain d -> t_d - base -> ...; dup and t are indexed by draw.
GRADCOMM_HD bool floyd_collided(uint64_t d, uint64_t base, const uint8_t* dup, const uint64_t* t) {
  for (;;) {
    if (dup[d]) return true;
    const uint64_t v = t[d];
    if (v < base || v >= base + d) return false;
    d = v - base;
  }
}

}  // namespace gradcomm::detail::randomk
