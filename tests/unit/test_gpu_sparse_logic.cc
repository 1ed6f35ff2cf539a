// The GPU sparse compressors' arithmetic, checked on the CPU: a host emulation of
// every decomposition the kernels use (radix passes with 256 pick "threads" and
// candidate collection, 4096-element tiles of 256 x 16 items with packed block
// scans, the sample plan, random-k's parallel Floyd, the sketch's per-element
// median) built from the same GRADCOMM_HD functions the kernels call
// (topk_logic.h, randomk_logic.h, sketch_hash.h), held bit for bit to the CPU
// reference in compressors/sparse/sparse.h. Runs everywhere; tests/cuda/test_gpu_sparse.cc runs the
// kernels themselves where a GPU exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "compressors/codec.h"
#include "compressors/randomk/randomk_logic.h"
#include "compressors/sketch/sketch_hash.h"
#include "compressors/sparse/topk_logic.h"
#include "compressors/randomk/randomk.h"
#include "compressors/sketch/sketch.h"
#include "compressors/sparse/sparse.h"
#include "half.h"

namespace gradcomm::detail {
namespace {

using Hist = std::array<unsigned long long, topk::kRadixBuckets>;
constexpr int64_t kTileThreads = 256, kTileItems = 16, kTile = kTileThreads * kTileItems;

// ---- emulation of compressors/sparse/radix_select.cuh ---------------------------------------------
struct Emulated {
  uint32_t threshold = 0;
  uint64_t take_equal = 0;
};

// pick_kernel: 256 threads, chunk sums, exclusive scan, the one crossing thread.
void pick(const Hist& hist, int pass, uint32_t& prefix, uint32_t& mask, int64_t& need, uint64_t* in_bucket) {
  const uint32_t top = topk::digit_top(pass);
  uint64_t before = 0;
  int found = 0;
  for (int t = 0; t < topk::kPickThreads; ++t) {
    uint32_t bucket = 0;
    int64_t inside = 0;
    if (topk::pick_in_chunk(hist.data(), top, t, before, need, &bucket, &inside)) {
      ++found;
      prefix |= bucket << topk::digit_shift(pass);
      mask = topk::mask_after(pass);
      *in_bucket = hist[bucket];
      need = inside;
    }
    before += topk::pick_chunk_sum(hist.data(), top, t);
  }
  ASSERT_EQ(found, 1) << "pass " << pass << ": exactly one pick thread must find the bucket";
}

// histogram_kernel x3 + pick_kernel x3; pass 1 collects pass 0's bucket when it has
// <= n/16 keys (in a scrambled order, as warps append them) and pass 2 reads those.
Emulated radix_select(const std::vector<uint32_t>& keys, int64_t need, bool collect_allowed) {
  const auto n = static_cast<int64_t>(keys.size());
  uint32_t prefix = 0, mask = 0;
  std::vector<uint32_t> cand;
  bool collect = false;
  uint64_t in_bucket = 0;
  for (int pass = 0; pass < topk::kRadixPasses; ++pass) {
    Hist hist{};
    const bool from_cand = pass == 2 && collect;
    const int64_t count = from_cand ? static_cast<int64_t>(cand.size()) : n;
    for (int64_t i = 0; i < count; ++i) {
      const uint32_t key = from_cand ? cand[static_cast<size_t>(i)] : keys[static_cast<size_t>(i)];
      if (!topk::prefix_matches(key, prefix, mask)) continue;
      ++hist[topk::digit_of(key, pass)];
      if (pass == 1 && collect) cand.push_back(key);
    }
    if (pass == 1 && collect) std::reverse(cand.begin(), cand.end());  // order must not matter
    pick(hist, pass, prefix, mask, need, &in_bucket);
    if (pass == 0) collect = collect_allowed && in_bucket <= static_cast<uint64_t>(n / 16);
  }
  return Emulated{prefix, static_cast<uint64_t>(need)};
}

// tile_count_kernel + scan + tile_scatter_kernel: per tile, per thread 16 items.
SparseVector compact(const std::vector<float>& acc, const Emulated& t, uint64_t* count) {
  const auto n = static_cast<int64_t>(acc.size());
  const int64_t tiles = (n + kTile - 1) / kTile;
  std::vector<std::pair<uint64_t, uint64_t>> offsets(static_cast<size_t>(tiles));
  uint64_t gt_total = 0, eq_total = 0;
  for (int64_t b = 0; b < tiles; ++b) {
    offsets[static_cast<size_t>(b)] = {gt_total, eq_total};
    uint32_t packed = 0;  // the packed (gt << 16 | eq) block total
    for (int64_t i = b * kTile; i < std::min(n, (b + 1) * kTile); ++i) {
      const uint32_t key = topk::magnitude_key(acc[static_cast<size_t>(i)]);
      packed += ((key > t.threshold ? 1u : 0u) << 16) | (key == t.threshold ? 1u : 0u);
    }
    gt_total += packed >> 16;
    eq_total += packed & 0xFFFFu;
  }
  *count = topk::compact_count(gt_total, eq_total, t.take_equal);
  SparseVector out;
  out.indices.assign(*count, ~uint64_t{0});
  out.values.assign(*count, 0.0f);
  for (int64_t b = 0; b < tiles; ++b) {
    uint32_t packed_before = 0;  // exclusive block scan over threads
    for (int64_t th = 0; th < kTileThreads; ++th) {
      const int64_t first = b * kTile + th * kTileItems;
      uint32_t mine = 0;
      for (int64_t j = 0; j < kTileItems && first + j < n; ++j) {
        const uint32_t key = topk::magnitude_key(acc[static_cast<size_t>(first + j)]);
        mine += ((key > t.threshold ? 1u : 0u) << 16) | (key == t.threshold ? 1u : 0u);
      }
      uint64_t gt_before = offsets[static_cast<size_t>(b)].first + (packed_before >> 16);
      uint64_t eq_before = offsets[static_cast<size_t>(b)].second + (packed_before & 0xFFFFu);
      for (int64_t j = 0; j < kTileItems && first + j < n; ++j) {
        const float v = acc[static_cast<size_t>(first + j)];
        const uint32_t key = topk::magnitude_key(v);
        const int64_t slot = topk::compact_slot(key, t.threshold, t.take_equal, gt_before, eq_before);
        if (slot >= 0) {
          EXPECT_LT(static_cast<uint64_t>(slot), *count);
          EXPECT_EQ(out.indices[static_cast<size_t>(slot)], ~uint64_t{0}) << "slot " << slot << " written twice";
          out.indices[static_cast<size_t>(slot)] = static_cast<uint64_t>(first + j);
          out.values[static_cast<size_t>(slot)] = v;
        }
        gt_before += key > t.threshold;
        eq_before += key == t.threshold;
      }
      packed_before += mine;
    }
  }
  return out;
}

std::vector<uint32_t> keys_of(const std::vector<float>& acc) {
  std::vector<uint32_t> keys(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) keys[i] = topk::magnitude_key(acc[i]);
  return keys;
}

SparseVector emulate_exact(const std::vector<float>& acc, int64_t k) {
  const Emulated t = radix_select(keys_of(acc), k, true);
  uint64_t count = 0;
  SparseVector out = compact(acc, t, &count);
  EXPECT_EQ(count, static_cast<uint64_t>(k));
  return out;
}

// gpu_topk_select's whole decision tree (1 <= k < n).
SparseVector emulate_topk(const std::vector<float>& acc, int64_t k, TopkSelect mode, const PhiloxStream& rng) {
  const auto n = static_cast<int64_t>(acc.size());
  if (mode == TopkSelect::kExact) return emulate_exact(acc, k);
  const topk::SamplePlan plan = topk::sample_plan(n, k);
  if (plan.exact) return emulate_exact(acc, k);
  std::vector<uint32_t> sample(static_cast<size_t>(plan.m));
  for (int64_t j = 0; j < plan.m; ++j) {
    sample[static_cast<size_t>(j)] = topk::magnitude_key(
        acc[topk::sample_position(rng, static_cast<uint64_t>(j), static_cast<uint64_t>(n))]);
  }
  Emulated t = radix_select(sample, plan.ks, false);
  t.take_equal = topk::kTakeAllEqual;
  uint64_t count = 0;
  SparseVector out = compact(acc, t, &count);
  if (count >= static_cast<uint64_t>(plan.lower) && count <= static_cast<uint64_t>(plan.upper)) return out;
  return emulate_exact(acc, k);
}

void expect_same(const SparseVector& got, const SparseVector& want, const char* what) {
  ASSERT_EQ(got.indices.size(), want.indices.size()) << what;
  EXPECT_EQ(got.indices, want.indices) << what;
  ASSERT_EQ(got.values.size(), want.values.size()) << what;
  EXPECT_EQ(0, std::memcmp(got.values.data(), want.values.data(), want.values.size() * sizeof(float))) << what;
}

// Inputs: gaussian, values from a tiny set (heavy ties), specials.
std::vector<float> make_input(int64_t n, int kind, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) {
    switch (kind) {
      case 0: v = normal(gen); break;
      case 1: v = static_cast<float>(static_cast<int>(gen() % 5) - 2) * 0.5f; break;  // {-1, -0.5, 0, 0.5, 1}
      default: {
        const uint64_t r = gen() % 16;
        v = r == 0 ? std::numeric_limits<float>::quiet_NaN()
            : r == 1 ? -std::numeric_limits<float>::infinity()
            : r == 2 ? -0.0f
            : r == 3 ? std::numeric_limits<float>::denorm_min() * static_cast<float>(gen() % 4)
                     : normal(gen);
      }
    }
  }
  return x;
}

const PhiloxStream kRng{0xC0FFEE, 0x1234};

TEST(GpuSparseLogic, RadixPickMatchesTopkSelectExact) {
  for (int64_t n : {1, 7, 1000, 1000003}) {
    for (int kind = 0; kind < 3; ++kind) {
      const std::vector<float> acc = make_input(n, kind, static_cast<uint64_t>(n * 3 + kind));
      for (int64_t k : {int64_t{1}, int64_t{2}, n / 100, n / 3, n - 1}) {
        if (k < 1 || k >= n) continue;
        SCOPED_TRACE(testing::Message() << "n=" << n << " kind=" << kind << " k=" << k);
        expect_same(emulate_topk(acc, k, TopkSelect::kExact, kRng),
                    topk_select(acc.data(), n, k, TopkSelect::kExact, kRng), "exact");
      }
    }
  }
}

TEST(GpuSparseLogic, SamplePlanAndThresholdMatchTopkSelectSample) {
  for (int64_t n : {1000, 5000, 1000003}) {
    for (int kind = 0; kind < 3; ++kind) {
      const std::vector<float> acc = make_input(n, kind, static_cast<uint64_t>(n + kind));
      for (int64_t k : {int64_t{1}, int64_t{3}, n / 1000, n / 100, n / 10}) {
        if (k < 1 || k >= n) continue;
        SCOPED_TRACE(testing::Message() << "n=" << n << " kind=" << kind << " k=" << k);
        const PhiloxStream rng{static_cast<uint64_t>(k), static_cast<uint64_t>(n)};
        expect_same(emulate_topk(acc, k, TopkSelect::kSample, rng), topk_select(acc.data(), n, k, TopkSelect::kSample, rng),
                    "sample");
      }
    }
  }
}

TEST(GpuSparseLogic, AllEqualKeysTakeTheLowestIndices) {
  const std::vector<float> acc(10000, -2.0f);  // every key ties
  for (int64_t k : {1, 17, 4096, 4097, 9999}) {
    const SparseVector got = emulate_exact(acc, k);
    std::vector<uint64_t> want(static_cast<size_t>(k));
    std::iota(want.begin(), want.end(), uint64_t{0});
    EXPECT_EQ(got.indices, want) << "k=" << k;
  }
}

TEST(GpuSparseLogic, CompactSlotRanksInIndexOrder) {
  // keys 5 > T=3 take gt_before + min(eq_before, take); ties only while eq_before < take.
  EXPECT_EQ(topk::compact_slot(5, 3, 2, 10, 7), 12);
  EXPECT_EQ(topk::compact_slot(5, 3, 2, 10, 1), 11);
  EXPECT_EQ(topk::compact_slot(3, 3, 2, 10, 1), 11);
  EXPECT_EQ(topk::compact_slot(3, 3, 2, 10, 2), -1);
  EXPECT_EQ(topk::compact_slot(2, 3, 2, 10, 0), -1);
  EXPECT_EQ(topk::compact_slot(3, 3, topk::kTakeAllEqual, 4, 100), 104);
  EXPECT_EQ(topk::compact_count(4, 100, topk::kTakeAllEqual), 104u);
  EXPECT_EQ(topk::compact_count(4, 100, 3), 7u);
  EXPECT_EQ(topk::magnitude_key(-std::numeric_limits<float>::quiet_NaN()), topk::kNanKey);
  EXPECT_EQ(topk::magnitude_key(-0.0f), 0u);
}

// ---- random-k: the parallel Floyd of gpu_randomk.cu ---------------------------------
std::vector<uint64_t> emulate_randomk(int64_t n, int64_t k, const PhiloxStream& rng, int64_t* rejections) {
  const auto un = static_cast<uint64_t>(n);
  const uint64_t base = un - static_cast<uint64_t>(k);
  std::vector<uint64_t> t(static_cast<size_t>(k));
  std::vector<uint64_t> rejected;
  for (int64_t d = 0; d < k; ++d) {  // draw_kernel (order of the rejected list scrambled below)
    uint64_t v = 0;
    if (!randomk::lemire_map(randomk::draw_bits64(rng, static_cast<uint64_t>(d)), base + d + 1, &v)) {
      v = ~uint64_t{0};
      rejected.push_back(static_cast<uint64_t>(d));
    }
    t[static_cast<size_t>(d)] = v;
  }
  *rejections = static_cast<int64_t>(rejected.size());
  std::reverse(rejected.begin(), rejected.end());
  std::sort(rejected.begin(), rejected.end());  // fixup_kernel
  uint64_t spare = static_cast<uint64_t>(k);
  for (uint64_t d : rejected) {
    uint64_t v = 0;
    while (!randomk::lemire_map(randomk::draw_bits64(rng, spare++), base + d + 1, &v)) {
    }
    t[d] = v;
  }
  std::vector<std::pair<uint64_t, uint32_t>> pairs(static_cast<size_t>(k));  // stable sort by t
  for (int64_t d = 0; d < k; ++d) pairs[static_cast<size_t>(d)] = {t[static_cast<size_t>(d)], static_cast<uint32_t>(d)};
  std::stable_sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<uint8_t> dup(static_cast<size_t>(k));
  for (size_t p = 0; p < pairs.size(); ++p) dup[pairs[p].second] = p > 0 && pairs[p].first == pairs[p - 1].first;
  std::vector<uint64_t> v(static_cast<size_t>(k));
  for (int64_t d = 0; d < k; ++d) {
    v[static_cast<size_t>(d)] = randomk::floyd_collided(static_cast<uint64_t>(d), base, dup.data(), t.data())
                                    ? base + static_cast<uint64_t>(d)
                                    : t[static_cast<size_t>(d)];
  }
  std::sort(v.begin(), v.end());
  return v;
}

TEST(GpuSparseLogic, ParallelFloydMatchesRandomkIndices) {
  int64_t total_rejections = 0;
  struct Case {
    int64_t n, k;
  };
  const Case cases[] = {{2, 1},       {7, 3},       {7, 6},         {1000, 10},   {1000, 999},  {1000, 500},
                        {1000003, 10000}, {1000003, 999000}, {4194309, 41943},
                        // n near 2^63: 2^64 mod range is huge, so about half the draws are
                        // rejected and take spares: the fix-up order must match the CPU's.
                        {std::numeric_limits<int64_t>::max() - 5, 1000},
                        {(int64_t{1} << 62) + 12345, 300}};
  for (const Case& c : cases) {
    for (uint64_t seed : {1ull, 77ull}) {
      const PhiloxStream rng{seed, static_cast<uint64_t>(c.n)};
      int64_t rejections = 0;
      const std::vector<uint64_t> got = emulate_randomk(c.n, c.k, rng, &rejections);
      total_rejections += rejections;
      EXPECT_EQ(got, randomk_indices(c.n, c.k, rng)) << "n=" << c.n << " k=" << c.k << " seed=" << seed;
    }
  }
  EXPECT_GT(total_rejections, 100) << "the huge-n cases must exercise the rejection fix-up";
}

// ---- count sketch ---------------------------------------------------------------------
TEST(GpuSparseLogic, SketchPerElementKernelsMatchCountSketch) {
  for (int rows : {1, 2, 5, 8}) {
    const int cols = 97;
    const int64_t n = 20000;
    const PhiloxStream rng{static_cast<uint64_t>(rows), 99};
    const std::vector<float> x = make_input(n, 0, static_cast<uint64_t>(rows));
    const CountSketch cpu(rows, cols, rng);
    std::vector<float> want_table(static_cast<size_t>(rows) * cols, 0.0f);
    cpu.accumulate(x.data(), n, want_table.data());
    // accumulate_*_kernel's per-element work, applied in index order within each row.
    std::vector<float> table(want_table.size(), 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      for (int r = 0; r < rows; ++r) {
        const uint64_t z = sketch::element_hash(sketch::row_salt(rng, r), static_cast<uint64_t>(i));
        table[static_cast<size_t>(r) * cols + sketch::column_of(z, cols)] += sketch::apply_sign(z, x[static_cast<size_t>(i)]);
      }
    }
    EXPECT_EQ(0, std::memcmp(table.data(), want_table.data(), table.size() * sizeof(float))) << "rows=" << rows;
    // estimate_kernel's per-element work.
    std::vector<float> want(static_cast<size_t>(n));
    cpu.estimate(want_table.data(), n, want.data());
    for (int64_t i = 0; i < n; ++i) {
      float v[sketch::kMaxRows];
      for (int r = 0; r < rows; ++r) {
        const uint64_t z = sketch::element_hash(sketch::row_salt(rng, r), static_cast<uint64_t>(i));
        v[r] = sketch::apply_sign(z, want_table[static_cast<size_t>(r) * cols + sketch::column_of(z, cols)]);
      }
      sketch::sort_small(v, rows);
      const float got = sketch::median_of_sorted(v, rows);
      ASSERT_EQ(float_bits(got), float_bits(want[static_cast<size_t>(i)])) << "rows=" << rows << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace gradcomm::detail
