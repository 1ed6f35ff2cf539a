// Coded sparse payloads (compressors/sparse/sparse_code.h, FORMAT.md "Sparse payload"):
// Elias–Fano indices and 16-bit values round-trip for every n and count, the sizes are
// the formula's, and every malformed payload is refused without writing the output.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>

#include "compressors/codec.h"
#include "compressors/payload.h"
#include "compressors/sparse/sparse_code.h"
#include "compressors/sparse/sparse.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

constexpr SparseFormat kFormats[] = {
    {ValueType::kFp32, true}, {ValueType::kFp16, true}, {ValueType::kBf16, true},
    {ValueType::kFp32, false}, {ValueType::kBf16, false},
};

// `count` distinct indices below n, increasing, with values of every kind.
SparseVector random_selection(uint64_t n, uint64_t count, std::mt19937_64& gen) {
  SparseVector v;
  if (count * 2 >= n) {  // dense: drop n - count of all
    std::vector<uint64_t> all(n);
    for (uint64_t i = 0; i < n; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), gen);
    all.resize(count);
    std::sort(all.begin(), all.end());
    v.indices = all;
  } else {
    std::set<uint64_t> picked;
    std::uniform_int_distribution<uint64_t> pick(0, n - 1);
    while (picked.size() < count) picked.insert(pick(gen));
    v.indices.assign(picked.begin(), picked.end());
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t j = 0; j < v.indices.size(); ++j) v.values.push_back(normal(gen) * std::ldexp(1.0f, int(j % 40) - 20));
  return v;
}

// What a decoder must give back: the indices, and the values as the format rounds them.
void expect_round_trip(uint64_t n, const SparseVector& v, SparseFormat f) {
  const auto bytes = encode_sparse(CompressorId::kTopk, static_cast<int64_t>(n), v, f);
  ASSERT_EQ(bytes.size(), sparse_payload_bytes(static_cast<int64_t>(n), static_cast<int64_t>(v.indices.size()), f));
  const SparseVector got = decode_sparse(CompressorId::kTopk, bytes, static_cast<int64_t>(n));
  ASSERT_EQ(got.indices, v.indices);
  ASSERT_EQ(got.values.size(), v.values.size());
  for (size_t j = 0; j < v.values.size(); ++j) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got.values[j]), std::bit_cast<uint32_t>(sparse_round(v.values[j], f.values)));
  }
}

TEST(CodedSparse, RoundTripsForEveryCountOfSmallN) {
  std::mt19937_64 gen(5);
  for (uint64_t n : {1, 2, 3, 5, 7, 8, 9, 63, 64, 65, 127, 128, 129, 1000}) {
    for (uint64_t count = 0; count <= n; count += (n > 130 ? 37 : 1)) {
      for (SparseFormat f : kFormats) {
        SCOPED_TRACE(testing::Message() << "n=" << n << " count=" << count << " coded=" << f.coded);
        expect_round_trip(n, random_selection(n, count, gen), f);
      }
    }
    for (SparseFormat f : kFormats) expect_round_trip(n, random_selection(n, n, gen), f);  // count = n
  }
}

TEST(CodedSparse, RoundTripsForLargeAndExtremeShapes) {
  std::mt19937_64 gen(6);
  const uint64_t big = uint64_t{1} << 32;
  struct Case {
    uint64_t n, count;
  };
  for (Case c : {Case{100003, 1}, Case{100003, 1000}, Case{1 << 20, 10486}, Case{1 << 20, (1 << 20) - 1},
                 Case{big - 1, 5}, Case{big, 3}, Case{big + 5, 100}, Case{uint64_t{1} << 40, 1000},
                 Case{(uint64_t{1} << 62) + 12345, 7}}) {
    SCOPED_TRACE(testing::Message() << "n=" << c.n << " count=" << c.count);
    SparseVector v = random_selection(c.n, c.count, gen);
    // The extremes of the index space are representable.
    v.indices.front() = 0;
    v.indices.back() = c.n - 1;
    for (SparseFormat f : kFormats) expect_round_trip(c.n, v, f);
  }
}

// L = floor(log2(n / count)): about L + 2 bits per index, never more than L + 3.
TEST(CodedSparse, SizeIsAboutLog2OfNOverKPlusTwoBitsPerIndex) {
  for (auto [n, count] : {std::pair<uint64_t, uint64_t>{1 << 20, 10486}, {25 << 20, 262144}, {1000, 1000}, {1000, 1}}) {
    const EliasFanoLayout ef = elias_fano_layout(n, count);
    EXPECT_EQ(ef.low_bits, static_cast<unsigned>(std::floor(std::log2(static_cast<double>(n / count)))));
    const double bits = 8.0 * static_cast<double>(ef.low_bytes + ef.high_bytes) / static_cast<double>(count);
    EXPECT_LE(bits, ef.low_bits + 3.0 + 16.0 / static_cast<double>(count)) << n << " " << count;
    EXPECT_EQ(sparse_payload_bytes(static_cast<int64_t>(n), static_cast<int64_t>(count), {ValueType::kBf16, true}),
              PayloadHeader::kBytes + 2 * count + ef.low_bytes + ef.high_bytes);
  }
  // 1 % of 25M elements: 16 + 8.6 bits per entry, against 64 raw.
  const double n = 25 << 20, k = 262144;
  const double coded = static_cast<double>(sparse_payload_bytes(int64_t(n), int64_t(k), {ValueType::kBf16, true}));
  const double raw = static_cast<double>(sparse_payload_bytes(int64_t(n), int64_t(k), {ValueType::kFp32, false}));
  EXPECT_LT(coded * 2.5, raw);
}

// Values: bf16 keeps fp32's range, fp16 overflows to inf past 65504, NaN stays NaN.
TEST(CodedSparse, SixteenBitValuesRoundToNearestEven) {
  SparseVector v;
  v.indices = {0, 1, 2, 3, 4};
  v.values = {1e30f, 70000.0f, -0.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f + 1.0f / 512};
  const auto bf = decode_sparse(CompressorId::kTopk, encode_sparse(CompressorId::kTopk, 5, v, {ValueType::kBf16, true}), 5);
  EXPECT_NEAR(bf.values[0], 1e30f, 1e30f / 128);
  EXPECT_TRUE(std::signbit(bf.values[2]));
  EXPECT_TRUE(std::isnan(bf.values[3]));
  EXPECT_EQ(bf.values[4], 1.0f);  // bf16 steps by 2^-7 at 1: 1 + 2^-9 rounds down
  const auto h = decode_sparse(CompressorId::kTopk, encode_sparse(CompressorId::kTopk, 5, v, {ValueType::kFp16, true}), 5);
  EXPECT_TRUE(std::isinf(h.values[1]));
  EXPECT_EQ(h.values[4], 1.0f + 1.0f / 512);
  // Error feedback keeps the rounding, and nothing non-finite.
  EXPECT_EQ(sparse_rounding_residual(v.values[4], bf.values[4]), 1.0f / 512);
  EXPECT_EQ(sparse_rounding_residual(v.values[1], h.values[1]), 0.0f);  // sent as inf: nothing kept
  EXPECT_EQ(sparse_rounding_residual(v.values[3], bf.values[3]), 0.0f);
}

void expect_corrupt(const std::vector<uint8_t>& bytes, int64_t n) {
  std::vector<float> out(static_cast<size_t>(std::min<int64_t>(n, 4096)), 0.25f);
  const std::vector<float> before = out;
  EXPECT_THROW(decode_add_sparse(CompressorId::kTopk, bytes, n, out.data()), CorruptPayload);
  EXPECT_EQ(out, before) << "output written before the payload was refused";
}

SparseVector example(uint64_t n, uint64_t count) {
  std::mt19937_64 gen(n * 31 + count);
  return random_selection(n, count, gen);
}

TEST(CodedSparse, EveryTruncationAndExtensionIsCorrupt) {
  for (SparseFormat f : kFormats) {
    const auto bytes = encode_sparse(CompressorId::kTopk, 1000, example(1000, 37), f);
    for (size_t len = 0; len < bytes.size(); ++len) {
      expect_corrupt(std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(len)), 1000);
    }
    auto longer = bytes;
    longer.push_back(0);
    expect_corrupt(longer, 1000);
  }
}

// Any bit flipped in the high section changes its number of one bits: always refused.
// A flipped low bit may give another valid selection; then it must decode to strictly
// increasing indices below n, and never write out of bounds.
TEST(CodedSparse, BitFlipsInTheIndexSectionsAreRefusedOrStayInBounds) {
  const uint64_t n = 1000, count = 37;
  const SparseFormat f{ValueType::kBf16, true};
  const auto bytes = encode_sparse(CompressorId::kTopk, n, example(n, count), f);
  const SparseLayout lay = sparse_layout(n, count, f.values, true);
  for (uint64_t bit = lay.indices_offset * 8; bit < lay.total * 8; ++bit) {
    auto flipped = bytes;
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    if (bit >= lay.high_offset * 8) {
      expect_corrupt(flipped, static_cast<int64_t>(n));
      continue;
    }
    try {
      const SparseVector v = decode_sparse(CompressorId::kTopk, flipped, static_cast<int64_t>(n));
      for (size_t j = 0; j < v.indices.size(); ++j) {
        ASSERT_LT(v.indices[j], n);
        if (j > 0) ASSERT_LT(v.indices[j - 1], v.indices[j]);
      }
    } catch (const CorruptPayload&) {
    }
  }
}

template <class T>
std::vector<uint8_t> patched(std::vector<uint8_t> bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof value);
  return bytes;
}

TEST(CodedSparse, MalformedHeadersAndPaddingAreCorrupt) {
  const uint64_t n = 1000, count = 37;
  const SparseFormat f{ValueType::kBf16, true};
  const auto bytes = encode_sparse(CompressorId::kTopk, n, example(n, count), f);
  uint16_t flags;
  std::memcpy(&flags, bytes.data() + 6, 2);
  ASSERT_EQ(flags, kSparseFlagBf16Values | kSparseFlagCodedIndices);
  expect_corrupt(patched<uint16_t>(bytes, 6, flags | kSparseFlagFp16Values), n);   // two value types
  expect_corrupt(patched<uint16_t>(bytes, 6, flags & ~kSparseFlagCodedIndices), n);  // raw: wrong size
  expect_corrupt(patched<uint16_t>(bytes, 6, flags | 0x10), n);                    // unknown bit
  expect_corrupt(patched<uint16_t>(bytes, 6, flags | kSparseFlagU64Indices), n);    // u64 for a small n
  // Counts that cannot match the body, including ones that would overflow its size.
  for (uint32_t c : {36u, 38u, 0u, 0xFFFFFFFFu}) expect_corrupt(patched<uint32_t>(bytes, 16, c), n);
  expect_corrupt(patched<uint32_t>(bytes, 20, 1u), n);
  expect_corrupt(patched<uint32_t>(bytes, 20, 0x80000000u), n);
  // Padding after the high section (the last byte's unused bits) must be zero.
  const SparseLayout lay = sparse_layout(n, count, f.values, true);
  ASSERT_NE(lay.ef.high_bits % 8, 0u) << "pick a case with padding";
  auto padded = bytes;
  padded.back() |= 0x80;
  expect_corrupt(padded, n);
  // Padding after the low section, where it has some.
  if ((count * lay.ef.low_bits) % 8 != 0) {
    auto low = bytes;
    low[lay.high_offset - 1] |= 0x80;
    expect_corrupt(low, n);
  }
}

// A high section whose one bits decode to an index >= n (the last high value is
// (n-1) >> L, but its bucket may reach past n - 1) or to equal indices.
TEST(CodedSparse, OutOfRangeAndRepeatedIndicesAreCorrupt) {
  const uint64_t n = 1000;
  const SparseFormat f{ValueType::kFp32, true};
  SparseVector v;
  v.indices = {10, 999};
  v.values = {1.0f, 2.0f};
  const auto good = encode_sparse(CompressorId::kTopk, n, v, f);
  const SparseLayout lay = sparse_layout(n, 2, f.values, true);  // L = 8
  ASSERT_EQ(lay.ef.low_bits, 8u);
  // The low byte of 999 (0xE7) raised to 0xFF: 3 * 256 + 255 = 1023 >= n.
  expect_corrupt(patched<uint8_t>(good, lay.indices_offset + 1, 0xFF), n);
  // Both indices in bucket 0 with the same low bits: 10, 10.
  SparseVector same;
  same.indices = {10, 11};
  same.values = {1.0f, 2.0f};
  const auto adjacent = encode_sparse(CompressorId::kTopk, n, same, f);
  expect_corrupt(patched<uint8_t>(adjacent, lay.indices_offset + 1, 10), n);
  // And encode refuses what the decoder refuses.
  EXPECT_THROW(encode_sparse(CompressorId::kTopk, n, SparseVector{{5, 5}, {1.0f, 1.0f}}, f), InvalidArgument);
  EXPECT_THROW(encode_sparse(CompressorId::kTopk, n, SparseVector{{1000}, {1.0f}}, f), InvalidArgument);
}

// decode_sum_sparse over coded payloads is the zero fill plus decode_add_sparse per
// payload in order, bit for bit (as for raw payloads in test_sparse.cc).
TEST(CodedSparse, DecodeSumMatchesZeroThenAdd) {
  std::mt19937_64 gen(9);
  const uint64_t n = 50000;
  std::vector<std::vector<uint8_t>> bytes;
  for (uint64_t count : {500u, 5000u, 1u, 25000u}) {
    bytes.push_back(encode_sparse(CompressorId::kTopk, n, random_selection(n, count, gen), {ValueType::kBf16, true}));
  }
  std::vector<float> want(n, 0.0f), got(n, 7.0f);
  for (const auto& b : bytes) decode_add_sparse(CompressorId::kTopk, b, n, want.data());
  const std::vector<std::span<const uint8_t>> spans(bytes.begin(), bytes.end());
  decode_sum_sparse(CompressorId::kTopk, spans, n, got.data());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0);
}

}  // namespace
}  // namespace gradcomm::detail
