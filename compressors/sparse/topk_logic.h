// The arithmetic of top-k selection, shared by the CPU reference (topk_select.cc)
// and the CUDA kernels (gpu_topk.cu, radix_select.cuh): magnitude keys, radix
// digits, the bucket pick of a histogram pass, the output slot of a stable
// compaction, and the DGC sample plan. Everything a GPU thread computes is a
// GRADCOMM_HD function here, so tests/unit/test_gpu_sparse_logic.cc can run the
// GPU's decomposition (256 pick "threads", 4096-element tiles) on the CPU and hold
// it to topk_select bit for bit, on machines without a GPU.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "compressors/philox.h"
#include "half.h"  // GRADCOMM_HD, float_bits

namespace gradcomm::detail::topk {

// ---- magnitude keys ----------------------------------------------------------------
// |x| as an order-preserving integer (the fp32 bits with the sign cleared); every NaN
// collapses to one key just above +inf, so NaNs outrank numbers and tie with each other.
constexpr uint32_t kNanKey = 0x7F800001u;

GRADCOMM_HD uint32_t magnitude_key(float x) {
  const uint32_t a = float_bits(x) & 0x7FFFFFFFu;
  return a < kNanKey ? a : kNanKey;
}

// ---- radix digits --------------------------------------------------------------------
// Three passes over the digits [31:21], [20:10], [9:0] (2048, 2048, 1024 buckets).
// A pass only counts keys that match the prefix chosen by the earlier passes.
constexpr int kRadixPasses = 3;
constexpr int kRadixBuckets = 2048;

GRADCOMM_HD int digit_shift(int pass) { return pass == 0 ? 21 : (pass == 1 ? 10 : 0); }
GRADCOMM_HD uint32_t digit_top(int pass) { return pass == 2 ? 0x3FFu : 0x7FFu; }  // largest digit value
GRADCOMM_HD uint32_t digit_of(uint32_t key, int pass) { return (key >> digit_shift(pass)) & digit_top(pass); }
GRADCOMM_HD bool prefix_matches(uint32_t key, uint32_t prefix, uint32_t prefix_mask) {
  return (key & prefix_mask) == prefix;
}
// The prefix mask after `pass` has chosen its digit.
GRADCOMM_HD uint32_t mask_after(int pass) { return pass == 0 ? 0xFFE00000u : (pass == 1 ? 0xFFFFFC00u : 0xFFFFFFFFu); }

// ---- bucket pick -------------------------------------------------------------------
// After a histogram pass, find the bucket holding the `need`-th largest matching key
// (1 <= need <= total), scanning from the top bucket down. The GPU does it with
// kPickThreads threads: thread t owns the kPickPerThread buckets top - t*P .. top -
// t*P - (P-1) (those >= 0), sums them, an exclusive block scan gives `before` (keys
// in higher buckets), and exactly one thread finds the crossing in its chunk.
constexpr int kPickThreads = 256;
constexpr int kPickPerThread = kRadixBuckets / kPickThreads;  // 8

GRADCOMM_HD uint64_t pick_chunk_sum(const unsigned long long* hist, uint32_t top, int t) {
  uint64_t sum = 0;
  for (int j = 0; j < kPickPerThread; ++j) {
    const uint32_t r = static_cast<uint32_t>(t * kPickPerThread + j);
    if (r <= top) sum += hist[top - r];
  }
  return sum;
}

// Thread t's part of the pick, `before` = keys in buckets above its chunk. True for
// the one thread whose chunk holds the need-th key: *bucket is that bucket and
// *need_inside the rank inside it (need minus the keys in higher buckets).
GRADCOMM_HD bool pick_in_chunk(const unsigned long long* hist, uint32_t top, int t, uint64_t before, int64_t need,
                               uint32_t* bucket, int64_t* need_inside) {
  if (before >= static_cast<uint64_t>(need)) return false;  // crossed in a higher chunk
  uint64_t running = before;
  for (int j = 0; j < kPickPerThread; ++j) {
    const uint32_t r = static_cast<uint32_t>(t * kPickPerThread + j);
    if (r > top) break;
    const uint64_t h = hist[top - r];
    if (running + h >= static_cast<uint64_t>(need)) {
      *bucket = top - r;
      *need_inside = need - static_cast<int64_t>(running);
      return true;
    }
    running += h;
  }
  return false;
}

// ---- stable compaction -------------------------------------------------------------
// The selection for threshold key T: every key > T, plus the first `take_equal` keys
// == T in index order (take_equal = kTakeAllEqual: all of them, as select=sample
// wants). Walking the input in index order with gt_before / eq_before = keys > T and
// keys == T seen so far, an element's output slot is its rank in the selection;
// -1 when it is not selected. Slots of selected elements increase with the index.
constexpr uint64_t kTakeAllEqual = ~uint64_t{0};

GRADCOMM_HD int64_t compact_slot(uint32_t key, uint32_t threshold, uint64_t take_equal, uint64_t gt_before,
                                 uint64_t eq_before) {
  if (key > threshold) return static_cast<int64_t>(gt_before + (eq_before < take_equal ? eq_before : take_equal));
  if (key == threshold && eq_before < take_equal) return static_cast<int64_t>(gt_before + eq_before);
  return -1;
}
// Selection size for totals gt (keys > T) and eq (keys == T).
GRADCOMM_HD uint64_t compact_count(uint64_t gt, uint64_t eq, uint64_t take_equal) {
  return gt + (eq < take_equal ? eq : take_equal);
}

// ---- select=sample (DGC) -----------------------------------------------------------
// High 64 bits of a 64x64-bit product.
GRADCOMM_HD uint64_t mulhi64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  __extension__ typedef unsigned __int128 U128;
  return static_cast<uint64_t>((static_cast<U128>(a) * b) >> 64);
#endif
}

// Sample j's position in [0, n): floor(u_j * n / 2^64), u_j = u64 draw j of the
// stream (stream elements 2j, 2j+1: one Philox block serves samples 2b and 2b+1).
GRADCOMM_HD uint64_t sample_position(const PhiloxStream& s, uint64_t j, uint64_t n) {
  const uint64_t block = j >> 1;
  const Philox4 r = philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                                  static_cast<uint32_t>(s.stream), static_cast<uint32_t>(s.stream >> 32),
                                  static_cast<uint32_t>(s.seed), static_cast<uint32_t>(s.seed >> 32));
  const int h = static_cast<int>(j & 1u) * 2;
  const uint64_t u = static_cast<uint64_t>(r.v[h]) | (static_cast<uint64_t>(r.v[h + 1]) << 32);
  return mulhi64(u, n);
}

// Host-side plan of select=sample for 1 <= k < n, exactly as topk_select.cc computes
// it: m = max(1024, min(ceil(128 n / k), n)) samples; exact selection when m >= n/2
// (integer division); threshold = key of the ks-th largest sample; the threshold's
// result is kept iff lower <= count <= upper.
struct SamplePlan {
  bool exact = false;
  int64_t m = 0, ks = 0, lower = 0, upper = 0;
};

constexpr double kSampleHits = 128.0;  // sampled elements expected above the threshold
constexpr int64_t kMinSample = 1024;   // fewest samples drawn (the exact select's filter too)

inline SamplePlan sample_plan(int64_t n, int64_t k) {
  SamplePlan p;
  const double want = std::ceil(kSampleHits * static_cast<double>(n) / static_cast<double>(k));
  p.m = std::max<int64_t>(kMinSample, want >= static_cast<double>(n) ? n : static_cast<int64_t>(want));
  p.exact = p.m >= n / 2;
  const double ks_real = std::round(static_cast<double>(k) * static_cast<double>(p.m) / static_cast<double>(n));
  p.ks = std::clamp<int64_t>(static_cast<int64_t>(ks_real), 1, p.m);
  p.lower = std::max<int64_t>(1, k / 2);
  p.upper = std::min<int64_t>(2 * k, n);
  return p;
}

}  // namespace gradcomm::detail::topk
