// The AVX2 paths of the CPU dense codecs (compressors/philox.cc,
// compressors/dense/dense_simd.cc, compressors/dense/dense_simd_decode.cc) against
// the scalar definitions they replace: Philox blocks, each bulk loop, whole
// quant/qsgd/sign payloads byte for byte and their decoded floats bit for bit, the
// reference computed on the same machine under ScopedScalarKernels. On a CPU without AVX2 both sides are the scalar
// path and the comparisons hold trivially; the kernel-level tests skip there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "compressors/codec.h"
#include "compressors/cpu_kernels.h"
#include "compressors/philox.h"
#include "compressors/dense/bitpack.h"
#include "compressors/dense/dense_simd.h"
#include "compressors/dense/dense_util.h"
#include "compressors/dense_codec_spec.h"
#include "compressors/quantize/quantize.h"
#include "compressors/spec.h"
#include "cpu_features.h"
#include "gradcomm/errors.h"
#include "half.h"
#include "reduce.h"

namespace gradcomm::detail {
namespace {


std::string describe(const CompressorSpec& s) {
  std::string name = compressor_name(s.id);
  if (s.id == CompressorId::kQuant) name += std::to_string(dense_codec_fields(s).bits) + (dense_codec_fields(s).round == Rounding::kNearest ? "n" : "s");
  if (s.id == CompressorId::kQsgd) name += std::to_string(dense_codec_fields(s).levels);
  return name + " bucket=" + std::to_string(dense_codec_fields(s).bucket);
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
  std::printf("philox_uniform16_blocks path on this CPU: %s\n", philox_uniform_blocks_path());
  std::mt19937_64 gen(7);
  std::vector<float> fast(8 * 70), scalar(8 * 70);
  for (int trial = 0; trial < 200; ++trial) {
    const PhiloxStream rng{gen(), gen()};
    // Any start, and starts whose low counter word is about to wrap (the vector
    // path's other branch), including the wrap of the whole 64-bit counter.
    uint64_t block0 = trial % 4 == 3 ? gen() >> 3 : gen();
    if (trial % 4 == 1) block0 = ((block0 >> 3) | 0xFFFFFFFFull) - (gen() % 12);
    if (trial % 4 == 2) block0 = ~uint64_t{0} - (gen() % 12);
    const uint64_t blocks = gen() % 70;
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " block0=" << block0 << " blocks=" << blocks);
    philox_uniform16_blocks(rng, block0, blocks, fast.data());
    philox_uniform16_blocks_scalar(rng, block0, blocks, scalar.data());
    for (uint64_t i = 0; i < 8 * blocks; ++i) {
      ASSERT_EQ(float_bits(fast[i]), float_bits(scalar[i])) << "element " << i;
      // Element indices reach blocks below 2^61 only; past that, the blocks alone.
      if (block0 < (uint64_t{1} << 61) - 70) {
        ASSERT_EQ(float_bits(fast[i]), float_bits(philox_uniform16(rng, 8 * (block0 + i / 8) + i % 8)));
      }
    }
  }
}

TEST(PhiloxSimd, FillUniformsFromOddPositions) {
  const PhiloxStream rng{0xDEADBEEFCAFEF00Dull, 0x0123456789ABCDEFull};
  float scratch[kDenseChunk + kUniformSlack];
  for (uint64_t pos : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{7}, uint64_t{37},
                       (uint64_t{1} << 34) - 33}) {
    for (size_t count : {size_t{1}, size_t{3}, size_t{31}, size_t{32}, size_t{33}, size_t{517}, kDenseChunk}) {
      const float* u = fill_uniforms(rng, pos, count, scratch);
      for (size_t k = 0; k < count; ++k) {
        ASSERT_EQ(float_bits(u[k]), float_bits(philox_uniform16(rng, pos + k))) << "pos " << pos << " k " << k;
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
  philox_uniform16_blocks_scalar(PhiloxStream{1, 2}, 0, u.size() / 8, u.data());
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
  std::printf("dense kernels on this CPU: %s\n",
              use_avx512_kernels() ? "avx512 (some loops)" : use_avx2_kernels() ? "avx2" : "scalar");
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
          std::vector<uint8_t> scalar, avx2;
          {
            ScopedScalarKernels force;
            scalar = encode(*codec, in, n, rng, first);
          }
          {
            ScopedAvx2Kernels cap;  // the AVX2 loops where the fastest path is AVX-512
            avx2 = encode(*codec, in, n, rng, first);
          }
          ASSERT_EQ(fast, scalar) << describe(spec) << " n=" << n << " first=" << first;
          ASSERT_EQ(avx2, scalar) << "AVX2-capped: " << describe(spec) << " n=" << n << " first=" << first;
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
// paths together would still fail here. Re-pinned on 2026-11-27, when stochastic
// rounding moved to 16-bit uniforms (philox_uniform16, FORMAT.md): the stochastic
// payloads changed by design, and unit_test_gpu_dense_logic checks the new draws
// against the device policy's own per-element derivation (UniformCache).
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
  EXPECT_EQ(digest, 0xdb6b452342a893d1ull);
}

// ---- decoders ---------------------------------------------------------------------
// The AVX2 decoders against the scalar ones, float bits compared: signs of zero, NaN
// signs and payloads included. One case is looser. decode_add's out[i] + v with both
// NaN is a NaN, but which one: x86 returns the first operand, and which operand is
// first is the compiler's choice, not the source's. GCC 12 makes different choices
// in one scalar loop's vector body and its epilogue (the element's position in the
// bucket decides), and different ones for quant than for qsgd and sign, so no
// decoder can match the scalar bits there; both must give a NaN. quant's decode adds
// two NaNs too, lo + c * step in a poisoned bucket; GCC 12 orders both paths alike
// there, so that stays strict (a compiler that orders them apart fails here first).

// Index of the first element where a and b differ, or -1: bits must be equal, except
// that where nan_pair[i] (both addends NaN) any two NaNs match.
int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b,
                         const std::vector<bool>& nan_pair = {}) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same = i < nan_pair.size() && nan_pair[i] ? is_nan(a[i]) && is_nan(b[i])
                                                         : float_bits(a[i]) == float_bits(b[i]);
    if (!same) return static_cast<int64_t>(i);
  }
  return -1;
}

// NaNs of both signs with other payloads than the canonical one (signalling ones
// too), infinities, -0 and subnormals, between N(0, 1) values.
std::vector<float> awkward_out(size_t n, uint32_t seed) {
  std::vector<float> y = awkward_input(n, seed);
  for (size_t i = 0; i < n; i += 5) y[i] = bits_float(0xFFC00000u | static_cast<uint32_t>(i));
  for (size_t i = 2; i < n; i += 11) y[i] = bits_float(0x7F800001u + static_cast<uint32_t>(i));
  for (size_t i = 3; i < n; i += 13) y[i] = -std::numeric_limits<float>::infinity();
  return y;
}

// What decode (add false) or decode_add leaves in a copy of `out`; the same `out`
// if the decoder threw CorruptPayload (which it must do before writing anything).
struct Decoded {
  std::vector<float> out;
  bool corrupt = false;
};
Decoded decode_onto(const DenseCodec& codec, const std::vector<uint8_t>& p, int64_t n, bool add,
                    std::vector<float> out) {
  Decoded d;
  try {
    add ? codec.decode_add(p, n, out.data()) : codec.decode(p, n, out.data());
  } catch (const CorruptPayload&) {
    d.corrupt = true;
  }
  d.out = std::move(out);
  return d;
}

// Both paths decode `p` into copies of `out`, with decode and with decode_add; the
// results must match (first_difference) and both paths must agree on whether `p` is
// corrupt. Returns whether the payload was accepted.
bool expect_same_decode(const DenseCodec& codec, const std::vector<uint8_t>& p, int64_t n,
                        const std::vector<float>& out, const std::string& what) {
  std::vector<bool> nan_pair(out.size(), false);  // decode_add's NaN + NaN elements
  bool accepted = true;
  for (bool add : {false, true}) {
    const Decoded fast = decode_onto(codec, p, n, add, out);
    Decoded scalar;
    {
      ScopedScalarKernels force;
      scalar = decode_onto(codec, p, n, add, out);
    }
    EXPECT_EQ(fast.corrupt, scalar.corrupt) << what << (add ? " decode_add" : " decode");
    const int64_t i = first_difference(fast.out, scalar.out, add ? nan_pair : std::vector<bool>{});
    EXPECT_EQ(i, -1) << what << (add ? " decode_add" : " decode") << ": element " << i << " is 0x" << std::hex
                     << (i >= 0 ? float_bits(fast.out[i]) : 0) << ", the scalar path gives 0x"
                     << (i >= 0 ? float_bits(scalar.out[i]) : 0);
    if (!add && !scalar.corrupt) {
      for (size_t k = 0; k < out.size(); ++k) nan_pair[k] = is_nan(out[k]) && is_nan(scalar.out[k]);
    }
    accepted = accepted && !fast.corrupt;
  }
  return accepted;
}

// The payload specs, and qsgd at the widest codes the AVX2 decoder unpacks (16 bits)
// and the narrowest it leaves to the scalar one (17).
std::vector<CompressorSpec> decode_specs(int64_t bucket) {
  std::vector<CompressorSpec> specs = payload_specs(bucket);
  for (int levels : {(1 << 15) - 1, 1 << 15}) {
    specs.push_back(dense_codec_spec(CompressorId::kQsgd, 0, Rounding::kStochastic, levels, bucket));
  }
  return specs;
}

// Encoders' payloads of awkward_input: poisoned buckets (NaN scales), constant and
// zero buckets, every bucket size class, lengths ending mid-group and mid-bucket, and
// the last bytes of the stream (which the vector path leaves to the scalar one).
TEST(DenseCodecBytes, Avx2DecodeEqualsScalarDecode) {
  const std::vector<float> x = awkward_input(4200, 21);
  const std::vector<float> out = awkward_out(4200, 22);
  const PhiloxStream rng{0x452821E638D01377ull, 0xBE5466CF34E90C6Cull};
  for (int64_t bucket : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{33}, int64_t{512}, int64_t{1500}}) {
    for (const CompressorSpec& spec : decode_specs(bucket)) {
      const auto codec = make_dense_codec(spec);
      for (int64_t n : {0, 1, 7, 8, 31, 32, 33, 100, 511, 512, 513, 1500, 4099}) {
        const float* in = x.data() + (x.size() - static_cast<size_t>(n));
        const std::vector<uint8_t> p = encode(*codec, in, n, rng, 0);
        const std::vector<float> start(out.begin(), out.begin() + n);
        ASSERT_TRUE(expect_same_decode(*codec, p, n, start, describe(spec) + " n=" + std::to_string(n)));
      }
    }
  }
}

// Payloads no encoder writes but the decoders accept (or must reject alike): every
// code pattern, and scales that are NaNs of any sign and payload, subnormal, huge, or
// a range that is one ulp wide. qsgd codes above s must be corrupt on both paths.
TEST(DenseCodecBytes, Avx2DecodeEqualsScalarOnArbitraryPayloads) {
  std::mt19937 gen(23);
  const std::vector<float> x = awkward_input(3000, 24);
  const std::vector<float> out = awkward_out(3000, 25);
  const float nan_scales[] = {bits_float(0xFFC00000u), bits_float(0x7FC00001u), bits_float(0xFF80DEADu),
                              bits_float(0x7FBFFFFFu)};
  const float finite_scales[] = {0.0f, 1e-45f, 1e-39f, 1.0f, 1.0000001f, 3e38f};
  int accepted = 0, rejected = 0;
  for (int64_t bucket : {int64_t{5}, int64_t{64}, int64_t{100}}) {
    for (const CompressorSpec& spec : decode_specs(bucket)) {
      const auto codec = make_dense_codec(spec);
      const unsigned bits = spec.id == CompressorId::kQuant  ? static_cast<unsigned>(dense_codec_fields(spec).bits)
                            : spec.id == CompressorId::kQsgd ? qsgd_code_bits(static_cast<uint32_t>(dense_codec_fields(spec).levels))
                                                             : 1u;
      const size_t per_bucket = spec.id == CompressorId::kQuant ? 8 : 4;  // scale bytes
      for (int64_t n : {1, 9, 40, 257, 3000}) {
        std::vector<uint8_t> p = encode(*codec, x.data(), n, PhiloxStream{5, 6}, 0);
        const size_t scales = 24, codes = scales + per_bucket * static_cast<size_t>(bucket_count(n, bucket));
        for (size_t i = codes; i < p.size(); ++i) p[i] = static_cast<uint8_t>(gen());
        const uint64_t code_bits = static_cast<uint64_t>(n) * bits;  // bits past the last code stay 0
        if (code_bits % 8 != 0) p.back() &= static_cast<uint8_t>((1u << (code_bits % 8)) - 1u);
        for (size_t b = scales; b < codes; b += per_bucket) {
          const float lo = gen() % 2 ? nan_scales[gen() % 4] : finite_scales[gen() % 6];
          store_f32(p.data() + b, lo);
          if (per_bucket == 8) {  // quant's max: one ulp above a finite min, or another NaN
            store_f32(p.data() + b + 4, is_finite(lo) ? std::nextafter(lo, 3e38f) : nan_scales[gen() % 4]);
          }
        }
        const std::string what = describe(spec) + " n=" + std::to_string(n);
        const bool ok = expect_same_decode(*codec, p, n, std::vector<float>(out.begin(), out.begin() + n), what);
        ++(ok ? accepted : rejected);
        ASSERT_FALSE(::testing::Test::HasFailure()) << what;
      }
    }
  }
  std::printf("%d payloads accepted, %d rejected by both paths\n", accepted, rejected);
  EXPECT_GT(rejected, 0);  // the qsgd level check ran on both paths
}

// decode_average(p, n, y, d) is decode then divide_inplace(d), bit for bit, on both
// paths, for every codec (casts too) and divisors that are and are not powers of two
// (the fused store and the plain form); a divisor below 1 is refused. The payloads
// decode to NaNs, infinities, subnormals and -0 (awkward_input), and the divisors
// reach 2^20 so that some quotients are subnormal.
TEST(DenseCodecBytes, DecodeAverageIsDecodeThenDivide) {
  const std::vector<float> x = awkward_input(4200, 26);
  std::vector<CompressorSpec> specs = decode_specs(33);
  for (const CompressorSpec& spec : decode_specs(512)) specs.push_back(spec);
  specs.push_back(dense_codec_spec(CompressorId::kFp16, 0, Rounding::kStochastic, 0, 1));
  specs.push_back(dense_codec_spec(CompressorId::kBf16, 0, Rounding::kStochastic, 0, 1));
  for (const CompressorSpec& spec : specs) {
    const auto codec = make_dense_codec(spec);
    for (int64_t n : {0, 1, 9, 512, 1500, 4200}) {
      const std::vector<uint8_t> p = encode(*codec, x.data(), n, PhiloxStream{7, 8}, 0);
      for (int64_t d : {1, 2, 3, 4, 6, 8, 1 << 20}) {
        for (bool scalar : {false, true}) {
          std::unique_ptr<ScopedScalarKernels> force(scalar ? new ScopedScalarKernels : nullptr);
          std::vector<float> got(static_cast<size_t>(n) + 1, -7.0f), want = got;
          codec->decode_average(p, n, got.data(), d);
          codec->decode(p, n, want.data());
          divide_inplace(want.data(), n, DType::kFloat32, d);
          ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
              << describe(spec) << " n=" << n << " d=" << d << (scalar ? " scalar" : "");
        }
      }
      std::vector<float> y(static_cast<size_t>(n) + 1);
      EXPECT_THROW(codec->decode_average(p, n, y.data(), 0), InvalidArgument) << describe(spec);
    }
  }
}

// encode_with_values gives encode's payload and decode_average's values, bit for bit,
// for every codec (quant's fused path and the others' default), on both paths, with the
// values in a separate buffer and in place over the input.
TEST(DenseCodecBytes, EncodeWithValuesIsEncodeThenDecodeAverage) {
  const std::vector<float> x = awkward_input(4200, 27);
  const PhiloxStream rng{0x1122334455667788ull, 99};
  for (int64_t bucket : {int64_t{33}, int64_t{512}}) {
    std::vector<CompressorSpec> specs = decode_specs(bucket);
    specs.push_back(dense_codec_spec(CompressorId::kFp16, 0, Rounding::kStochastic, 0, 1));
    for (const CompressorSpec& spec : specs) {
      const auto codec = make_dense_codec(spec);
      for (int64_t n : {0, 1, 9, 512, 1500, 4200}) {
        const float* in = x.data() + (x.size() - static_cast<size_t>(n));
        for (int64_t first : {int64_t{0}, 3 * codec->alignment()}) {
          for (int64_t d : {1, 2, 3, 8}) {
            for (bool scalar : {false, true}) {
              std::unique_ptr<ScopedScalarKernels> force(scalar ? new ScopedScalarKernels : nullptr);
              const std::string what = describe(spec) + " n=" + std::to_string(n) + " first=" + std::to_string(first) +
                                       " d=" + std::to_string(d) + (scalar ? " scalar" : "");
              const std::vector<uint8_t> want_payload = encode(*codec, in, n, rng, first);
              std::vector<float> want(static_cast<size_t>(n));
              codec->decode_average(want_payload, n, want.data(), d);
              std::vector<uint8_t> payload(codec->encoded_bytes(n));
              std::vector<float> values(static_cast<size_t>(n), -3.0f);
              codec->encode_with_values(in, n, payload.data(), rng, first, values.data(), d);
              ASSERT_EQ(payload, want_payload) << what;
              // (memcmp of n = 0 would pass data() == nullptr: UB.)
              ASSERT_TRUE(n == 0 || std::memcmp(values.data(), want.data(), values.size() * sizeof(float)) == 0) << what;
              std::vector<float> same(in, in + n);  // in place
              codec->encode_with_values(same.data(), n, payload.data(), rng, first, same.data(), d);
              ASSERT_EQ(payload, want_payload) << what << " in place";
              ASSERT_TRUE(n == 0 || std::memcmp(same.data(), want.data(), same.size() * sizeof(float)) == 0)
                  << what << " in place";
            }
          }
        }
      }
    }
  }
  std::vector<uint8_t> p(make_dense_codec(payload_specs(64)[0])->encoded_bytes(8));
  std::vector<float> v(8);
  EXPECT_THROW(make_dense_codec(payload_specs(64)[0])->encode_with_values(x.data(), 8, p.data(), rng, 0, v.data(), 0),
               InvalidArgument);
}

// A page of bytes followed by a page that may not be read: a stream placed at the end
// of the first page faults on any read past its last byte.
class GuardedPage {
 public:
  GuardedPage() : size_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
    void* p = mmap(nullptr, 2 * size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || mprotect(static_cast<uint8_t*>(p) + size_, size_, PROT_NONE) != 0) std::abort();
    base_ = static_cast<uint8_t*>(p);
  }
  ~GuardedPage() { munmap(base_, 2 * size_); }
  GuardedPage(const GuardedPage&) = delete;
  GuardedPage& operator=(const GuardedPage&) = delete;
  uint8_t* last(size_t bytes) { return base_ + size_ - bytes; }  // the final `bytes` readable bytes

 private:
  size_t size_;
  uint8_t* base_;
};

// Each AVX2 decoder called directly at every width it unpacks, from start offsets
// on and off a group of 8, over runs that end mid-group and at the end of the
// stream (random codes, the stream's last byte just before an unreadable page, so
// the 16-byte loads must stay inside it); and the level maximum.
TEST(DenseSimdKernels, DecodersMatchTheFormulas) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 gen(27);
  const uint64_t total = 301;
  GuardedPage page;
  const std::vector<float> out = awkward_out(total, 28);
  const float lo = -1.5f, step = 0.1f, unit = 0.37f, scale = bits_float(0x7FC12345u);
  for (unsigned bits = 1; bits <= kMaxAvx2DecodeBits; ++bits) {
    uint8_t* const packed = page.last(packed_code_bytes(total, bits));
    for (uint64_t i = 0; i < packed_code_bytes(total, bits); ++i) packed[i] = static_cast<uint8_t>(gen());
    const CodeStream s{packed, total, bits};
    const uint32_t level_mask = (1u << (bits - 1)) - 1u;
    uint32_t worst = 0;
    for (uint64_t i = 0; i < total; ++i) worst = std::max(worst, read_code(packed, i, bits) & level_mask);
    ASSERT_EQ(max_level_avx2(s, level_mask), worst) << "bits " << bits;
    for (uint64_t first : {uint64_t{0}, uint64_t{1}, uint64_t{3}, uint64_t{8}, uint64_t{13}, uint64_t{250}}) {
      for (uint64_t m : {uint64_t{0}, uint64_t{5}, uint64_t{16}, uint64_t{37}, total - first}) {
        const std::string where = "bits " + std::to_string(bits) + " first " + std::to_string(first) + " m " +
                                  std::to_string(m);
        // `decode(y, store, f)` against y[k] = v, y[k] += v and y[k] = v * f (f = 1/2,
        // 1/8: decode_average's), v = value(code first + k).
        auto check = [&](const char* name, auto decode, auto value) {
          for (const auto& [store, f] : {std::pair{DecodeStore::kSet, 1.0f}, std::pair{DecodeStore::kAdd, 1.0f},
                                         std::pair{DecodeStore::kScale, 0.5f}, std::pair{DecodeStore::kScale, 0.125f}}) {
            const bool add = store == DecodeStore::kAdd;
            std::vector<float> y(out.begin(), out.begin() + m), ref = y;
            std::vector<bool> nan_pair(m, false);
            decode(y.data(), store, f);
            for (size_t k = 0; k < m; ++k) {
              const float v = value(read_code(packed, first + k, bits));
              ref[k] = add ? ref[k] + v : store == DecodeStore::kScale ? v / (1.0f / f) : v;
              nan_pair[k] = add && is_nan(out[k]) && is_nan(v);
            }
            ASSERT_EQ(first_difference(y, ref, nan_pair), -1)
                << name << " " << where << " store " << static_cast<int>(store) << " f " << f;
          }
        };
        if (first + m > total) continue;
        check("quant", [&](float* y, DecodeStore st, float f) { quant_decode_avx2(s, first, m, lo, step, st, f, y); },
              [&](uint32_t c) { return quant_value(lo, step, c); });
        if (bits > 1) {
          check("qsgd", [&](float* y, DecodeStore st, float f) { qsgd_decode_avx2(s, first, m, unit, st, f, y); },
                [&](uint32_t c) { return qsgd_value(c, unit, bits); });
        } else {
          check("sign", [&](float* y, DecodeStore st, float f) { sign_decode_avx2(s, first, m, scale, st, f, y); },
                [&](uint32_t c) { return sign_value(scale, c); });
        }
      }
    }
  }
}

// Decoded floats of a fixed matrix, hashed: taken from the scalar decoders as they
// were before the AVX2 decoders existed, so a change that moved both paths together
// would still fail here. NaNs hash as one value: which of two NaN operands an x86
// add returns follows the operand order the compiler chose for the scalar loop, so
// their bits may differ between compilers (the tests above compare them between the
// paths of one build). Re-pinned on 2026-11-27 with the payload digest above (the
// stochastic payloads it decodes changed).
TEST(DenseCodecBytes, DecodedDigestIsPinned) {
  const std::vector<float> x = awkward_input(5000, 31);
  const std::vector<float> out = awkward_out(5000, 32);
  uint64_t digest = 0xcbf29ce484222325ull;
  for (int64_t bucket : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{512}, int64_t{1000}}) {
    for (const CompressorSpec& spec : decode_specs(bucket)) {
      const auto codec = make_dense_codec(spec);
      for (int64_t n : {0, 1, 13, 511, 1025, 5000}) {
        const std::vector<uint8_t> p = encode(*codec, x.data() + (5000 - n), n, PhiloxStream{77, 78}, 0);
        for (bool add : {false, true}) {
          const Decoded d = decode_onto(*codec, p, n, add, std::vector<float>(out.begin(), out.begin() + n));
          ASSERT_FALSE(d.corrupt);
          for (float v : d.out) {
            const uint32_t b = is_nan(v) ? kCanonicalNanBits : float_bits(v);
            const uint8_t le[4] = {static_cast<uint8_t>(b), static_cast<uint8_t>(b >> 8),
                                   static_cast<uint8_t>(b >> 16), static_cast<uint8_t>(b >> 24)};
            digest = fnv1a(le, 4, digest);
          }
        }
      }
    }
  }
  std::printf("decoded digest 0x%016llx\n", static_cast<unsigned long long>(digest));
  EXPECT_EQ(digest, 0x47a493e78e7b44b0ull);
}

}  // namespace
}  // namespace gradcomm::detail
