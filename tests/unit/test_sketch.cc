// Count sketch: the documented hash (compressors/FORMAT.md, "Count sketch hashing")
// pinned by probing, the median estimator, summability across ranks, and heavy-hitter
// recovery from the summed tables of four ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "compressors/codec.h"
#include "compressors/sketch/sketch.h"
#include "compressors/sparse/sparse.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

// The hash exactly as compressors/FORMAT.md, "Count sketch hashing", writes it,
// independently of count_sketch.cc.
struct DocHash {
  uint32_t col;
  float sign;
};
DocHash documented_hash(const PhiloxStream& rng, int r, uint64_t i, int cols) {
  const uint64_t salt = static_cast<uint64_t>(philox_bits(rng, 2 * static_cast<uint64_t>(r))) |
                        static_cast<uint64_t>(philox_bits(rng, 2 * static_cast<uint64_t>(r) + 1)) << 32;
  uint64_t z = i ^ salt;
  z ^= z >> 33;
  z *= 0xFF51AFD7ED558CCDull;
  z ^= z >> 33;
  z *= 0xC4CEB9FE1A85EC53ull;
  z ^= z >> 33;
  return DocHash{static_cast<uint32_t>(((z >> 32) * static_cast<uint64_t>(cols)) >> 32), (z & 1) ? -1.0f : 1.0f};
}

TEST(CountSketch, UnitVectorsHitTheDocumentedCellsAndEstimateExactly) {
  const PhiloxStream rng{17, 23};
  const int rows = 5, cols = 37;
  const CountSketch sketch(rows, cols, rng);
  std::vector<float> x(300, 0.0f);
  for (uint64_t i : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{150}, uint64_t{299}}) {
    std::fill(x.begin(), x.end(), 0.0f);
    x[i] = 2.0f;
    std::vector<float> table(rows * cols, 0.0f);
    sketch.accumulate(x.data(), static_cast<int64_t>(i) + 1, table.data());
    for (int r = 0; r < rows; ++r) {
      const DocHash h = documented_hash(rng, r, i, cols);
      for (int c = 0; c < cols; ++c) {
        ASSERT_EQ(table[r * cols + c], c == static_cast<int>(h.col) ? 2.0f * h.sign : 0.0f)
            << "row " << r << " col " << c << " element " << i;
      }
    }
    std::vector<float> est(i + 1);
    sketch.estimate(table.data(), static_cast<int64_t>(i) + 1, est.data());
    EXPECT_EQ(est[i], 2.0f);
  }
}

// Median over rows, and for an even row count the mean of the two middle values.
TEST(CountSketch, EstimateIsTheMedianOverRows) {
  const PhiloxStream rng{5, 6};
  const int cols = 8;  // tiny: many collisions, so rows disagree
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  std::vector<float> x(200);
  for (auto& v : x) v = normal(gen);
  for (int rows : {1, 2, 3, 4, 7}) {
    SCOPED_TRACE(rows);
    const CountSketch sketch(rows, cols, rng);
    std::vector<float> table(static_cast<size_t>(rows) * cols, 0.0f);
    sketch.accumulate(x.data(), 200, table.data());
    std::vector<float> est(200);
    sketch.estimate(table.data(), 200, est.data());
    for (uint64_t i = 0; i < 200; ++i) {
      std::vector<float> v;
      for (int r = 0; r < rows; ++r) {
        const DocHash h = documented_hash(rng, r, i, cols);
        v.push_back(h.sign * table[static_cast<size_t>(r) * cols + h.col]);
      }
      std::sort(v.begin(), v.end());
      const float want = rows % 2 ? v[rows / 2] : 0.5f * v[rows / 2 - 1] + 0.5f * v[rows / 2];
      ASSERT_EQ(est[i], want) << "element " << i;
    }
  }
}

TEST(CountSketch, TablesOfRanksSumToTheTableOfTheSum) {
  const PhiloxStream rng{1, 2};
  const CountSketch sketch(3, 64, rng);
  std::mt19937 gen(9);
  std::uniform_int_distribution<int> small(-8, 8);  // integers: fp32 sums exact in any order
  std::vector<float> a(5000), b(5000), sum(5000);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(small(gen));
    b[i] = static_cast<float>(small(gen));
    sum[i] = a[i] + b[i];
  }
  std::vector<float> ta(3 * 64, 0.0f), tb(3 * 64, 0.0f), tsum(3 * 64, 0.0f);
  sketch.accumulate(a.data(), 5000, ta.data());
  sketch.accumulate(b.data(), 5000, tb.data());
  sketch.accumulate(sum.data(), 5000, tsum.data());
  for (size_t c = 0; c < ta.size(); ++c) ASSERT_EQ(ta[c] + tb[c], tsum[c]);
  // accumulate does not clear: a second pass of `a` into tb gives the same table.
  sketch.accumulate(a.data(), 5000, tb.data());
  sketch.accumulate(b.data(), 5000, ta.data());
  EXPECT_EQ(ta, tb);
}

TEST(CountSketch, HashesDependOnTheStream) {
  std::vector<float> x(1000, 1.0f);
  std::vector<float> t1(2 * 50, 0.0f), t2(2 * 50, 0.0f), t3(2 * 50, 0.0f);
  CountSketch(2, 50, PhiloxStream{1, 1}).accumulate(x.data(), 1000, t1.data());
  CountSketch(2, 50, PhiloxStream{1, 1}).accumulate(x.data(), 1000, t2.data());
  CountSketch(2, 50, PhiloxStream{2, 1}).accumulate(x.data(), 1000, t3.data());
  EXPECT_EQ(t1, t2);
  EXPECT_NE(t1, t3);
}

TEST(CountSketch, RejectsBadShapes) {
  EXPECT_THROW(CountSketch(0, 10, PhiloxStream{}), InvalidArgument);
  EXPECT_THROW(CountSketch(3, 0, PhiloxStream{}), InvalidArgument);
  EXPECT_THROW(CountSketch(65, 10, PhiloxStream{}), InvalidArgument);
}

// Sketched-SGD's recovery: 4 ranks, each with its own noise and a share of the
// heavy hitters (some planted on one rank only, some split across all four); the
// top-K of |estimate| of the summed table is exactly the planted set.
TEST(CountSketch, SummedTablesOfFourRanksRecoverPlantedHeavyHitters) {
  const int64_t n = 200000;
  const int rows = 5, cols = 4000, world = 4;
  const std::vector<uint64_t> planted = {17, 4242, 50000, 99999, 123456, 150001, 177777, 199999};
  for (uint64_t seed : {uint64_t{1}, uint64_t{2}, uint64_t{3}}) {
    SCOPED_TRACE(seed);
    const CountSketch sketch(rows, cols, PhiloxStream{seed, 77});
    std::vector<float> summed_table(static_cast<size_t>(rows) * cols, 0.0f);
    std::vector<float> truth(n, 0.0f);
    for (int rank = 0; rank < world; ++rank) {
      std::mt19937 gen(static_cast<uint32_t>(seed * 100 + static_cast<uint64_t>(rank)));
      std::normal_distribution<float> noise(0.0f, 0.1f);
      std::vector<float> x(n);
      for (auto& v : x) v = noise(gen);
      for (size_t p = 0; p < planted.size(); ++p) {
        const float sign = p % 2 ? -1.0f : 1.0f;
        if (p < 4) {
          if (static_cast<int>(p) == rank) x[planted[p]] += sign * 60.0f;  // one rank only
        } else {
          x[planted[p]] += sign * 15.0f;  // a quarter from each rank
        }
      }
      for (int64_t i = 0; i < n; ++i) truth[i] += x[i];
      sketch.accumulate(x.data(), n, summed_table.data());
    }
    std::vector<float> est(n);
    sketch.estimate(summed_table.data(), n, est.data());
    const SparseVector top = topk_select(est.data(), n, static_cast<int64_t>(planted.size()), TopkSelect::kExact,
                                         PhiloxStream{});
    EXPECT_EQ(top.indices, planted);

    // Error sanity: the heavy hitters within a few noise sds; the noise estimates
    // within the bucket noise level (sum sd 0.2 * sqrt(n / cols) ~ 1.4).
    for (uint64_t p : planted) EXPECT_NEAR(est[p], truth[p], 5.0f) << p;
    std::vector<float> err(n);
    for (int64_t i = 0; i < n; ++i) err[i] = std::fabs(est[i] - truth[i]);
    std::nth_element(err.begin(), err.begin() + n / 2, err.end());
    EXPECT_LT(err[n / 2], 1.5f) << "median absolute error";
  }
}

}  // namespace
}  // namespace gradcomm::detail
