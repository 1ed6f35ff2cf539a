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
#include "compressors/payload.h"
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

// ---- sparse payload -------------------------------------------------------------

SparseVector example_sparse() {
  SparseVector v;
  v.indices = {0, 3, 4, 100, 999};
  v.values = {1.5f, -2.25f, 1e-3f, 65504.0f, -7.0f};
  return v;
}

TEST(SparsePayload, Fp32RoundTripIsExactAndAdds) {
  const SparseVector v = example_sparse();
  const auto bytes = encode_sparse(CompressorId::kTopk, 1000, v, ValueType::kFp32);
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
  const auto bytes = encode_sparse(CompressorId::kRandomk, 1000, v, ValueType::kFp16);
  EXPECT_EQ(bytes.size(), PayloadHeader::kBytes + 5 * 6);
  std::vector<float> out(1000, 0.0f);
  decode_add_sparse(CompressorId::kRandomk, bytes, 1000, out.data());
  for (size_t j = 0; j < v.indices.size(); ++j) {
    EXPECT_EQ(out[v.indices[j]], half_to_float(float_to_half(v.values[j])));
    EXPECT_NEAR(out[v.indices[j]], v.values[j], std::fabs(v.values[j]) * 1e-3f);
  }
}

TEST(SparsePayload, EmptySelection) {
  const auto bytes = encode_sparse(CompressorId::kTopk, 10, SparseVector{}, ValueType::kFp32);
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
  const auto bytes = encode_sparse(CompressorId::kTopk, n, v, ValueType::kFp32);
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
  EXPECT_THROW(encode_sparse(CompressorId::kTopk, 999, v, ValueType::kFp32), InvalidArgument);  // 999 >= n
  v.indices[2] = 3;
  EXPECT_THROW(encode_sparse(CompressorId::kTopk, 1000, v, ValueType::kFp32), InvalidArgument);
  v = example_sparse();
  v.values.pop_back();
  EXPECT_THROW(encode_sparse(CompressorId::kTopk, 1000, v, ValueType::kFp32), InvalidArgument);
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
  for (ValueType vt : {ValueType::kFp32, ValueType::kFp16}) {
    const auto bytes = encode_sparse(CompressorId::kTopk, 1000, example_sparse(), vt);
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
  const auto bytes = encode_sparse(CompressorId::kTopk, 1000, example_sparse(), ValueType::kFp32);
  const size_t idx = PayloadHeader::kBytes;
  expect_corrupt(patched<uint32_t>(bytes, idx + 4 * 4, 1000));        // last index == n
  expect_corrupt(patched<uint32_t>(bytes, idx + 4 * 4, 0xFFFFFFFFu));  // far out of range
  expect_corrupt(patched<uint32_t>(bytes, idx + 2 * 4, 3));           // equal to predecessor
  expect_corrupt(patched<uint32_t>(bytes, idx + 1 * 4, 0));           // decreasing
  expect_corrupt(patched<uint32_t>(bytes, idx + 0 * 4, 5));           // first above second
}

TEST(SparsePayload, BadHeaderIsCorrupt) {
  const auto bytes = encode_sparse(CompressorId::kTopk, 1000, example_sparse(), ValueType::kFp32);
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
  const auto bytes = encode_sparse(CompressorId::kTopk, n, v, ValueType::kFp32);
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
