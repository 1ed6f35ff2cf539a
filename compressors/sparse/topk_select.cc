// Top-k selection by magnitude, CPU reference (codec.h: topk_select).
//
// Both modes rank elements by a 32-bit magnitude key: the fp32 bits with the sign
// cleared. For non-NaN floats that integer orders exactly like |x| (denormals below
// normals, +-0 equal, inf largest). Every NaN maps to one key just above inf, so a
// NaN outranks every number and NaNs tie among themselves (lower index first): a
// NaN in the accumulator is sent rather than hidden forever in the error-feedback
// residual. Keys are plain integers, so the CUDA version ranks identically.
//
// exact  — radix select (as in CUB's / PyTorch's topk): three histogram passes over
//          the digits [31:21], [20:10], [9:0] of the key narrow down the key T of the
//          k-th largest element and how many elements equal to T are needed; one
//          compaction then takes every key > T and the lowest-index elements with
//          key == T until k are taken. Output indices are increasing by construction.
//          When T's top-digit bucket is small, pass 2 also records the indices above
//          that bucket and inside it, and the compaction merges those two lists
//          instead of rereading the input (two full passes in all, not three).
//          No sort, no per-element allocation; the second pass collects the indices
//          of the surviving bucket when it is small, so the third pass reads only
//          those. Large inputs first go through a sampled filter (below,
//          select_exact_filtered): one pass keeps the few elements that can be in
//          the top k, and the radix select runs over those alone.
// sample — DGC (Lin et al., ICLR 2018): estimate T from a Philox-drawn sample, then
//          take every element with key >= T in one pass. Count bounds and the
//          fallback to exact are documented at select_sample and in FORMAT.md.
//
// topk_select_accumulate folds error feedback's acc = grad + residual into that one
// pass, so a step of top-k with error feedback reads its input once; topk_select_fold
// also zeroes grad in it (the caller's buffer becomes the sparse decoder's zeroed
// output), so the step streams grad and the residual once and the output not at all.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <fmt/format.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "compressors/sparse/sparse.h"
#include "compressors/sparse/topk_logic.h"
#include "gradcomm/errors.h"
#include "half.h"
#include "reduce.h"

namespace gradcomm::detail {
namespace {

using topk::magnitude_key;  // topk_logic.h: shared with the CUDA kernels

// The three digits of a key, most significant first.
struct Digit {
  int shift;
  uint32_t mask;  // after shifting
};
constexpr std::array<Digit, 3> kDigits = {{{21, 0x7FFu}, {10, 0x7FFu}, {0, 0x3FFu}}};
constexpr int kBuckets = 2048;
// A histogram of one digit, plus a sink slot (kBuckets) that the branch-free passes count
// elements outside the prefix into: whether an element matches is data-dependent (about
// the chosen bucket's share of a crowded range), and a mispredicted branch per element
// cost more than the one extra increment.
using Histogram = std::array<int64_t, kBuckets + 1>;
constexpr uint32_t kSink = kBuckets;

// Where the k-th largest key lies: every element with key > key is selected, plus
// the first `take_equal` elements (by index) with key == key.
// When `collected`, the selection is also known without another pass over the
// input: `above` (every element whose top digit exceeds the threshold's) and
// `candidates` (every element sharing its top digit), both in increasing index order.
struct Threshold {
  uint32_t key = 0;
  int64_t take_equal = 0;
  bool collected = false;
  std::vector<int64_t> above, candidates;
};

// Within a histogram of the current digit, finds the bucket holding the `need`-th
// largest element (need >= 1 and <= the histogram's total) and returns it; `need`
// becomes the rank inside that bucket.
uint32_t pick_bucket(const Histogram& hist, uint32_t top, int64_t& need) {
  for (uint32_t d = top + 1; d-- > 0;) {
    if (hist[d] >= need) return d;
    need -= hist[d];
  }
  return 0;  // unreachable while need <= total
}

// Radix select over n keys given by key_at(i), 1 <= k <= n. collect_indices: also
// record Threshold::above/candidates when pass 2 can (select_exact uses them).
template <class KeyAt>
Threshold radix_threshold(int64_t n, int64_t k, KeyAt key_at, bool collect_indices) {
  Histogram hist;
  int64_t need = k;  // rank of the target among elements matching the prefix so far

  // Pass 1: top digit over everything. Gradients crowd into a few top-digit
  // buckets, so one histogram would make nearly every increment wait on the last
  // one to the same counter; four interleaved counters per bucket break that chain.
  // They are 32-bit, flushed into `hist` every block of kBlock elements.
  hist.fill(0);
  {
    constexpr int64_t kBlock = int64_t{1} << 28;  // each lane counts at most kBlock / 4
    std::vector<uint32_t> lanes(4 * kBuckets);
    for (int64_t begin = 0; begin < n; begin += kBlock) {
      const int64_t end = std::min(n, begin + kBlock);
      std::fill(lanes.begin(), lanes.end(), 0u);
      int64_t i = begin;
      for (; i + 4 <= end; i += 4) {
        ++lanes[0 * kBuckets + (key_at(i) >> kDigits[0].shift)];
        ++lanes[1 * kBuckets + (key_at(i + 1) >> kDigits[0].shift)];
        ++lanes[2 * kBuckets + (key_at(i + 2) >> kDigits[0].shift)];
        ++lanes[3 * kBuckets + (key_at(i + 3) >> kDigits[0].shift)];
      }
      for (; i < end; ++i) ++lanes[key_at(i) >> kDigits[0].shift];
      for (int d = 0; d < kBuckets; ++d) {
        hist[d] += int64_t{lanes[d]} + lanes[kBuckets + d] + lanes[2 * kBuckets + d] + lanes[3 * kBuckets + d];
      }
    }
  }
  uint32_t prefix = pick_bucket(hist, kDigits[0].mask, need) << kDigits[0].shift;
  uint32_t prefix_mask = kDigits[0].mask << kDigits[0].shift;

  // Pass 2: middle digit over the elements in the chosen top bucket. When that
  // bucket holds at most n/16 elements, remember their indices (one allocation of a
  // size known from the histogram) so pass 3 need not rescan the input, and the
  // indices of every element above the bucket (fewer than k, all selected), so the
  // caller can assemble the selection without another pass (Threshold::above).
  const uint32_t top = prefix >> kDigits[0].shift;
  const int64_t in_bucket = hist[top];
  const bool collect = collect_indices && in_bucket <= n / 16;
  Threshold result;
  std::vector<int64_t>& candidates = result.candidates;
  if (collect) {
    int64_t above = 0;
    for (uint32_t d = top + 1; d <= kDigits[0].mask; ++d) above += hist[d];
    candidates.resize(static_cast<size_t>(in_bucket));
    result.above.resize(static_cast<size_t>(above));
    result.collected = true;
  }
  hist.fill(0);
  if (collect) {  // the same histogram as below, and the two index lists
    int64_t c = 0, a = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t key = key_at(i);
      if ((key & prefix_mask) == prefix) {
        ++hist[(key >> kDigits[1].shift) & kDigits[1].mask];
        candidates[static_cast<size_t>(c++)] = i;
      } else if (key > prefix) {
        result.above[static_cast<size_t>(a++)] = i;
      }
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t key = key_at(i);
      ++hist[(key & prefix_mask) == prefix ? (key >> kDigits[1].shift) & kDigits[1].mask : kSink];
    }
  }
  prefix |= pick_bucket(hist, kDigits[1].mask, need) << kDigits[1].shift;
  prefix_mask |= kDigits[1].mask << kDigits[1].shift;

  // Pass 3: low digit, over the candidates or the whole input.
  hist.fill(0);
  auto count_low = [&](uint32_t key) {
    ++hist[(key & prefix_mask) == prefix ? key & kDigits[2].mask : kSink];
  };
  if (collect) {
    for (int64_t i : candidates) count_low(key_at(i));
  } else {
    for (int64_t i = 0; i < n; ++i) count_low(key_at(i));
  }
  prefix |= pick_bucket(hist, kDigits[2].mask, need);
  result.key = prefix;
  result.take_equal = need;
  return result;
}

// Builds a selection of `count` entries (known from the select, so sized once):
// every key > t.key and the first t.take_equal keys == t.key, offered in index order.
class Selection {
 public:
  // One slot more than `count`: offer() writes every candidate before it knows.
  Selection(const float* acc, const Threshold& t, int64_t count) : acc_(acc), key_(t.key), equal_left_(t.take_equal) {
    out_.indices.resize(static_cast<size_t>(count) + 1);
    out_.values.resize(static_cast<size_t>(count) + 1);
  }
  // Whether an element with this key is selected (consumes one tie when it equals T).
  bool passes(uint32_t key) {
    if (key != key_) return key > key_;
    if (equal_left_ == 0) return false;
    --equal_left_;
    return true;
  }
  void take(int64_t i) { take(i, acc_[i]); }
  void take(int64_t i, float value) {  // value == acc[i], already at hand
    out_.indices[static_cast<size_t>(taken_)] = static_cast<uint64_t>(i);
    out_.values[static_cast<size_t>(taken_)] = value;
    ++taken_;
  }
  // passes(key) and take(i, value) without a branch on the (unpredictable) outcome: the
  // entry is written to the next slot, which only advances when it passes. Ties (key ==
  // T, rare) take the branch.
  void offer(int64_t i, float value, uint32_t key) {
    if (key == key_) [[unlikely]] {
      if (passes(key)) take(i, value);
      return;
    }
    out_.indices[static_cast<size_t>(taken_)] = static_cast<uint64_t>(i);
    out_.values[static_cast<size_t>(taken_)] = value;
    taken_ += key > key_ ? 1 : 0;
  }
  SparseVector release() {
    out_.indices.resize(static_cast<size_t>(taken_));
    out_.values.resize(static_cast<size_t>(taken_));
    return std::move(out_);
  }

 private:
  const float* acc_;
  uint32_t key_;
  int64_t equal_left_;
  int64_t taken_ = 0;
  SparseVector out_;
};

// One pass over the input.
SparseVector compact(const float* acc, int64_t n, const Threshold& t, int64_t count) {
  Selection sel(acc, t, count);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = magnitude_key(acc[i]);
    if (key >= t.key) [[unlikely]] {
      if (sel.passes(key)) sel.take(i);
    }
  }
  return sel.release();
}

SparseVector take_all(const float* acc, int64_t n) {
  SparseVector out;
  out.indices.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.indices[static_cast<size_t>(i)] = static_cast<uint64_t>(i);
  out.values.assign(acc, acc + n);
  return out;
}

// The same selection as compact(), from the collected index lists: merges `above`
// (all selected) with the candidates whose key passes, in index order. Reads about
// k + |candidates| elements instead of n.
SparseVector merge_collected(const float* acc, const Threshold& t, int64_t count) {
  Selection sel(acc, t, count);
  size_t a = 0;
  for (int64_t i : t.candidates) {
    if (!sel.passes(magnitude_key(acc[i]))) continue;
    while (a < t.above.size() && t.above[a] < i) sel.take(t.above[a++]);
    sel.take(i);
  }
  while (a < t.above.size()) sel.take(t.above[a++]);
  return sel.release();
}

SparseVector select_exact(const float* acc, int64_t n, int64_t k) {
  const Threshold t = radix_threshold(n, k, [acc](int64_t i) { return magnitude_key(acc[i]); }, /*collect_indices=*/true);
  return t.collected ? merge_collected(acc, t, k) : compact(acc, n, t, k);
}

// ---- sample (DGC), and the fused accumulate + select ----------------------------------
// Sample size m = clamp(ceil(kSampleHits * n / k), kMinSample, n): about kSampleHits
// sampled elements land above the threshold, so the selected count has a relative
// spread of roughly 1/sqrt(kSampleHits) (~9%) around k. Inputs with 2m >= n are
// selected exactly instead: sampling would cost as much as a full select
// (topk_logic.h: sample_plan holds these numbers for the CPU and the GPU).
//
// select=sample count bounds: the threshold pass accepts when floor(k/2) (at least 1)
// <= count <= 2k. Outside them (heavy ties at the threshold, or an unlucky or
// adversarial sample) the result is the exact top-k instead, so the count always lies
// in [max(1, floor(k/2)), min(2k, n)] and every selected element has key >= the
// smallest selected key.
//
// select=exact samples too, as a filter (select_exact_filtered, its own sample size):
// a sampled key is a bound B that about 2k elements of the input reach. One pass
// keeps the elements with key >= B; when there are at least k of them (and at most
// 4k), the k-th largest key T is >= B, so every key >= T is among them, in index
// order, and the radix select over those few keys finds the same T, the same tie
// count and the same selection as over the whole input. Otherwise (a bound above T,
// or heavy ties at B) the radix passes run over the whole input.

// The keys of acc = grad (+ residual) at the m sample positions of `rng`: position j is
// topk::sample_position(rng, j, n), computed here two at a time from their shared
// Philox block. All positions first, then the reads: they land on lines no pass has
// touched yet, so each is asked for kAhead samples early and the misses overlap
// instead of each read waiting for its own.
std::vector<uint32_t> sample_keys(int64_t n, int64_t m, const PhiloxStream& rng, const float* grad,
                                  const float* residual) {
  std::vector<int64_t> pos(static_cast<size_t>(m));
  const auto un = static_cast<uint64_t>(n);
  for (int64_t j = 0; j < m; j += 2) {
    const auto block = static_cast<uint64_t>(j) >> 1;
    const Philox4 r = philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                                    static_cast<uint32_t>(rng.stream), static_cast<uint32_t>(rng.stream >> 32),
                                    static_cast<uint32_t>(rng.seed), static_cast<uint32_t>(rng.seed >> 32));
    for (int64_t h = 0; h < 2 && j + h < m; ++h) {
      const uint64_t u = static_cast<uint64_t>(r.v[2 * h]) | (static_cast<uint64_t>(r.v[2 * h + 1]) << 32);
      pos[static_cast<size_t>(j + h)] = static_cast<int64_t>(topk::mulhi64(u, un));
    }
  }
  constexpr int64_t kAhead = 16;
  std::vector<uint32_t> keys(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j) {
    if (j + kAhead < m) {
      const int64_t next = pos[static_cast<size_t>(j + kAhead)];
      __builtin_prefetch(grad + next);
      if (residual != nullptr) __builtin_prefetch(residual + next);
    }
    const int64_t i = pos[static_cast<size_t>(j)];
    // The same fp32 sum the pass will store there.
    keys[static_cast<size_t>(j)] = magnitude_key(residual != nullptr ? residual[i] + grad[i] : grad[i]);
  }
  return keys;
}

// The key of the rank-th largest of `keys` (1 <= rank <= keys.size()).
uint32_t kth_largest_key(const std::vector<uint32_t>& keys, int64_t rank) {
  return radix_threshold(
             static_cast<int64_t>(keys.size()), rank, [&keys](int64_t j) { return keys[static_cast<size_t>(j)]; },
             /*collect_indices=*/false)
      .key;
}

// residual[i] += grad[i] (reduce.h's fp32 sum: the ring's own vectorized loop).
void add_into(float* residual, const float* grad, int64_t len) {
  reduce_inplace(residual, grad, len, DType::kFloat32, ReduceOp::kSum);
}

// grad[0, n) = +0.0 when the caller asked for it (clear = grad), else nothing.
void zero(float* clear, int64_t n) {
  if (clear != nullptr) std::fill(clear, clear + n, 0.0f);
}

// One pass over the input: acc = grad + residual into the residual (when there is
// one), grad = +0.0 when `clear` (= grad) is set (topk_select_fold; acc is then the
// residual, so nothing reads grad again), and the elements with key >= bound (index
// and acc value), in index order, as
// long as there are at most `cap` of them (`overflow` past that; the accumulation
// still completes). Works in blocks of kCollectBlock so the overflow check is per
// block: the lists need kCollectBlock slots of room past `cap`.
//
// The key test skips magnitude_key's NaN clamp: bound is a key (<= kNanKey), so
// |bits| >= bound exactly when min(|bits|, kNanKey) >= bound.
// The lists are left uninitialized (new T[], not vectors): a pass touches only the
// slots it fills, far fewer than the capacity.
struct Collected {
  std::unique_ptr<int64_t[]> indices;
  std::unique_ptr<float[]> values;
  int64_t count = 0;
  bool overflow = false;
};

constexpr int64_t kCollectBlock = 4096;

// Collects [begin, end) of acc into idx/val from slot `count`; returns the new count.
int64_t collect_scalar(const float* acc, int64_t begin, int64_t end, uint32_t bound, int64_t* idx, float* val,
                       int64_t count) {
  for (int64_t i = begin; i < end; ++i) {  // branch-free: write every slot, advance on a pass
    idx[count] = i;
    val[count] = acc[i];
    count += (float_bits(acc[i]) & 0x7FFFFFFFu) >= bound ? 1 : 0;
  }
  return count;
}

#if defined(__SSE2__)
// The same block, 16 elements a step: the add, the 16 key tests folded into a bit
// mask, and the (rare) passing lanes appended from the mask. kClear zeroes grad's
// lanes once they are read (only with a residual: the passing lanes read acc after).
template <bool kAccumulate, bool kClear>
int64_t collect_block_sse2(const float* grad, float* residual, float* clear, int64_t begin, int64_t end,
                           uint32_t bound, int64_t* idx, float* val, int64_t count) {
  static_assert(kAccumulate || !kClear, "acc is grad without a residual: it cannot be cleared");
  const float* acc = kAccumulate ? residual : grad;
  const __m128i magnitude = _mm_set1_epi32(0x7FFFFFFF);
  // key >= bound as a signed compare: keys and bound - 1 (>= -1) fit in int32.
  const __m128i below = _mm_set1_epi32(static_cast<int32_t>(bound) - 1);
  auto lanes = [&](int64_t i) {
    __m128 a;
    if constexpr (kAccumulate) {
      a = _mm_add_ps(_mm_loadu_ps(residual + i), _mm_loadu_ps(grad + i));
      _mm_storeu_ps(residual + i, a);
      if constexpr (kClear) _mm_storeu_ps(clear + i, _mm_setzero_ps());
    } else {
      a = _mm_loadu_ps(grad + i);
    }
    const __m128i key = _mm_and_si128(_mm_castps_si128(a), magnitude);
    return static_cast<uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(key, below))));
  };
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    uint32_t mask = lanes(i) | lanes(i + 4) << 4 | lanes(i + 8) << 8 | lanes(i + 12) << 12;
    while (mask != 0) {
      const int j = __builtin_ctz(mask);
      idx[count] = i + j;
      val[count] = acc[i + j];
      ++count;
      mask &= mask - 1;
    }
  }
  if (kAccumulate) add_into(residual + i, grad + i, end - i);
  if (kClear) zero(clear + i, end - i);
  return collect_scalar(acc, i, end, bound, idx, val, count);
}
#endif

Collected accumulate_and_collect(const float* grad, float* residual, float* clear, int64_t n, uint32_t bound,
                                 int64_t cap) {
  Collected out;
  out.indices.reset(new int64_t[static_cast<size_t>(cap + kCollectBlock)]);
  out.values.reset(new float[static_cast<size_t>(cap + kCollectBlock)]);
  int64_t* idx = out.indices.get();
  float* val = out.values.get();
  int64_t count = 0;
  for (int64_t begin = 0; begin < n; begin += kCollectBlock) {
    const int64_t end = std::min(n, begin + kCollectBlock);
    if (out.overflow) {  // only the accumulation (and the clearing) is left to do
      if (residual != nullptr) add_into(residual + begin, grad + begin, end - begin);
      if (clear != nullptr) zero(clear + begin, end - begin);
      continue;
    }
#if defined(__SSE2__)
    if (clear != nullptr) {
      count = collect_block_sse2<true, true>(grad, residual, clear, begin, end, bound, idx, val, count);
    } else if (residual != nullptr) {
      count = collect_block_sse2<true, false>(grad, residual, nullptr, begin, end, bound, idx, val, count);
    } else {
      count = collect_block_sse2<false, false>(grad, nullptr, nullptr, begin, end, bound, idx, val, count);
    }
#else
    if (residual != nullptr) add_into(residual + begin, grad + begin, end - begin);
    count = collect_scalar(residual != nullptr ? residual : grad, begin, end, bound, idx, val, count);
    if (clear != nullptr) zero(clear + begin, end - begin);
#endif
    out.overflow = count > cap;
  }
  out.count = out.overflow ? 0 : count;
  return out;
}

// The selection's acc after the whole input went through accumulate_and_collect.
const float* acc_of(const float* grad, const float* residual) { return residual != nullptr ? residual : grad; }


SparseVector select_exact_all(const float* grad, float* residual, float* clear, int64_t n, int64_t k) {
  if (residual != nullptr) add_into(residual, grad, n);
  zero(clear, n);
  return select_exact(acc_of(grad, residual), n, k);
}

// The filter's sample: m = max(1024, ceil(32 n / k)) positions, so about 32 sampled
// elements lie above the k-th largest and 64 above the bound (the rank-2mk/n largest
// sample): the count above the bound is then 2k give or take 1/sqrt(64) = 12.5 %, and
// falling under k (or over 4k) is a four (eight) sigma event. Only when m <= n/16:
// otherwise the sample (random reads, a Philox block per two positions) costs about as
// much as the radix passes it would save (a 1 MB tensor at k = 0.1 %).
constexpr double kFilterHitsPerK = 32.0;

SparseVector select_exact_filtered(const float* grad, float* residual, float* clear, int64_t n, int64_t k,
                                   const PhiloxStream& rng) {
  const double want = std::ceil(kFilterHitsPerK * static_cast<double>(n) / static_cast<double>(k));
  const int64_t m = std::max<int64_t>(topk::kMinSample, want >= static_cast<double>(n) ? n : static_cast<int64_t>(want));
  if (m > n / 16) return select_exact_all(grad, residual, clear, n, k);
  const std::vector<uint32_t> sample = sample_keys(n, m, rng, grad, residual);
  const double rank_real = std::round(2.0 * static_cast<double>(k) * static_cast<double>(m) / static_cast<double>(n));
  const uint32_t bound = kth_largest_key(sample, std::clamp<int64_t>(static_cast<int64_t>(rank_real), 1, m));
  const Collected c = accumulate_and_collect(grad, residual, clear, n, bound, std::min(n, 4 * k));
  const float* acc = acc_of(grad, residual);
  if (c.overflow || c.count < k) return select_exact(acc, n, k);

  std::vector<uint32_t> keys(static_cast<size_t>(c.count));
  for (int64_t j = 0; j < c.count; ++j) keys[static_cast<size_t>(j)] = magnitude_key(c.values[j]);
  const Threshold t = radix_threshold(
      c.count, k, [&keys](int64_t j) { return keys[static_cast<size_t>(j)]; }, /*collect_indices=*/false);
  Selection sel(acc, t, k);
  for (int64_t j = 0; j < c.count; ++j) sel.offer(c.indices[j], c.values[j], keys[static_cast<size_t>(j)]);
  return sel.release();
}

SparseVector select_sample(const float* grad, float* residual, float* clear, int64_t n, int64_t k,
                           const PhiloxStream& rng) {
  const topk::SamplePlan plan = topk::sample_plan(n, k);
  if (plan.exact) return select_exact_all(grad, residual, clear, n, k);
  // Threshold: the key of the rank-ks largest sample, ks = round(k * m / n) >= 1,
  // so about k elements of the whole input are expected at or above it.
  const std::vector<uint32_t> sample = sample_keys(n, plan.m, rng, grad, residual);
  const uint32_t threshold = kth_largest_key(sample, plan.ks);
  const Collected c = accumulate_and_collect(grad, residual, clear, n, threshold, plan.upper);
  const float* acc = acc_of(grad, residual);
  if (c.overflow || c.count < plan.lower) return select_exact(acc, n, k);  // outside the bounds: exact
  SparseVector out;
  out.indices.assign(c.indices.get(), c.indices.get() + c.count);
  out.values.assign(c.values.get(), c.values.get() + c.count);
  return out;
}

// The selection with error feedback's fold; grad is zeroed too when clear (= grad) is set.
SparseVector select_accumulate(const float* grad, float* residual, float* clear, int64_t n, int64_t k,
                               TopkSelect select, const PhiloxStream& rng) {
  if (n < 0 || k < 0) throw InvalidArgument(fmt::format("topk_select: n = {} and k = {} must be >= 0", n, k));
  if (n == 0 || k == 0 || k >= n) {  // nothing to choose: accumulate, then none or all
    if (residual != nullptr) add_into(residual, grad, n);
    const float* acc = acc_of(grad, residual);
    SparseVector out = k == 0 || n == 0 ? SparseVector{} : take_all(acc, n);
    zero(clear, n);
    return out;
  }
  switch (select) {
    case TopkSelect::kExact: return select_exact_filtered(grad, residual, clear, n, k, rng);
    case TopkSelect::kSample: return select_sample(grad, residual, clear, n, k, rng);
  }
  throw InvalidArgument(fmt::format("topk_select: unknown select mode {}", static_cast<int>(select)));
}

}  // namespace

SparseVector topk_select_accumulate(const float* grad, float* residual, int64_t n, int64_t k, TopkSelect select,
                                    const PhiloxStream& rng) {
  return select_accumulate(grad, residual, nullptr, n, k, select, rng);
}

SparseVector topk_select_fold(float* grad, float* residual, int64_t n, int64_t k, TopkSelect select,
                              const PhiloxStream& rng) {
  if (residual == nullptr && n > 0) throw InvalidArgument("topk_select_fold: needs a residual (error feedback)");
  return select_accumulate(grad, residual, grad, n, k, select, rng);
}

SparseVector topk_select(const float* acc, int64_t n, int64_t k, TopkSelect select, const PhiloxStream& rng) {
  return topk_select_accumulate(acc, nullptr, n, k, select, rng);
}

}  // namespace gradcomm::detail
