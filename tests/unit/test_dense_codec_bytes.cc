// The AVX2 paths of the CPU dense codecs (compressors/philox.cc, quantize/dense_simd.cc)
// against the scalar definitions they replace: Philox blocks, each bulk loop, and
// whole quant/qsgd/sign payloads byte for byte, the reference computed on the same
// machine under ScopedScalarKernels. On a CPU without AVX2 both sides are the scalar
// path and the comparisons hold trivially; the kernel-level tests skip there.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compressors/codec.h"
#include "compressors/cpu_kernels.h"
#include "compressors/philox.h"
#include "compressors/quantize/bitpack.h"
#include "compressors/quantize/dense_simd.h"
#include "compressors/quantize/dense_util.h"
#include "cpu_features.h"
#include "half.h"

namespace gradcomm::detail {
namespace {


std::string describe(const CompressorSpec& s) {
  std::string name = compressor_name(s.id);
  if (s.id == CompressorId::kQuant) name += std::to_string(s.bits) + (s.round == Rounding::kNearest ? "n" : "s");
  if (s.id == CompressorId::kQsgd) name += std::to_string(s.levels);
  return name + " bucket=" + std::to_string(s.bucket);
}

// N(0, 1) values with the cases every path must agree on planted in fixed places:
// a NaN and an infinity (poisoned buckets), -0, subnormals, a constant run, values
// whose range overflows fp32, and buckets entirely of zeros.
std::vector<float> awkward_input(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  auto plant = [&](size_t i, float v) {
    if (i < n) x[i] = v;
  };
  plant(700, std::numeric_limits<float>::quiet_NaN());
  plant(1900, std::numeric_limits<float>::infinity());
  plant(1901, -std::numeric_limits<float>::infinity());
  plant(2100, -0.0f);
  plant(2101, 1e-40f);
  plant(2102, -1e-42f);
  for (size_t i = 2600; i < 3100 && i < n; ++i) x[i] = 0.25f;
  for (size_t i = 3200; i < 3300 && i < n; ++i) x[i] = 0.0f;
  plant(4000, 3e38f);
  plant(4001, -3e38f);
  plant(4100, -std::numeric_limits<float>::quiet_NaN());
  return x;
}

uint64_t fnv1a(const uint8_t* p, size_t len, uint64_t h = 0xcbf29ce484222325ull) {
  for (size_t i = 0; i < len; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::vector<uint8_t> encode(const DenseCodec& codec, const float* x, int64_t n, const PhiloxStream& rng,
                            int64_t first) {
  std::vector<uint8_t> p(codec.encoded_bytes(n));
  codec.encode(x, n, p.data(), rng, first);
  return p;
}

// ---- Philox -----------------------------------------------------------------------

TEST(PhiloxSimd, BlocksMatchScalarForRandomKeysAndCounters) {
  std::printf("philox_uniform_blocks path on this CPU: %s\n", philox_uniform_blocks_path());
  std::mt19937_64 gen(7);
  std::vector<float> fast(4 * 70), scalar(4 * 70);
  for (int trial = 0; trial < 200; ++trial) {
    const PhiloxStream rng{gen(), gen()};
    // Any start, and starts whose low counter word is about to wrap (the vector
    // path's other branch), including the wrap of the whole 64-bit counter.
    uint64_t block0 = trial % 4 == 3 ? gen() >> 3 : gen();
    if (trial % 4 == 1) block0 = ((block0 >> 3) | 0xFFFFFFFFull) - (gen() % 12);
    if (trial % 4 == 2) block0 = ~uint64_t{0} - (gen() % 12);
    const uint64_t blocks = gen() % 70;
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " block0=" << block0 << " blocks=" << blocks);
    philox_uniform_blocks(rng, block0, blocks, fast.data());
    philox_uniform_blocks_scalar(rng, block0, blocks, scalar.data());
    for (uint64_t i = 0; i < 4 * blocks; ++i) {
      ASSERT_EQ(float_bits(fast[i]), float_bits(scalar[i])) << "element " << i;
      // Element indices reach blocks below 2^62 only; past that, the blocks alone.
      if (block0 < (uint64_t{1} << 62) - 70) {
        ASSERT_EQ(float_bits(fast[i]), float_bits(philox_uniform(rng, 4 * (block0 + i / 4) + i % 4)));
      }
    }
  }
}

TEST(PhiloxSimd, FillUniformsFromOddPositions) {
  const PhiloxStream rng{0xDEADBEEFCAFEF00Dull, 0x0123456789ABCDEFull};
  float scratch[kDenseChunk + 8];
  for (uint64_t pos : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{37}, (uint64_t{1} << 34) - 33}) {
    for (size_t count : {size_t{1}, size_t{3}, size_t{31}, size_t{32}, size_t{33}, size_t{517}, kDenseChunk}) {
      const float* u = fill_uniforms(rng, pos, count, scratch);
      for (size_t k = 0; k < count; ++k) {
        ASSERT_EQ(float_bits(u[k]), float_bits(philox_uniform(rng, pos + k))) << "pos " << pos << " k " << k;
      }
    }
  }
}

TEST(PhiloxSimd, ScopedScalarKernelsSelectsTheScalarPath) {
  {
    ScopedScalarKernels scalar;
    EXPECT_FALSE(use_avx2_kernels());
    EXPECT_STREQ(philox_uniform_blocks_path(), "scalar");
  }
  EXPECT_EQ(use_avx2_kernels(), cpu_has_avx2());
}

// ---- the bulk loops, one by one ------------------------------------------------------

#define SKIP_WITHOUT_AVX2() \
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU"

TEST(DenseSimdKernels, BucketRangeMatchesScalar) {
  SKIP_WITHOUT_AVX2();
  const std::vector<float> x = awkward_input(4200, 3);
  for (size_t start : {size_t{0}, size_t{5}, size_t{690}, size_t{1895}, size_t{2095}, size_t{2600}, size_t{3995}}) {
    for (size_t m = 1; m <= 80 && start + m <= x.size(); ++m) {
      const BucketRange a = bucket_range_avx2(x.data() + start, m), b = bucket_range(x.data() + start, m);
      ASSERT_EQ(a.finite, b.finite) << start << "+" << m;
      ASSERT_EQ(float_bits(a.lo), float_bits(b.lo)) << start << "+" << m;
      ASSERT_EQ(float_bits(a.hi), float_bits(b.hi)) << start << "+" << m;
    }
  }
}

TEST(DenseSimdKernels, SumSquaresMatchesLaneSum) {
  SKIP_WITHOUT_AVX2();
  const std::vector<float> x = awkward_input(4200, 4);
  for (size_t start : {size_t{0}, size_t{3}, size_t{690}, size_t{2095}, size_t{3995}}) {
    for (size_t m = 0; m <= 70; ++m) {
      const float a = sum_squares_avx2(x.data() + start, m);
      const float b = lane_sum(x.data() + start, m, [](float v) { return mul_rn(v, v); });
      ASSERT_EQ(float_bits(a), float_bits(b)) << start << "+" << m;
    }
  }
}

TEST(DenseSimdKernels, CodeLoopsMatchTheFormulas) {
  SKIP_WITHOUT_AVX2();
  const std::vector<float> x = awkward_input(4200, 5);
  std::vector<float> u(x.size());
  philox_uniform_blocks_scalar(PhiloxStream{1, 2}, 0, u.size() / 4, u.data());
  std::vector<uint32_t> codes(x.size());
  // Grid parameters as the encoders make them, and the degenerate ones (inv 0 of a
  // constant or poisoned bucket, NaN lo, an infinite qsgd scale).
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (uint32_t levels : {1u, 3u, 15u, 255u}) {
    for (auto [lo, inv] : {std::pair{-2.5f, levels / 5.0f}, std::pair{0.25f, 0.0f}, std::pair{nan, 0.0f}}) {
      const float lf = static_cast<float>(levels);
      quant_codes_stochastic_avx2(x.data(), u.data(), x.size(), lo, inv, lf, codes.data());
      for (size_t k = 0; k < x.size(); ++k) {
        ASSERT_EQ(codes[k], round_stochastic(quant_position(x[k], lo, inv, lf), u[k])) << levels << " " << k;
      }
      quant_codes_nearest_avx2(x.data(), x.size(), lo, inv, lf, codes.data());
      for (size_t k = 0; k < x.size(); ++k) {
        ASSERT_EQ(codes[k], round_half_up(quant_position(x[k], lo, inv, lf))) << levels << " " << k;
      }
    }
  }
  for (uint32_t levels : {1u, 16u, 127u, (1u << 24) - 1}) {
    const unsigned bits = qsgd_code_bits(levels);
    for (float scale : {levels / 40.0f, 0.0f, inf}) {
      const float lf = static_cast<float>(levels);
      qsgd_codes_avx2(x.data(), u.data(), x.size() - 3, scale, lf, bits, codes.data());
      for (size_t k = 0; k + 3 < x.size(); ++k) {
        ASSERT_EQ(codes[k], qsgd_code(x[k], round_stochastic(qsgd_position(x[k], scale, lf), u[k]), bits))
            << levels << " " << scale << " " << k;
      }
    }
  }
}

TEST(DenseSimdKernels, PackerMatchesPackGroup8) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 gen(11);
  for (unsigned bits = 1; bits <= 9; ++bits) {
    for (size_t count : {size_t{0}, size_t{8}, size_t{31}, size_t{32}, size_t{33}, size_t{64}, size_t{200}}) {
      std::vector<uint32_t> codes(count);
      for (auto& c : codes) c = gen() & ((1u << bits) - 1u);
      std::vector<uint8_t> fast(count * bits / 8 + 1, 0xEE), ref(count * bits / 8 + 1, 0xEE);
      const size_t done = pack_codes_avx2(codes.data(), count, bits, fast.data());
      const bool supported = bits == 1 || bits == 2 || bits == 4 || bits == 8;
      ASSERT_EQ(done, supported ? count / 32 * 32 : 0) << bits << " " << count;
      for (size_t g = 0; g < done / 8; ++g) pack_group8<0>(codes.data() + 8 * g, bits, ref.data() + bits * g);
      ASSERT_EQ(fast, ref) << "bits " << bits << " count " << count;  // guard bytes untouched too
    }
  }
}

// ---- whole payloads ------------------------------------------------------------------

std::vector<CompressorSpec> payload_specs(int64_t bucket) {
  std::vector<CompressorSpec> specs;
  for (int bits : {1, 2, 4, 8}) {
    specs.push_back(dense_codec_spec(CompressorId::kQuant, bits, Rounding::kStochastic, 0, bucket));
    specs.push_back(dense_codec_spec(CompressorId::kQuant, bits, Rounding::kNearest, 0, bucket));
  }
  for (int levels : {1, 3, 7, 16, 127, 1000}) {
    specs.push_back(dense_codec_spec(CompressorId::kQsgd, 0, Rounding::kStochastic, levels, bucket));
  }
  specs.push_back(dense_codec_spec(CompressorId::kSign, 0, Rounding::kStochastic, 0, bucket));
  return specs;
}

// Every bucket size class (1, below and above the 8-wide register and the 32-code
// packer group, not a multiple of 8, the default 512, more than one 1024 chunk),
// lengths that end mid-register and mid-bucket, and offsets whose Philox counters
// start mid-block or cross 2^32 blocks inside the run.
TEST(DenseCodecBytes, Avx2PayloadsEqualScalarPayloads) {
  std::printf("dense kernels on this CPU: %s\n", use_avx2_kernels() ? "avx2" : "scalar");
  const std::vector<float> x = awkward_input(4200, 9);
  const PhiloxStream rng{0x243F6A8885A308D3ull, 0x13198A2E03707344ull};
  int compared = 0;
  for (int64_t bucket : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{33}, int64_t{512}, int64_t{1500}}) {
    for (const CompressorSpec& spec : payload_specs(bucket)) {
      const auto codec = make_dense_codec(spec);
      for (int64_t n : {0, 1, 7, 8, 31, 32, 33, 100, 511, 512, 513, 1500, 4099}) {
        for (int64_t first : {int64_t{0}, bucket, 5 * bucket, bucket * ((int64_t{1} << 34) / bucket - 7)}) {
          const float* in = x.data() + (x.size() - static_cast<size_t>(n));
          const std::vector<uint8_t> fast = encode(*codec, in, n, rng, first);
          std::vector<uint8_t> scalar;
          {
            ScopedScalarKernels force;
            scalar = encode(*codec, in, n, rng, first);
          }
          ASSERT_EQ(fast, scalar) << describe(spec) << " n=" << n << " first=" << first;
          ++compared;
        }
      }
    }
  }
  std::printf("%d payload pairs compared\n", compared);
}

// The payloads of a fixed matrix, hashed: the value was taken from the scalar
// encoders as they were before the AVX2 paths existed (bench_dense_encode_cost's
// `digest` mode prints the same matrix line by line), so a change that moved both
// paths together would still fail here.
TEST(DenseCodecBytes, PayloadDigestIsPinned) {
  std::vector<float> x(5000);
  {
    std::mt19937 gen(1);
    std::normal_distribution<float> dist;
    for (float& v : x) v = dist(gen);
  }
  x[700] = std::numeric_limits<float>::quiet_NaN();
  x[1900] = std::numeric_limits<float>::infinity();
  x[2100] = -0.0f;
  for (int k = 2600; k < 3100; ++k) x[k] = 0.25f;
  x[4000] = 3e38f, x[4001] = -3e38f;
  const struct {
    CompressorId id;
    int bits;
    Rounding round;
    int levels;
  } kinds[] = {{CompressorId::kQuant, 1, Rounding::kStochastic, 0}, {CompressorId::kQuant, 2, Rounding::kStochastic, 0},
               {CompressorId::kQuant, 4, Rounding::kStochastic, 0}, {CompressorId::kQuant, 8, Rounding::kStochastic, 0},
               {CompressorId::kQuant, 1, Rounding::kNearest, 0},    {CompressorId::kQuant, 2, Rounding::kNearest, 0},
               {CompressorId::kQuant, 4, Rounding::kNearest, 0},    {CompressorId::kQuant, 8, Rounding::kNearest, 0},
               {CompressorId::kQsgd, 0, Rounding::kStochastic, 16}, {CompressorId::kQsgd, 0, Rounding::kStochastic, 3},
               {CompressorId::kSign, 0, Rounding::kStochastic, 0}};
  uint64_t digest = 0xcbf29ce484222325ull;  // FNV-1a over the per-payload hashes, little-endian
  for (const auto& k : kinds) {
    for (int64_t bucket : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{512}, int64_t{1000}}) {
      const auto codec = make_dense_codec(dense_codec_spec(k.id, k.bits, k.round, k.levels, bucket));
      for (int64_t n : {0, 1, 13, 511, 1025, 5000}) {
        for (int64_t first : {int64_t{0}, bucket, 3 * bucket, bucket * ((int64_t{1} << 34) / bucket - 3)}) {
          const std::vector<uint8_t> p =
              encode(*codec, x.data() + (5000 - n), n, PhiloxStream{0x1234567887654321ull, 99}, first);
          const uint64_t h = fnv1a(p.data(), p.size());
          uint8_t le[8];
          for (int b = 0; b < 8; ++b) le[b] = static_cast<uint8_t>(h >> (8 * b));
          digest = fnv1a(le, 8, digest);
        }
      }
    }
  }
  EXPECT_EQ(digest, 0xc3675275ab34099cull);
}

}  // namespace
}  // namespace gradcomm::detail
