// Sparse compressors' CPU reference: top-k selection (exact against a sort-based
// reference, sample against its documented bounds), the sparse payload (round trip
// and every kind of corruption, with the output untouched) and random-k indices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "compressors/codec.h"
#include "reduce.h"
#include "compressors/payload.h"
#include "compressors/sparse/topk_logic.h"
#include "compressors/randomk/randomk.h"
#include "compressors/sparse/sparse.h"
#include "gradcomm/errors.h"
#include "half.h"

namespace gradcomm::detail {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const PhiloxStream kRng{0x1234, 0x5678};

// ---- helpers --------------------------------------------------------------------

// Indices ordered by descending |x|, ties to the lower index (stable sort).
std::vector<uint64_t> magnitude_order(const std::vector<float>& x) {
  std::vector<uint64_t> order(x.size());
  std::iota(order.begin(), order.end(), uint64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&x](uint64_t a, uint64_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  return order;
}

std::vector<uint64_t> reference_topk(const std::vector<uint64_t>& order, int64_t k) {
  std::vector<uint64_t> top(order.begin(), order.begin() + std::min<int64_t>(k, static_cast<int64_t>(order.size())));
  std::sort(top.begin(), top.end());
  return top;
}

bool same_bits(float a, float b) { return float_bits(a) == float_bits(b); }

void expect_values_match(const SparseVector& s, const std::vector<float>& x) {
  ASSERT_EQ(s.indices.size(), s.values.size());
  for (size_t j = 0; j < s.indices.size(); ++j) {
    ASSERT_LT(s.indices[j], x.size());
    if (j > 0) ASSERT_LT(s.indices[j - 1], s.indices[j]) << "indices not increasing at " << j;
    ASSERT_TRUE(same_bits(s.values[j], x[s.indices[j]])) << "value of index " << s.indices[j];
  }
}

enum class Fill { kNormal, kTinySet, kSpecials };

std::vector<float> make_input(int64_t n, Fill fill, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> x(static_cast<size_t>(n));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 8);
  const float tiny_set[] = {-2.0f, -1.0f, -0.0f, 0.0f, 1.0f, 2.0f, 0.5f, -0.5f, 1.0f};
  const float specials[] = {kInf, -kInf, 1e-45f, -1e-45f, 1e-40f, -1e-39f, 0.0f, -0.0f, 3.0f};
  for (auto& v : x) {
    switch (fill) {
      case Fill::kNormal: v = normal(gen); break;
      case Fill::kTinySet: v = tiny_set[pick(gen)]; break;
      case Fill::kSpecials: v = pick(gen) < 5 ? specials[pick(gen)] : normal(gen) * 1e-38f; break;
    }
  }
  return x;
}

// ---- topk exact -----------------------------------------------------------------

TEST(TopkExact, MatchesStableSortReference) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1000003}}) {
    for (Fill fill : {Fill::kNormal, Fill::kTinySet, Fill::kSpecials}) {
      const auto x = make_input(n, fill, static_cast<uint32_t>(n) * 3 + static_cast<uint32_t>(fill));
      const auto order = magnitude_order(x);
      for (int64_t k : {int64_t{1}, int64_t{3}, int64_t{100}, n / 2, n - 1, n, n + 5}) {
        if (k < 1) continue;
        SCOPED_TRACE(testing::Message() << "n=" << n << " fill=" << static_cast<int>(fill) << " k=" << k);
        const SparseVector got = topk_select(x.data(), n, k, TopkSelect::kExact, kRng);
        ASSERT_EQ(got.indices, reference_topk(order, k));
        expect_values_match(got, x);
      }
    }
  }
}

TEST(TopkExact, EmptyInputsAndZeroK) {
  const std::vector<float> x = {1.0f, -2.0f};
  EXPECT_TRUE(topk_select(x.data(), 0, 5, TopkSelect::kExact, kRng).indices.empty());
  EXPECT_TRUE(topk_select(x.data(), 2, 0, TopkSelect::kExact, kRng).indices.empty());
  EXPECT_THROW(topk_select(x.data(), 2, -1, TopkSelect::kExact, kRng), InvalidArgument);
}

TEST(TopkExact, AllEqualTakesLowestIndices) {
  const std::vector<float> x(100000, -0.25f);
  const SparseVector got = topk_select(x.data(), 100000, 777, TopkSelect::kExact, kRng);
  ASSERT_EQ(got.indices.size(), 777u);
  for (uint64_t j = 0; j < 777; ++j) ASSERT_EQ(got.indices[j], j);
}

// NaN ranks above every number, +-inf included; NaNs tie among themselves (lower index first).
TEST(TopkExact, NanRanksAsLargestMagnitude) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x(1000, 0.5f);
  x[10] = kInf;
  x[20] = -nan;
  x[30] = -kInf;
  x[40] = nan;
  x[50] = 1e30f;
  const auto top = [&x](int64_t k) { return topk_select(x.data(), 1000, k, TopkSelect::kExact, kRng).indices; };
  EXPECT_EQ(top(1), (std::vector<uint64_t>{20}));
  EXPECT_EQ(top(2), (std::vector<uint64_t>{20, 40}));
  EXPECT_EQ(top(3), (std::vector<uint64_t>{10, 20, 40}));
  EXPECT_EQ(top(4), (std::vector<uint64_t>{10, 20, 30, 40}));
  EXPECT_EQ(top(5), (std::vector<uint64_t>{10, 20, 30, 40, 50}));
  const SparseVector s = topk_select(x.data(), 1000, 2, TopkSelect::kExact, kRng);
  EXPECT_TRUE(std::isnan(s.values[0]) && std::isnan(s.values[1]));
}

// ---- topk sample ----------------------------------------------------------------

// The documented contract: count in [max(1, k/2), min(2k, n)], indices increasing,
// and every element strictly above the smallest selected magnitude is selected.
void check_sample_contract(const std::vector<float>& x, int64_t k, const SparseVector& got) {
  const auto n = static_cast<int64_t>(x.size());
  const auto count = static_cast<int64_t>(got.indices.size());
  ASSERT_GE(count, std::max<int64_t>(1, k / 2));
  ASSERT_LE(count, std::min<int64_t>(2 * k, n));
  expect_values_match(got, x);
  float t = kInf;
  for (float v : got.values) t = std::min(t, std::fabs(v));
  int64_t above = 0;
  for (float v : x) above += std::fabs(v) > t;
  int64_t selected_above = 0;
  for (float v : got.values) selected_above += std::fabs(v) > t;
  ASSERT_EQ(above, selected_above) << "an element above the threshold " << t << " was left out";
}

TEST(TopkSample, CountWithinBoundsAndThresholdRespected) {
  int exactly_k = 0, runs = 0;
  for (int64_t n : {int64_t{1} << 20, int64_t{3000017}}) {
    for (double ratio : {0.01, 0.001}) {
      for (uint64_t seed = 1; seed <= 4; ++seed) {
        const auto k = static_cast<int64_t>(static_cast<double>(n) * ratio);
        SCOPED_TRACE(testing::Message() << "n=" << n << " k=" << k << " seed=" << seed);
        std::mt19937 gen(static_cast<uint32_t>(seed * 7 + static_cast<uint64_t>(n)));
        std::vector<float> x(static_cast<size_t>(n));
        std::student_t_distribution<float> heavy(3.0f);  // heavy tails, like gradients
        for (auto& v : x) v = heavy(gen);
        const SparseVector got = topk_select(x.data(), n, k, TopkSelect::kSample, PhiloxStream{seed, 99});
        check_sample_contract(x, k, got);
        // The estimator itself (not the fallback) should land near k on smooth data.
        const auto count = static_cast<double>(got.indices.size());
        EXPECT_GT(count, 0.7 * static_cast<double>(k));
        EXPECT_LT(count, 1.3 * static_cast<double>(k));
        exactly_k += got.indices.size() == static_cast<size_t>(k);
        ++runs;
      }
    }
  }
  EXPECT_LT(exactly_k, runs / 2) << "the threshold path seems never taken (always the exact fallback)";
}

TEST(TopkSample, HeavyTiesFallBackToExact) {
  const int64_t n = 1 << 20;
  for (Fill fill : {Fill::kTinySet, Fill::kSpecials}) {
    const auto x = make_input(n, fill, 5);
    for (int64_t k : {int64_t{1000}, int64_t{10000}}) {
      const SparseVector got = topk_select(x.data(), n, k, TopkSelect::kSample, kRng);
      check_sample_contract(x, k, got);
    }
  }
  // All equal: the threshold passes everything, far over 2k, so the exact top-k.
  const std::vector<float> same(static_cast<size_t>(n), 1.0f);
  const SparseVector got = topk_select(same.data(), n, 1000, TopkSelect::kSample, kRng);
  ASSERT_EQ(got.indices.size(), 1000u);
  EXPECT_EQ(got.indices.back(), 999u);
}

TEST(TopkSample, SameStreamSameSelection) {
  const auto x = make_input(1 << 20, Fill::kNormal, 11);
  const auto a = topk_select(x.data(), 1 << 20, 1000, TopkSelect::kSample, PhiloxStream{3, 4});
  const auto b = topk_select(x.data(), 1 << 20, 1000, TopkSelect::kSample, PhiloxStream{3, 4});
  EXPECT_EQ(a.indices, b.indices);
}

TEST(TopkSample, SmallInputsAreExact) {
  const auto x = make_input(1000, Fill::kNormal, 2);
  const auto order = magnitude_order(x);
  EXPECT_EQ(topk_select(x.data(), 1000, 10, TopkSelect::kSample, kRng).indices, reference_topk(order, 10));
  EXPECT_EQ(topk_select(x.data(), 1000, 1000, TopkSelect::kSample, kRng).indices.size(), 1000u);
}

// ---- topk with error feedback's accumulation fused in --------------------------
// topk_select_accumulate(grad, residual) must leave residual == grad + residual (the
// same fp32 sums, bit for bit) and select from it exactly what the documented
// algorithms select, whichever internal path runs: the small-input radix select,
// the sampled filter and its two fallbacks (a bound above the k-th key, heavy ties
// at the bound), and select=sample with its own fallbacks. The references here are
// written from the documentation: a stable sort for exact, and for sample the
// rank-ks largest key of the documented sample positions.

uint32_t key_of(float x) { return topk::magnitude_key(x); }

// Indices ordered by descending key (NaN above inf), ties to the lower index.
std::vector<uint64_t> key_order(const std::vector<float>& x) {
  std::vector<uint64_t> order(x.size());
  std::iota(order.begin(), order.end(), uint64_t{0});
  std::stable_sort(order.begin(), order.end(), [&x](uint64_t a, uint64_t b) { return key_of(x[a]) > key_of(x[b]); });
  return order;
}

// `order` = key_order(acc).
std::vector<uint64_t> reference_sample(const std::vector<float>& acc, const std::vector<uint64_t>& order, int64_t k,
                                       const PhiloxStream& rng) {
  const auto n = static_cast<int64_t>(acc.size());
  if (k == 0 || k >= n) return reference_topk(order, k);  // none, or all
  const topk::SamplePlan plan = topk::sample_plan(n, k);
  if (plan.exact) return reference_topk(order, k);
  std::vector<uint32_t> sample;
  for (int64_t j = 0; j < plan.m; ++j) {
    sample.push_back(key_of(acc[topk::sample_position(rng, static_cast<uint64_t>(j), static_cast<uint64_t>(n))]));
  }
  std::sort(sample.begin(), sample.end(), std::greater<>());
  const uint32_t t = sample[static_cast<size_t>(plan.ks - 1)];
  std::vector<uint64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    if (key_of(acc[i]) >= t) out.push_back(static_cast<uint64_t>(i));
  }
  const auto count = static_cast<int64_t>(out.size());
  if (count < plan.lower || count > plan.upper) return reference_topk(order, k);
  return out;
}

// One gradient and residual, with acc = residual + grad and its key order computed once.
struct AccumulateCase {
  std::vector<float> grad, residual, acc;
  std::vector<uint64_t> order;
  AccumulateCase(std::vector<float> g, std::vector<float> r) : grad(std::move(g)), residual(std::move(r)) {
    acc.resize(grad.size());
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = residual[i] + grad[i];
    order = key_order(acc);
  }
};

// Runs topk_select_accumulate on copies and checks the residual and the selection.
void check_accumulate(const AccumulateCase& c, int64_t k, TopkSelect select, const PhiloxStream& rng) {
  const auto n = static_cast<int64_t>(c.grad.size());
  const std::vector<uint64_t> want =
      select == TopkSelect::kExact ? reference_topk(c.order, k) : reference_sample(c.acc, c.order, k, rng);

  // topk_select_accumulate leaves grad as it was; topk_select_fold leaves it all +0.0, on
  // every internal path (the fused pass zeroes it, the others a pass after). Both give
  // the same selection and residual.
  for (bool fold : {false, true}) {
    SCOPED_TRACE(fold ? "topk_select_fold" : "topk_select_accumulate");
    std::vector<float> res = c.residual;
    std::vector<float> grad = c.grad;
    const SparseVector got = fold ? topk_select_fold(grad.data(), res.data(), n, k, select, rng)
                                  : topk_select_accumulate(grad.data(), res.data(), n, k, select, rng);
    ASSERT_EQ(got.indices, want);
    expect_values_match(got, c.acc);
    for (size_t i = 0; i < c.acc.size(); ++i) {
      ASSERT_TRUE(same_bits(res[i], c.acc[i])) << "residual " << i << ": " << res[i] << " != " << c.acc[i];
      ASSERT_TRUE(same_bits(grad[i], fold ? 0.0f : c.grad[i])) << "grad at " << i << ": " << grad[i];
    }
  }
  // No residual: acc is grad itself.
  ASSERT_EQ(topk_select_accumulate(c.acc.data(), nullptr, n, k, select, rng).indices, want);
  ASSERT_EQ(topk_select(c.acc.data(), n, k, select, rng).indices, want);
}

TEST(TopkAccumulate, MatchesAccumulateThenReferenceSelect) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{5000}, int64_t{300007}, int64_t{1} << 20}) {
    for (Fill fill : {Fill::kNormal, Fill::kTinySet, Fill::kSpecials}) {
      const AccumulateCase c(make_input(n, fill, static_cast<uint32_t>(n) + 17 * static_cast<uint32_t>(fill)),
                             make_input(n, Fill::kNormal, static_cast<uint32_t>(n) + 1));
      for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{300}, n / 1000, n / 100, n / 10, n - 1, n, n + 3}) {
        if (k < 0) continue;
        for (TopkSelect select : {TopkSelect::kExact, TopkSelect::kSample}) {
          SCOPED_TRACE(testing::Message() << "n=" << n << " fill=" << static_cast<int>(fill) << " k=" << k
                                          << " select=" << static_cast<int>(select));
          check_accumulate(c, k, select, PhiloxStream{static_cast<uint64_t>(k) + 5, 77});
        }
      }
    }
  }
}

// NaN and inf in the gradient or the residual: NaN keys rank above everything, and
// the residual keeps what fp32 addition makes of them.
TEST(TopkAccumulate, NanAndInfFollowTheKeyOrder) {
  const int64_t n = 1 << 20;
  auto grad = make_input(n, Fill::kNormal, 3);
  auto residual = make_input(n, Fill::kNormal, 4);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 1000; i < n; i += 50021) grad[static_cast<size_t>(i)] = nan;
  for (int64_t i = 7; i < n; i += 70001) residual[static_cast<size_t>(i)] = -kInf;
  residual[123] = kInf;
  grad[123] = -kInf;  // inf - inf: NaN in the accumulator
  const AccumulateCase c(grad, residual);
  for (int64_t k : {int64_t{10}, int64_t{5000}, int64_t{20000}}) {
    for (TopkSelect select : {TopkSelect::kExact, TopkSelect::kSample}) {
      SCOPED_TRACE(testing::Message() << "k=" << k << " select=" << static_cast<int>(select));
      check_accumulate(c, k, select, kRng);
    }
  }
}

// The exact select's sampled filter falls back when its bound lies above the k-th
// key: here every position select=sample would draw holds the largest value (the
// filter samples the first of them), so the bound is that value and at most m < k
// elements reach it (n = 2^20, k = 20000: m = 6711).
TEST(TopkAccumulate, ExactFilterBoundAboveKthKeyFallsBack) {
  const int64_t n = 1 << 20;
  const int64_t k = 20000;
  const topk::SamplePlan plan = topk::sample_plan(n, k);
  ASSERT_FALSE(plan.exact);
  ASSERT_LT(plan.m, k);
  auto grad = make_input(n, Fill::kNormal, 9);
  for (auto& v : grad) v *= 1e-3f;
  for (int64_t j = 0; j < plan.m; ++j) {
    grad[topk::sample_position(kRng, static_cast<uint64_t>(j), static_cast<uint64_t>(n))] = 1000.0f;
  }
  const AccumulateCase c(grad, std::vector<float>(static_cast<size_t>(n), 0.0f));
  check_accumulate(c, k, TopkSelect::kExact, kRng);
  check_accumulate(c, k, TopkSelect::kSample, kRng);  // count < k/2 here too: exact
}

// Heavy ties at the bound (a ninth of the input per value) overflow the filter's
// 4k slots: the radix passes over the whole input take over.
TEST(TopkAccumulate, ExactFilterOverflowFallsBack) {
  const int64_t n = 1 << 20;
  const AccumulateCase c(make_input(n, Fill::kTinySet, 21), std::vector<float>(static_cast<size_t>(n), 0.0f));
  for (int64_t k : {n / 100, n / 1000}) check_accumulate(c, k, TopkSelect::kExact, kRng);
}

// ---- sparse payload -------------------------------------------------------------

constexpr SparseFormat kRaw32{ValueType::kFp32, false};

SparseVector example_sparse() {
  SparseVector v;
  v.indices = {0, 3, 4, 100, 999};
  v.values = {1.5f, -2.25f, 1e-3f, 65504.0f, -7.0f};
  return v;
}

TEST(SparsePayload, Fp32RoundTripIsExactAndAdds) {
  const SparseVector v = example_sparse();
  const auto bytes = encode_sparse(CompressorId::kTopk, 1000, v, kRaw32);
  EXPECT_EQ(bytes.size(), PayloadHeader::kBytes + 5 * 8);
  std::vector<float> out(1000, 1.0f);
  decode_add_sparse(CompressorId::kTopk, bytes, 1000, out.data());
  for (size_t i = 0, j = 0; i < out.size(); ++i) {
    if (j < v.indices.size() && v.indices[j] == i) {
      EXPECT_EQ(out[i], 1.0f + v.values[j++]);
    } else {
      EXPECT_EQ(out[i], 1.0f);
    }
  }
}

TEST(SparsePayload, Fp16ValuesRoundToHalf) {
  const SparseVector v = example_sparse();
  const auto bytes = encode_sparse(CompressorId::kRandomk, 1000, v, SparseFormat{ValueType::kFp16, false});
  EXPECT_EQ(bytes.size(), PayloadHeader::kBytes + 5 * 6);
  std::vector<float> out(1000, 0.0f);
  decode_add_sparse(CompressorId::kRandomk, bytes, 1000, out.data());
  for (size_t j = 0; j < v.indices.size(); ++j) {
    EXPECT_EQ(out[v.indices[j]], half_to_float(float_to_half(v.values[j])));
    EXPECT_NEAR(out[v.indices[j]], v.values[j], std::fabs(v.values[j]) * 1e-3f);
  }
}

TEST(SparsePayload, EmptySelection) {
  const auto bytes = encode_sparse(CompressorId::kTopk, 10, SparseVector{}, kRaw32);
  EXPECT_EQ(bytes.size(), PayloadHeader::kBytes);
  std::vector<float> out(10, 2.0f);
  decode_add_sparse(CompressorId::kTopk, bytes, 10, out.data());
  EXPECT_EQ(out, std::vector<float>(10, 2.0f));
}

// n >= 2^32 switches to u64 indices; small indices let a small buffer stand in.
TEST(SparsePayload, U64IndicesForHugeNumel) {
  const int64_t n = (int64_t{1} << 32) + 5;
  SparseVector v;
  v.indices = {1, 7};
  v.values = {3.0f, 4.0f};
  const auto bytes = encode_sparse(CompressorId::kTopk, n, v, kRaw32);
  EXPECT_EQ(bytes.size(), PayloadHeader::kBytes + 2 * 12);
  uint16_t flags;
  std::memcpy(&flags, bytes.data() + 6, 2);
  EXPECT_EQ(flags, 1u);
  std::vector<float> out(8, 0.0f);
  decode_add_sparse(CompressorId::kTopk, bytes, n, out.data());
  EXPECT_EQ(out[1], 3.0f);
  EXPECT_EQ(out[7], 4.0f);
}

TEST(SparsePayload, EncodeRejectsInvalidSelections) {
  SparseVector v = example_sparse();
  EXPECT_THROW(encode_sparse(CompressorId::kTopk, 999, v, kRaw32), InvalidArgument);  // 999 >= n
  v.indices[2] = 3;
  EXPECT_THROW(encode_sparse(CompressorId::kTopk, 1000, v, kRaw32), InvalidArgument);
  v = example_sparse();
  v.values.pop_back();
  EXPECT_THROW(encode_sparse(CompressorId::kTopk, 1000, v, kRaw32), InvalidArgument);
}

// decode_sum_sparse against its definition: a +0.0-filled output and decode_add_sparse
// per payload in order, compared bit for bit. Payloads overlap (so the order of the
// additions shows), mix fp32 and fp16 values, carry -0.0, inf and NaN, and land on
// both sides of the decoder's internal tiles.
TEST(SparsePayload, DecodeSumMatchesZeroThenAddInOrder) {
  std::mt19937 gen(77);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{16384}, int64_t{16385}, int64_t{100003}}) {
    for (int parts : {0, 1, 3, 5}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " payloads=" << parts);
      std::vector<std::vector<uint8_t>> bytes;
      for (int p = 0; p < parts; ++p) {
        std::bernoulli_distribution pick(p == 0 ? 1.0 : 0.05 * (p + 1));  // the first takes everything
        SparseVector v;
        for (int64_t i = 0; i < n; ++i) {
          if (!pick(gen)) continue;
          v.indices.push_back(static_cast<uint64_t>(i));
          const int kind = static_cast<int>(gen() % 50);
          v.values.push_back(kind == 0 ? -0.0f : kind == 1 ? nan : kind == 2 ? -kInf : normal(gen) * 1e3f);
        }
        bytes.push_back(encode_sparse(CompressorId::kTopk, n, v, p % 2 ? SparseFormat{ValueType::kFp16, p % 3 == 0} : kRaw32));
      }
      std::vector<float> want(static_cast<size_t>(n), 0.0f);
      for (const auto& b : bytes) decode_add_sparse(CompressorId::kTopk, b, n, want.data());
      std::vector<std::span<const uint8_t>> spans(bytes.begin(), bytes.end());
      std::vector<float> got(static_cast<size_t>(n), 123.0f);  // every element must be overwritten
      decode_sum_sparse(CompressorId::kTopk, spans, n, got.data());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
      // With a divisor (the average): the bits of the sum divided afterwards.
      divide_inplace(want.data(), n, DType::kFloat32, 3);
      std::fill(got.begin(), got.end(), 123.0f);
      decode_sum_sparse(CompressorId::kTopk, spans, n, got.data(), 3);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
      // Onto an output the caller zeroed (kZeroed): only the entries are written, each
      // divided once however many payloads carry it, and the bits are the same.
      std::fill(got.begin(), got.end(), 0.0f);
      decode_sum_sparse(CompressorId::kTopk, spans, n, got.data(), 3, SparseOutput::kZeroed);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
      std::vector<float> sum(static_cast<size_t>(n), 0.0f), zeroed(static_cast<size_t>(n), 0.0f);
      for (const auto& b : bytes) decode_add_sparse(CompressorId::kTopk, b, n, sum.data());
      decode_sum_sparse(CompressorId::kTopk, spans, n, zeroed.data(), 1, SparseOutput::kZeroed);
      ASSERT_EQ(std::memcmp(zeroed.data(), sum.data(), sum.size() * sizeof(float)), 0);
    }
  }
}

// kZeroed writes nothing but the payloads' entries: an element no payload carries
// keeps whatever it held (the caller's promise that it is +0.0 is not re-checked).
TEST(SparsePayload, DecodeSumOntoZeroedOutputTouchesOnlyTheEntries) {
  const auto bytes = encode_sparse(CompressorId::kTopk, 1000, example_sparse(), kRaw32);
  const std::vector<std::span<const uint8_t>> spans = {bytes, bytes};
  std::vector<float> out(1000, 0.0f);
  const SparseVector v = example_sparse();
  std::vector<bool> carried(1000, false);
  for (uint64_t i : v.indices) carried[i] = true;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!carried[i]) out[i] = 7.0f;
  }
  decode_sum_sparse(CompressorId::kTopk, spans, 1000, out.data(), 2, SparseOutput::kZeroed);
  for (size_t j = 0; j < v.indices.size(); ++j) {
    EXPECT_EQ(out[v.indices[j]], (v.values[j] + v.values[j]) / 2.0f) << "index " << v.indices[j];
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (!carried[i]) ASSERT_EQ(out[i], 7.0f) << "element " << i << " written";
  }
}

// A corrupt payload anywhere in the list: CorruptPayload and the output untouched,
// even though the payloads before it are valid.
TEST(SparsePayload, DecodeSumValidatesEveryPayloadFirst) {
  const auto good = encode_sparse(CompressorId::kTopk, 1000, example_sparse(), kRaw32);
  auto bad = good;
  bad.pop_back();  // truncated
  for (size_t at = 0; at < 3; ++at) {
    std::vector<std::span<const uint8_t>> spans(3, std::span<const uint8_t>(good));
    spans[at] = bad;
    std::vector<float> out(1000, 0.5f);
    EXPECT_THROW(decode_sum_sparse(CompressorId::kTopk, spans, 1000, out.data()), CorruptPayload);
    EXPECT_EQ(out, std::vector<float>(1000, 0.5f)) << "output written before payload " << at << " was validated";
  }
  // The compressor id is checked too (a random-k payload is not a top-k payload).
  const auto other = encode_sparse(CompressorId::kRandomk, 1000, example_sparse(), kRaw32);
  const std::vector<std::span<const uint8_t>> spans = {good, other};
  std::vector<float> out(1000, 0.5f);
  EXPECT_THROW(decode_sum_sparse(CompressorId::kTopk, spans, 1000, out.data()), CorruptPayload);
}

// Decodes `bytes` into a sentinel-filled buffer and expects CorruptPayload with the
// buffer unchanged.
void expect_corrupt(const std::vector<uint8_t>& bytes, int64_t n = 1000, CompressorId id = CompressorId::kTopk) {
  std::vector<float> out(1000);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(i) * 0.5f;
  const std::vector<float> before = out;
  EXPECT_THROW(decode_add_sparse(id, bytes, n, out.data()), CorruptPayload);
  EXPECT_EQ(std::memcmp(out.data(), before.data(), out.size() * sizeof(float)), 0) << "output written";
}

template <class T>
std::vector<uint8_t> patched(std::vector<uint8_t> bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof value);
  return bytes;
}

TEST(SparsePayload, EveryTruncationIsCorrupt) {
  for (SparseFormat f : {kRaw32, SparseFormat{ValueType::kFp16, false}, SparseFormat{ValueType::kBf16, true},
                         SparseFormat{ValueType::kFp32, true}}) {
    const auto bytes = encode_sparse(CompressorId::kTopk, 1000, example_sparse(), f);
    for (size_t len = 0; len < bytes.size(); ++len) {
      SCOPED_TRACE(len);
      expect_corrupt(std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(len)));
    }
    auto longer = bytes;
    longer.push_back(0);
    expect_corrupt(longer);
  }
}

TEST(SparsePayload, BadIndicesAreCorrupt) {
  const auto bytes = encode_sparse(CompressorId::kTopk, 1000, example_sparse(), kRaw32);
  const size_t idx = PayloadHeader::kBytes + 5 * 4;  // after the five fp32 values
  expect_corrupt(patched<uint32_t>(bytes, idx + 4 * 4, 1000));        // last index == n
  expect_corrupt(patched<uint32_t>(bytes, idx + 4 * 4, 0xFFFFFFFFu));  // far out of range
  expect_corrupt(patched<uint32_t>(bytes, idx + 2 * 4, 3));           // equal to predecessor
  expect_corrupt(patched<uint32_t>(bytes, idx + 1 * 4, 0));           // decreasing
  expect_corrupt(patched<uint32_t>(bytes, idx + 0 * 4, 5));           // first above second
}

TEST(SparsePayload, BadHeaderIsCorrupt) {
  const auto bytes = encode_sparse(CompressorId::kTopk, 1000, example_sparse(), kRaw32);
  expect_corrupt(bytes, 1000, CompressorId::kRandomk);  // wrong id
  expect_corrupt(bytes, 999);                           // wrong numel
  expect_corrupt(patched<uint32_t>(bytes, 0, 0xDEADBEEF));  // magic
  expect_corrupt(patched<uint8_t>(bytes, 4, 2));            // version
  // Counts: one too many, one too few, 2^32 - 1, 2^40 (param1 = 256), 2^63.
  expect_corrupt(patched<uint32_t>(bytes, 16, 6));
  expect_corrupt(patched<uint32_t>(bytes, 16, 4));
  expect_corrupt(patched<uint32_t>(bytes, 16, 0xFFFFFFFFu));
  expect_corrupt(patched<uint32_t>(patched<uint32_t>(bytes, 16, 0), 20, 256));
  expect_corrupt(patched<uint32_t>(bytes, 20, 0x80000000u));
  // Flags: u64 indices for a small n, an unknown bit, fp16 with fp32-sized values.
  expect_corrupt(patched<uint16_t>(bytes, 6, 1));
  expect_corrupt(patched<uint16_t>(bytes, 6, 4));
  expect_corrupt(patched<uint16_t>(bytes, 6, 0x8000));
  expect_corrupt(patched<uint16_t>(bytes, 6, 2));
}

TEST(SparsePayload, HugeNumelRequiresU64Flag) {
  const int64_t n = int64_t{1} << 33;
  SparseVector v;
  v.indices = {2};
  v.values = {1.0f};
  const auto bytes = encode_sparse(CompressorId::kTopk, n, v, kRaw32);
  expect_corrupt(patched<uint16_t>(bytes, 6, 0), n);  // u32 indices claimed for n >= 2^32
  expect_corrupt(patched<uint32_t>(bytes, 16, uint32_t{2}), n);  // count 2, body of one entry
}

// ---- randomk --------------------------------------------------------------------

void expect_valid_indices(const std::vector<uint64_t>& idx, int64_t n, int64_t k) {
  ASSERT_EQ(static_cast<int64_t>(idx.size()), std::min(n, k));
  for (size_t j = 0; j < idx.size(); ++j) {
    ASSERT_LT(idx[j], static_cast<uint64_t>(n));
    if (j > 0) ASSERT_LT(idx[j - 1], idx[j]);
  }
}

TEST(Randomk, ExactlyKDistinctIncreasing) {
  // n / 64 > k takes the hashed set, otherwise the bitmap; both are covered.
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {10, 3}, {1000, 1}, {1000, 10}, {1000, 500}, {1000, 999}, {1000, 1000}, {1000, 2000},
           {1000, 0}, {0, 5}, {1 << 22, 1 << 10}, {1 << 22, 1 << 20}}) {
    SCOPED_TRACE(testing::Message() << "n=" << n << " k=" << k);
    expect_valid_indices(randomk_indices(n, k, kRng), n, k);
  }
}

TEST(Randomk, SameStreamSameIndicesOtherStreamDifferent) {
  for (int64_t k : {int64_t{100}, int64_t{5000}}) {  // hashed and bitmap paths
    const auto a = randomk_indices(100000, k, PhiloxStream{7, 1});
    EXPECT_EQ(a, randomk_indices(100000, k, PhiloxStream{7, 1}));
    EXPECT_NE(a, randomk_indices(100000, k, PhiloxStream{7, 2}));  // next step
    EXPECT_NE(a, randomk_indices(100000, k, PhiloxStream{8, 1}));  // other seed
  }
}

// Per-position frequency over many streams against k/n, by a chi-square statistic.
void check_uniform(int64_t n, int64_t k, int draws) {
  std::vector<int64_t> hits(static_cast<size_t>(n), 0);
  for (int s = 0; s < draws; ++s) {
    for (uint64_t i : randomk_indices(n, k, PhiloxStream{42, static_cast<uint64_t>(s)})) ++hits[i];
  }
  const double expected = static_cast<double>(draws) * static_cast<double>(k) / static_cast<double>(n);
  double chi2 = 0;
  for (int64_t h : hits) chi2 += (static_cast<double>(h) - expected) * (static_cast<double>(h) - expected) / expected;
  // chi2 has about n-1 degrees of freedom (mean n-1, sd sqrt(2(n-1))); allow 6 sd.
  const double dof = static_cast<double>(n - 1);
  EXPECT_LT(chi2, dof + 6 * std::sqrt(2 * dof)) << "n=" << n << " k=" << k;
  EXPECT_GT(chi2, dof - 6 * std::sqrt(2 * dof)) << "suspiciously even: n=" << n << " k=" << k;
}

TEST(Randomk, RoughlyUniformPerPosition) {
  check_uniform(1000, 10, 20000);  // hashed set
  check_uniform(200, 60, 5000);    // bitmap
}

}  // namespace
}  // namespace gradcomm::detail
