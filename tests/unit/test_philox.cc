// Philox4x32-10: the published known answers, the stream/index mapping, and the
// statistics every compressor that draws from it relies on.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <vector>

#include "compressors/cpu_kernels.h"
#include "compressors/philox.h"
#include "cpu_features.h"

namespace gradcomm::detail {
namespace {

struct KnownAnswer {
  uint32_t counter[4];
  uint32_t key[2];
  uint32_t expected[4];
};

// Random123 (D. E. Shaw Research) tests/kat_vectors, the three "philox4x32 10" lines:
// counter words 0..3, key words 0..1, output words 0..3.
constexpr KnownAnswer kKnownAnswers[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},  // digits of pi
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(Philox, MatchesRandom123KnownAnswers) {
  for (const auto& kat : kKnownAnswers) {
    const Philox4 r =
        philox4x32_10(kat.counter[0], kat.counter[1], kat.counter[2], kat.counter[3], kat.key[0], kat.key[1]);
    for (int lane = 0; lane < 4; ++lane) {
      EXPECT_EQ(r.v[lane], kat.expected[lane])
          << "counter word 0 = " << std::hex << kat.counter[0] << ", lane " << lane;
    }
  }
}

// Element i of a stream is lane i % 4 of the block at counter
// (i / 4 low, i / 4 high, stream low, stream high) under key (seed low, seed high).
TEST(Philox, StreamIndexMapsToCounterAndLane) {
  const PhiloxStream s{0x0123456789ABCDEFull, 0xFEDCBA9876543210ull};
  const uint64_t indices[] = {0, 1, 2, 3, 4, 7, 1001, (uint64_t{1} << 34) + 5, ~uint64_t{0}};
  for (uint64_t i : indices) {
    const uint64_t block = i / 4;
    const Philox4 r = philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0x76543210u,
                                    0xFEDCBA98u, 0x89ABCDEFu, 0x01234567u);
    EXPECT_EQ(philox_bits(s, i), r.v[i % 4]) << "index " << i;
  }
}

TEST(Philox, ZeroVectorThroughTheStreamMapping) {
  // The all-zero known answer seen through PhiloxStream: seed 0, stream 0, elements
  // 0..3 are the four lanes of block 0. (The other two vectors have counter word 1
  // >= 2^30, beyond the blocks a 64-bit element index reaches.)
  const PhiloxStream s{0, 0};
  const uint32_t expected[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
  for (uint64_t lane = 0; lane < 4; ++lane) EXPECT_EQ(philox_bits(s, lane), expected[lane]);
}

TEST(Philox, UniformIsTopTwentyFourBitsInUnitInterval) {
  const PhiloxStream s{42, 7};
  for (uint64_t i = 0; i < 4096; ++i) {
    const float u = philox_uniform(s, i);
    EXPECT_EQ(u, static_cast<float>(philox_bits(s, i) >> 8) / 16777216.0f);
  }
  // The largest possible draw (all bits set) is still below 1 in fp32.
  EXPECT_LT(static_cast<float>(0xFFFFFFFFu >> 8) * 5.9604644775390625e-8f, 1.0f);
}

// philox_uniform16: element i is half i % 2 of word i / 2 (low half first), scaled
// by 2^-16, so two consecutive elements split one 32-bit word; the largest draw is
// 1 - 2^-16. And over 2^20 draws every one of the 2^16 values is as frequent as a
// fair die allows (chi-square, 65535 degrees of freedom: mean 65535, sd 362).
TEST(Philox, Uniform16IsHalfAWordInUnitInterval) {
  const PhiloxStream s{42, 7};
  for (uint64_t i = 0; i < 4096; ++i) {
    const uint32_t word = philox_bits(s, i / 2);
    const uint32_t half = i % 2 == 0 ? word & 0xFFFFu : word >> 16;
    ASSERT_EQ(philox_uniform16(s, i), static_cast<float>(half) / 65536.0f) << "element " << i;
  }
  EXPECT_EQ(uniform_from_bits16(0xFFFFu), 1.0f - 1.0f / 65536.0f);
  EXPECT_EQ(uniform_from_bits16(0), 0.0f);
  std::vector<int64_t> count(65536, 0);
  constexpr int64_t kDraws = int64_t{1} << 20;
  for (int64_t i = 0; i < kDraws; ++i) {
    ++count[static_cast<size_t>(philox_uniform16(s, static_cast<uint64_t>(i)) * 65536.0f)];
  }
  double chi2 = 0;
  const double expected = static_cast<double>(kDraws) / 65536.0;
  for (int64_t c : count) chi2 += (static_cast<double>(c) - expected) * (static_cast<double>(c) - expected) / expected;
  EXPECT_NEAR(chi2, 65535.0, 6 * 362.0);
}

TEST(Philox, UniformMeanAndVarianceOfOneMillionDraws) {
  constexpr int64_t kDraws = 1'000'000;
  const PhiloxStream s{0x5EED, philox_stream_id(0xABCDEF, 3, -1)};
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < kDraws; ++i) {
    const double u = philox_uniform(s, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum_sq += u * u;
  }
  const double mean = sum / kDraws;
  const double variance = sum_sq / kDraws - mean * mean;
  // U(0,1): mean 1/2 with standard error sqrt(1/12 / N); the sample variance 1/12
  // with standard error sqrt((mu4 - sigma^4) / N), mu4 = 1/80, sigma^4 = 1/144.
  const double mean_sigma = std::sqrt(1.0 / 12.0 / kDraws);
  const double var_sigma = std::sqrt((1.0 / 80.0 - 1.0 / 144.0) / kDraws);
  EXPECT_NEAR(mean, 0.5, 5 * mean_sigma);
  EXPECT_NEAR(variance, 1.0 / 12.0, 5 * var_sigma);
}

TEST(Philox, EveryBitIsSetHalfTheTime) {
  constexpr int64_t kDraws = 1 << 18;
  const PhiloxStream s{1, 2};
  int64_t ones[32] = {};
  for (int64_t i = 0; i < kDraws; ++i) {
    const uint32_t b = philox_bits(s, static_cast<uint64_t>(i));
    for (int bit = 0; bit < 32; ++bit) ones[bit] += (b >> bit) & 1u;
  }
  const double sigma = std::sqrt(kDraws * 0.25);
  for (int bit = 0; bit < 32; ++bit) EXPECT_NEAR(ones[bit], kDraws / 2.0, 5 * sigma) << "bit " << bit;
}

TEST(Philox, DistinctStreamsAndSeedsDiffer) {
  constexpr int kValues = 64;
  auto draw = [](const PhiloxStream& s) {
    std::vector<uint32_t> v(kValues);
    for (int i = 0; i < kValues; ++i) v[i] = philox_bits(s, static_cast<uint64_t>(i));
    return v;
  };
  std::set<std::vector<uint32_t>> seen;
  for (uint64_t stream : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{1} << 32, ~uint64_t{0}}) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 32}) {
      EXPECT_TRUE(seen.insert(draw({seed, stream})).second) << "seed " << seed << " stream " << stream;
    }
  }
}

TEST(Philox, SameStreamAndIndexReproduceInAnyOrder) {
  const PhiloxStream s{99, philox_stream_id(1234, 5, 2)};
  std::vector<uint32_t> forward(1000);
  for (uint64_t i = 0; i < forward.size(); ++i) forward[i] = philox_bits(s, i);
  for (uint64_t i = forward.size(); i-- > 0;) EXPECT_EQ(philox_bits(s, i), forward[i]);
  const PhiloxStream copy = s;
  EXPECT_EQ(philox_uniform(copy, 777), philox_uniform(s, 777));
}

TEST(Philox, StreamIdIsDeterministicAndSeparatesKeyStepRank) {
  EXPECT_EQ(philox_stream_id(7, 8, 3), philox_stream_id(7, 8, 3));
  std::set<uint64_t> ids;
  int count = 0;
  for (uint64_t key : {uint64_t{0}, uint64_t{1}, uint64_t{0xDEADBEEF}}) {
    for (uint64_t step = 0; step < 16; ++step) {
      for (int rank = -1; rank < 16; ++rank) {
        ids.insert(philox_stream_id(key, step, rank));
        ++count;
      }
    }
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(count));
  // Swapping step and rank must not land on the same stream.
  EXPECT_NE(philox_stream_id(5, 1, 2), philox_stream_id(5, 2, 1));
}

// ---- the bulk paths against the scalar reference -------------------------------------

// Every path's output over a matrix of keys and block ranges, bitwise against
// philox_uniform16_blocks_scalar: seed and stream 0 and random ones; starts anywhere
// and starts whose low counter word wraps at or inside a group (the vector paths'
// carry into the high word), including the wrap of the whole 64-bit counter; every
// count 0..40 (whole groups, an AVX2 group after the AVX-512 ones, scalar tails) and
// one large count; and that nothing is written past 8 * blocks.
void expect_blocks_match_scalar(const char* path) {
  ASSERT_STREQ(philox_uniform_blocks_path(), path);
  constexpr uint64_t kLarge = 4099;  // 256 groups of sixteen, one of eight, three scalar
  std::vector<float> fast(8 * kLarge + 16), scalar(8 * kLarge);
  std::mt19937_64 gen(2024);
  auto check = [&](const PhiloxStream& rng, uint64_t block0, uint64_t blocks) {
    SCOPED_TRACE(::testing::Message() << path << " seed=" << rng.seed << " stream=" << rng.stream
                                      << " block0=" << block0 << " blocks=" << blocks);
    std::fill(fast.begin(), fast.end(), -1.0f);
    philox_uniform16_blocks(rng, block0, blocks, fast.data());
    philox_uniform16_blocks_scalar(rng, block0, blocks, scalar.data());
    for (uint64_t i = 0; i < 8 * blocks; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(fast[i]), std::bit_cast<uint32_t>(scalar[i])) << "element " << i;
    }
    for (uint64_t i = 8 * blocks; i < 8 * blocks + 16; ++i) ASSERT_EQ(fast[i], -1.0f) << "wrote past the end: " << i;
  };
  for (int trial = 0; trial < 24; ++trial) {
    const PhiloxStream rng{trial == 0 ? 0 : gen(), trial == 0 ? 0 : gen()};
    const uint64_t high = (gen() >> 32) << 32;  // any high word, low word zero
    const uint64_t wrap = high + (uint64_t{1} << 32);  // the next high word
    // Starts 1 to 32 blocks below a change of the high word: with the counts 0..40
    // the carry lands on and inside AVX-512, AVX2 and scalar groups. The last start
    // wraps the whole 64-bit counter.
    const uint64_t starts[] = {gen(), high, wrap - 32, wrap - 31, wrap - 16, wrap - 15,
                               wrap - 9, wrap - 8, wrap - 7, wrap - 1, ~uint64_t{0} - 12};
    for (uint64_t block0 : starts) {
      for (uint64_t blocks = 0; blocks <= 40; ++blocks) {
        check(rng, block0, blocks);
        if (testing::Test::HasFatalFailure()) return;
      }
      check(rng, block0, kLarge);
      if (testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(PhiloxBlocks, Avx512MatchesScalarBitwise) {
  if (!cpu_has_avx512f() || !cpu_has_avx2()) GTEST_SKIP() << "no AVX-512F (or no AVX2) on this CPU: no AVX-512 path";
  expect_blocks_match_scalar("avx512");
}

TEST(PhiloxBlocks, Avx2MatchesScalarBitwise) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU: no AVX2 path";
  ScopedAvx2Kernels avx2;  // on an AVX-512 CPU, the path below it
  expect_blocks_match_scalar("avx2");
}

TEST(PhiloxBlocks, KernelCapsSelectThePath) {
  {
    ScopedScalarKernels scalar;
    EXPECT_STREQ(philox_uniform_blocks_path(), "scalar");
    ScopedAvx2Kernels avx2;  // a wider cap does not lift a narrower one
    EXPECT_STREQ(philox_uniform_blocks_path(), "scalar");
  }
  {
    ScopedAvx2Kernels avx2;
    EXPECT_FALSE(use_avx512_kernels());
    EXPECT_EQ(use_avx2_kernels(), cpu_has_avx2());
  }
  EXPECT_EQ(use_avx512_kernels(), cpu_has_avx512f() && cpu_has_avx2());
  const char* widest = use_avx512_kernels() ? "avx512" : use_avx2_kernels() ? "avx2" : "scalar";
  EXPECT_STREQ(philox_uniform_blocks_path(), widest);
  std::printf("philox_uniform16_blocks path on this CPU: %s\n", philox_uniform_blocks_path());
}

}  // namespace
}  // namespace gradcomm::detail
