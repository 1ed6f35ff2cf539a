// The dense codecs (fp16, bf16, quant, qsgd, sign) against references written from
// the format description (compressors/FORMAT.md, "Dense codecs") in double precision:
// codes read back bit by bit, scales recomputed, rounding checked against the exact grid
// position.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "compressors/codec.h"
#include "compressors/payload.h"
#include "compressors/philox.h"
#include "compressors/dense/bitpack.h"
#include "compressors/dense/dense_util.h"
#include "compressors/dense_codec_spec.h"
#include "compressors/quantize/quantize.h"
#include "compressors/spec.h"
#include "gradcomm/errors.h"
#include "half.h"

namespace gradcomm::detail {

// Readable parameter names in failure messages (found by ADL, so outside the unnamed namespace).
std::string spec_name(const CompressorSpec& s);
void PrintTo(const CompressorSpec& s, std::ostream* os) { *os << spec_name(s); }

namespace {

constexpr int64_t kBucket = 64;
constexpr size_t kHeader = 24;

CompressorSpec make_spec(CompressorId id, int bits = 0, Rounding round = Rounding::kStochastic, int levels = 0,
                         int64_t bucket = kBucket) {
  return dense_codec_spec(id, bits, round, levels, bucket);
}

}  // namespace

std::string spec_name(const CompressorSpec& s) {
  std::string name = compressor_name(s.id);
  if (s.id == CompressorId::kQuant) {
    name += std::to_string(dense_codec_fields(s).bits) + (dense_codec_fields(s).round == Rounding::kNearest ? "nearest" : "stochastic");
  }
  if (s.id == CompressorId::kQsgd) name += std::to_string(dense_codec_fields(s).levels);
  return name;
}

namespace {

// Every configuration the tests sweep.
std::vector<CompressorSpec> all_specs() {
  std::vector<CompressorSpec> v = {make_spec(CompressorId::kFp16), make_spec(CompressorId::kBf16),
                                   make_spec(CompressorId::kSign)};
  for (int bits : {1, 2, 4, 8}) {
    v.push_back(make_spec(CompressorId::kQuant, bits, Rounding::kNearest));
    v.push_back(make_spec(CompressorId::kQuant, bits, Rounding::kStochastic));
  }
  for (int levels : {1, 3, 16, 127, 1000}) v.push_back(make_spec(CompressorId::kQsgd, 0, Rounding::kStochastic, levels));
  return v;
}

bool is_cast(const CompressorSpec& s) { return s.id == CompressorId::kFp16 || s.id == CompressorId::kBf16; }
std::vector<int64_t> sizes() { return {0, 1, kBucket - 1, kBucket, kBucket + 1, 1000003}; }

// N(0, 1) values with exact zeros, a constant bucket and negative zeros mixed in.
std::vector<float> make_input(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(gen);
  for (int64_t i = 0; i < n; i += 37) x[i] = (i / 37) % 2 ? 0.0f : -0.0f;
  for (int64_t i = 2 * kBucket; i < std::min<int64_t>(n, 3 * kBucket); ++i) x[i] = 0.75f;  // constant bucket
  return x;
}

std::vector<uint8_t> encode(const DenseCodec& c, const float* x, int64_t n, PhiloxStream rng = {}, int64_t first = 0) {
  std::vector<uint8_t> p(c.encoded_bytes(n));
  c.encode(x, n, p.data(), rng, first);
  return p;
}
std::vector<float> decode(const DenseCodec& c, const std::vector<uint8_t>& p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), -12345.0f);
  c.decode(p, n, out.data());
  return out;
}

uint32_t bits_of(float f) { return float_bits(f); }
float f32_at(const std::vector<uint8_t>& p, size_t offset) {
  float v;
  std::memcpy(&v, p.data() + offset, 4);
  return v;
}
// Independent bit reader: code i of `bits` bits, stream bit k = bit k % 8 of byte k / 8.
uint32_t code_at(const uint8_t* codes, uint64_t i, unsigned bits) {
  uint32_t c = 0;
  for (unsigned b = 0; b < bits; ++b) {
    const uint64_t k = i * bits + b;
    c |= static_cast<uint32_t>((codes[k / 8] >> (k % 8)) & 1u) << b;
  }
  return c;
}
unsigned qsgd_bits_ref(int levels) { return 1 + static_cast<unsigned>(std::ceil(std::log2(levels + 1.0))); }
unsigned code_bits(const CompressorSpec& s) {
  switch (s.id) {
    case CompressorId::kQuant: return static_cast<unsigned>(dense_codec_fields(s).bits);
    case CompressorId::kQsgd: return qsgd_bits_ref(dense_codec_fields(s).levels);
    case CompressorId::kSign: return 1;
    default: return 16;
  }
}
size_t scale_bytes_per_bucket(const CompressorSpec& s) { return s.id == CompressorId::kQuant ? 8 : 4; }
size_t expected_bytes(const CompressorSpec& s, int64_t n) {
  if (is_cast(s)) return kHeader + 2 * static_cast<size_t>(n);
  const size_t buckets = static_cast<size_t>((n + dense_codec_fields(s).bucket - 1) / dense_codec_fields(s).bucket);
  return kHeader + buckets * scale_bytes_per_bucket(s) + (static_cast<size_t>(n) * code_bits(s) + 7) / 8;
}

// Checks payload and decode of x against the format, element by element.
void check_against_reference(const CompressorSpec& s, const std::vector<float>& x, const std::vector<uint8_t>& p,
                             const std::vector<float>& y) {
  const int64_t n = static_cast<int64_t>(x.size());
  ASSERT_EQ(p.size(), expected_bytes(s, n));
  if (is_cast(s)) {
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = s.id == CompressorId::kFp16 ? float_to_half(x[i]) : float_to_bf16(x[i]);
      const float want = s.id == CompressorId::kFp16 ? half_to_float(h) : bf16_to_float(h);
      ASSERT_EQ(bits_of(y[i]), bits_of(want)) << i;
      ASSERT_EQ(p[kHeader + 2 * i] | (p[kHeader + 2 * i + 1] << 8), h) << i;
    }
    return;
  }
  const int64_t buckets = (n + dense_codec_fields(s).bucket - 1) / dense_codec_fields(s).bucket;
  const uint8_t* codes = p.data() + kHeader + buckets * scale_bytes_per_bucket(s);
  const unsigned bits = code_bits(s);
  for (int64_t b = 0; b < buckets; ++b) {
    const int64_t begin = b * dense_codec_fields(s).bucket, end = std::min(n, begin + dense_codec_fields(s).bucket);
    double sum_abs = 0, sum_sq = 0;
    float lo = x[begin], hi = x[begin];
    for (int64_t i = begin; i < end; ++i) {
      sum_abs += std::fabs(x[i]);
      sum_sq += static_cast<double>(x[i]) * x[i];
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    if (s.id == CompressorId::kSign) {
      const float scale = f32_at(p, kHeader + 4 * b);
      ASSERT_NEAR(scale, sum_abs / (end - begin), 1e-5 * (sum_abs / (end - begin)) + 1e-30) << b;
      for (int64_t i = begin; i < end; ++i) {
        ASSERT_EQ(code_at(codes, i, 1), std::signbit(x[i]) ? 1u : 0u) << i;
        ASSERT_EQ(bits_of(y[i]), bits_of(std::signbit(x[i]) ? -scale : scale)) << i;
      }
    } else if (s.id == CompressorId::kQuant) {
      const float plo = f32_at(p, kHeader + 8 * b), phi = f32_at(p, kHeader + 8 * b + 4);
      ASSERT_EQ(plo, lo) << b;
      ASSERT_EQ(phi, hi) << b;
      const double levels = (1 << dense_codec_fields(s).bits) - 1, step = (static_cast<double>(hi) - lo) / levels;
      for (int64_t i = begin; i < end; ++i) {
        const uint32_t code = code_at(codes, i, bits);
        const double t = step > 0 ? (x[i] - static_cast<double>(lo)) / step : 0.0;  // exact grid position
        if (dense_codec_fields(s).round == Rounding::kNearest) {
          const bool near_midpoint = std::fabs(t - std::floor(t) - 0.5) < 1e-4;
          if (!near_midpoint) ASSERT_EQ(code, static_cast<uint32_t>(std::lround(t))) << i << " t=" << t;
          ASSERT_LE(std::fabs(y[i] - static_cast<double>(x[i])), step / 2 + 1e-5 * (std::fabs(lo) + std::fabs(hi)))
              << i;
        } else {
          ASSERT_GE(code + 1e-4, std::floor(t)) << i;
          ASSERT_LE(code - 1e-4, std::ceil(t)) << i;
        }
        // On the grid: min + code * step, up to fp32 rounding.
        ASSERT_NEAR(y[i], lo + code * step, 1e-6 * (std::fabs(lo) + std::fabs(hi)) + 1e-30) << i;
      }
    } else {  // qsgd
      const float norm = f32_at(p, kHeader + 4 * b);
      ASSERT_NEAR(norm, std::sqrt(sum_sq), 1e-5 * std::sqrt(sum_sq)) << b;
      const double unit = static_cast<double>(norm) / dense_codec_fields(s).levels;
      for (int64_t i = begin; i < end; ++i) {
        const uint32_t code = code_at(codes, i, bits);
        const uint32_t level = code & ((1u << (bits - 1)) - 1u);
        ASSERT_EQ(code >> (bits - 1), std::signbit(x[i]) ? 1u : 0u) << i;
        const double l = norm > 0 ? std::fabs(x[i]) / unit : 0.0;
        ASSERT_LE(level, static_cast<uint32_t>(dense_codec_fields(s).levels));
        ASSERT_GE(level + 1e-3, std::floor(l)) << i;
        ASSERT_LE(level - 1e-3, std::ceil(l)) << i;
        const double want = (std::signbit(x[i]) ? -1 : 1) * unit * level;
        ASSERT_NEAR(y[i], want, 1e-6 * std::fabs(want)) << i;
      }
    }
  }
}

class DenseCodecs : public ::testing::TestWithParam<CompressorSpec> {};

TEST_P(DenseCodecs, MatchesReferenceAtEverySize) {
  const auto codec = make_dense_codec(GetParam());
  for (int64_t n : sizes()) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto x = make_input(n, 11);
    const auto p = encode(*codec, x.data(), n, PhiloxStream{3, 4});
    check_against_reference(GetParam(), x, p, decode(*codec, p, n));
    if (HasFatalFailure()) return;
  }
}

TEST_P(DenseCodecs, EncodedBytesExactAndEveryByteWritten) {
  const auto codec = make_dense_codec(GetParam());
  for (int64_t n : sizes()) {
    const auto x = make_input(n, 12);
    ASSERT_EQ(codec->encoded_bytes(n), expected_bytes(GetParam(), n)) << n;
    std::vector<uint8_t> a(codec->encoded_bytes(n), 0xAA), b(codec->encoded_bytes(n), 0x55);
    codec->encode(x.data(), n, a.data(), PhiloxStream{1, 2}, 0);
    codec->encode(x.data(), n, b.data(), PhiloxStream{1, 2}, 0);
    ASSERT_EQ(a, b) << n;  // no byte left as it was
  }
}

TEST_P(DenseCodecs, SegmentsEncodeAsInsideTheWholeTensor) {
  const auto codec = make_dense_codec(GetParam());
  const int64_t a = codec->alignment();
  ASSERT_EQ(a, is_cast(GetParam()) ? 1 : kBucket);
  for (int64_t n : {5 * kBucket + 7, int64_t{1000003}}) {
    const auto x = make_input(n, 13);
    const PhiloxStream rng{9, 10};
    const auto whole = decode(*codec, encode(*codec, x.data(), n, rng), n);
    // Segments start at multiples of the alignment; the last one ends at n.
    const std::vector<int64_t> cuts = {0, a, 3 * a, 4 * a, n};
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const int64_t first = cuts[k], m = cuts[k + 1] - first;
      const auto part = decode(*codec, encode(*codec, x.data() + first, m, rng, first), m);
      for (int64_t i = 0; i < m; ++i) ASSERT_EQ(bits_of(part[i]), bits_of(whole[first + i])) << first + i;
    }
  }
}

TEST_P(DenseCodecs, DecodeAddAdds) {
  const auto codec = make_dense_codec(GetParam());
  for (int64_t n : sizes()) {
    const auto x = make_input(n, 14);
    const auto base = make_input(n, 15);
    const auto p = encode(*codec, x.data(), n, PhiloxStream{5, 6});
    const auto y = decode(*codec, p, n);
    auto acc = base;
    codec->decode_add(p, n, acc.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits_of(acc[i]), bits_of(base[i] + y[i])) << i;
  }
}

TEST_P(DenseCodecs, NonFiniteInputPoisonsItsBucketOnly) {
  const CompressorSpec s = GetParam();
  const auto codec = make_dense_codec(s);
  const int64_t n = 4 * kBucket;
  auto x = make_input(n, 16);
  x[kBucket + 5] = std::numeric_limits<float>::quiet_NaN();
  x[2 * kBucket + 9] = std::numeric_limits<float>::infinity();
  x[3 * kBucket + 1] = -std::numeric_limits<float>::infinity();
  const auto y = decode(*codec, encode(*codec, x.data(), n, PhiloxStream{7, 8}), n);
  for (int64_t i = 0; i < n; ++i) {
    if (is_cast(s)) {
      ASSERT_EQ(std::isnan(y[i]), std::isnan(x[i])) << i;
      if (std::isinf(x[i])) ASSERT_EQ(y[i], x[i]) << i;
    } else {
      // Buckets 1..3 hold a NaN or an infinity: every element decodes to NaN.
      ASSERT_EQ(std::isnan(y[i]), i >= kBucket) << i;
    }
  }
}

// Mean of 2000 decodes (2000 Philox streams) within 4 sigma of x per element, sigma
// from the exact two-point distribution on the grid; 3 draws of slack cover the
// Poisson-like tail when x sits very close to a grid point.
class StochasticCodecs : public ::testing::TestWithParam<CompressorSpec> {};

TEST_P(StochasticCodecs, RoundingIsUnbiased) {
  const CompressorSpec s = GetParam();
  const auto codec = make_dense_codec(s);
  constexpr int kDraws = 2000;
  for (int64_t n : {int64_t{1}, kBucket - 1, kBucket + 1, 3 * kBucket + 5}) {
    const auto x = make_input(n, 17);
    std::vector<double> sum(static_cast<size_t>(n), 0.0);
    std::vector<uint8_t> p;
    for (int d = 0; d < kDraws; ++d) {
      p = encode(*codec, x.data(), n, PhiloxStream{21, static_cast<uint64_t>(d)});
      const auto y = decode(*codec, p, n);
      for (int64_t i = 0; i < n; ++i) sum[i] += y[i];
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = i / dense_codec_fields(s).bucket;
      double grid, position, scale_mag;  // grid spacing, x's position in grid units
      if (s.id == CompressorId::kQuant) {
        const double lo = f32_at(p, kHeader + 8 * b), hi = f32_at(p, kHeader + 8 * b + 4);
        grid = (hi - lo) / ((1 << dense_codec_fields(s).bits) - 1);
        position = grid > 0 ? (x[i] - lo) / grid : 0.0;
        scale_mag = std::fabs(lo) + std::fabs(hi);
      } else {
        grid = f32_at(p, kHeader + 4 * b) / static_cast<double>(dense_codec_fields(s).levels);
        position = grid > 0 ? std::fabs(x[i]) / grid : 0.0;
        scale_mag = grid * dense_codec_fields(s).levels;
      }
      const double frac = position - std::floor(position);
      const double sigma_draws = std::sqrt(kDraws * frac * (1 - frac));
      const double tolerance = (4 * sigma_draws + 3) * grid / kDraws + 1e-6 * scale_mag;
      ASSERT_NEAR(sum[i] / kDraws, x[i], tolerance) << "n=" << n << " i=" << i << " frac=" << frac;
    }
  }
}

std::vector<CompressorSpec> stochastic_specs() {
  std::vector<CompressorSpec> v;
  for (const auto& s : all_specs()) {
    if (s.id == CompressorId::kQsgd || (s.id == CompressorId::kQuant && dense_codec_fields(s).round == Rounding::kStochastic)) v.push_back(s);
  }
  return v;
}
INSTANTIATE_TEST_SUITE_P(AllStochastic, StochasticCodecs, ::testing::ValuesIn(stochastic_specs()),
                         [](const auto& info) { return spec_name(info.param); });

// ---- untrusted payloads ------------------------------------------------------------

// Expects CorruptPayload from decode and decode_add, and `out` untouched by decode_add.
void expect_corrupt(const DenseCodec& c, const std::vector<uint8_t>& p, int64_t n, const std::string& what) {
  std::vector<float> out(static_cast<size_t>(n), 1.5f);
  EXPECT_THROW(c.decode_add(p, n, out.data()), CorruptPayload) << what;
  for (float v : out) ASSERT_EQ(v, 1.5f) << what << ": decode_add wrote before rejecting";
  EXPECT_THROW(c.decode(p, n, out.data()), CorruptPayload) << what;
}

TEST_P(DenseCodecs, MalformedPayloadsAreCorrupt) {
  const auto codec = make_dense_codec(GetParam());
  for (int64_t n : {int64_t{0}, int64_t{1}, kBucket + 3}) {
    const auto x = make_input(n, 18);
    const auto good = encode(*codec, x.data(), n, PhiloxStream{1, 1});
    for (size_t len = 0; len < good.size(); ++len) {
      expect_corrupt(*codec, std::vector<uint8_t>(good.begin(), good.begin() + len), n, "truncated to " + std::to_string(len));
    }
    auto trailing = good;
    trailing.push_back(0);
    expect_corrupt(*codec, trailing, n, "trailing byte");
    for (size_t offset : {size_t{0}, size_t{4}, size_t{5}, size_t{6}, size_t{8}, size_t{16}, size_t{20}}) {
      auto bad = good;
      bad[offset] ^= 0x01;
      expect_corrupt(*codec, bad, n, "header byte " + std::to_string(offset));
    }
    expect_corrupt(*codec, good, n + 1, "numel mismatch");
  }
}

TEST_P(DenseCodecs, RandomBytesNeverCrash) {
  const CompressorSpec s = GetParam();
  const auto codec = make_dense_codec(s);
  const int64_t n = 2 * kBucket + 3;
  const auto x = make_input(n, 19);
  const auto good = encode(*codec, x.data(), n);
  std::mt19937 gen(20);
  std::vector<float> out(static_cast<size_t>(n));
  for (int trial = 0; trial < 300; ++trial) {
    // Half the trials keep a valid header and length so the body checks are reached.
    std::vector<uint8_t> p(trial % 2 ? good.size() : gen() % (2 * good.size()));
    for (auto& byte : p) byte = static_cast<uint8_t>(gen());
    if (trial % 2) std::copy(good.begin(), good.begin() + kHeader, p.begin());
    if (trial % 2 == 0) {
      EXPECT_THROW(codec->decode(p, n, out.data()), CorruptPayload);
      continue;
    }
    try {
      codec->decode_add(p, n, out.data());
    } catch (const CorruptPayload&) {
    }
  }
  // Single byte flips anywhere: decoded or rejected, never anything else.
  for (size_t i = 0; i < good.size(); ++i) {
    auto p = good;
    p[i] ^= static_cast<uint8_t>(1u << (i % 8));
    try {
      codec->decode(p, n, out.data());
    } catch (const CorruptPayload&) {
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, DenseCodecs, ::testing::ValuesIn(all_specs()),
                         [](const auto& info) { return spec_name(info.param); });

// Scales an encoder can never write are rejected; the NaN of a poisoned bucket is not.
TEST(DenseCodecPayloads, InvalidScalesAreCorrupt) {
  const int64_t n = kBucket + 3;
  const auto x = make_input(n, 22);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto with_f32 = [](std::vector<uint8_t> p, size_t offset, float v) {
    std::memcpy(p.data() + offset, &v, 4);
    return p;
  };
  const auto quant = make_dense_codec(make_spec(CompressorId::kQuant, 4, Rounding::kNearest));
  const auto q = encode(*quant, x.data(), n);
  expect_corrupt(*quant, with_f32(with_f32(q, kHeader, 2.0f), kHeader + 4, 1.0f), n, "min > max");
  expect_corrupt(*quant, with_f32(q, kHeader + 4, inf), n, "infinite max");
  expect_corrupt(*quant, with_f32(q, kHeader, nan), n, "NaN min, finite max");
  expect_corrupt(*quant, with_f32(with_f32(q, kHeader, -3e38f), kHeader + 4, 3e38f), n, "range overflows");
  const auto poisoned = with_f32(with_f32(q, kHeader, nan), kHeader + 4, nan);
  const auto y = decode(*quant, poisoned, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(std::isnan(y[i]), i < kBucket) << i;

  const auto qsgd = make_dense_codec(make_spec(CompressorId::kQsgd, 0, Rounding::kStochastic, 16));
  const auto g = encode(*qsgd, x.data(), n);
  expect_corrupt(*qsgd, with_f32(g, kHeader, -1.0f), n, "negative norm");
  expect_corrupt(*qsgd, with_f32(g, kHeader + 4, inf), n, "infinite norm");
  auto high_level = g;  // first code (6 bits, level 5 bits): level 31 > 16
  high_level[kHeader + 8] = static_cast<uint8_t>((high_level[kHeader + 8] & ~0x1Fu) | 0x1Fu);
  expect_corrupt(*qsgd, high_level, n, "level above s");

  const auto sign = make_dense_codec(make_spec(CompressorId::kSign));
  const auto sg = encode(*sign, x.data(), n);
  expect_corrupt(*sign, with_f32(sg, kHeader, -0.5f), n, "negative scale");
  expect_corrupt(*sign, with_f32(sg, kHeader + 4, -inf), n, "infinite scale");
  auto padding = sg;  // 67 bits: the last byte holds 3, the other 5 must be zero
  padding.back() |= 0x80;
  expect_corrupt(*sign, padding, n, "padding bits");
  auto params = sg;
  params[20] ^= 1;  // param1 = bucket
  expect_corrupt(*sign, params, n, "bucket mismatch");
}

TEST(DenseCodecFactory, RejectsWhatIsNotADenseCodec) {
  for (CompressorId id : {CompressorId::kNone, CompressorId::kTopk, CompressorId::kRandomk, CompressorId::kSketch}) {
    EXPECT_THROW(make_dense_codec(make_spec(id)), InvalidArgument) << compressor_name(id);
  }
  EXPECT_THROW(make_dense_codec(make_spec(CompressorId::kQuant, 3, Rounding::kNearest)), InvalidArgument);
  EXPECT_THROW(make_dense_codec(make_spec(CompressorId::kQuant, 8, Rounding::kNearest, 0, 0)), InvalidArgument);
  EXPECT_THROW(make_dense_codec(make_spec(CompressorId::kQsgd, 0, Rounding::kStochastic, 0)), InvalidArgument);
  EXPECT_THROW(make_dense_codec(make_spec(CompressorId::kSign, 0, Rounding::kStochastic, 0, -1)), InvalidArgument);
  const auto sign = make_dense_codec(make_spec(CompressorId::kSign));
  std::vector<float> x(10);
  std::vector<uint8_t> p(sign->encoded_bytes(10));
  EXPECT_THROW(sign->encode(x.data(), 10, p.data(), {}, 3), InvalidArgument);  // first not aligned
  EXPECT_THROW(sign->encoded_bytes(-1), InvalidArgument);
}

// ---- building blocks ----------------------------------------------------------------

// (fill_uniforms and the bulk Philox paths: test_dense_codec_bytes.cc and test_philox.cc.)

// Writes and reads back in uneven pieces, as bucket boundaries cut them; checks the
// stream bit by bit and that nothing is written past packed_code_bytes.
template <unsigned kBits>
void check_round_trip(unsigned bits) {
  std::mt19937 gen(23 + bits);
  const uint64_t n = 1000 + bits;
  std::vector<uint32_t> codes(n);
  for (auto& c : codes) c = gen() & ((1u << bits) - 1u);
  std::vector<uint8_t> packed(packed_code_bytes(n, bits) + 1, 0xEE);  // one guard byte
  CodeWriter<kBits> writer(packed.data(), bits);
  for (uint64_t i = 0; i < n;) {
    const uint64_t m = std::min<uint64_t>(n - i, gen() % 20);
    writer.put(codes.data() + i, m);
    i += m;
  }
  writer.finish();
  ASSERT_EQ(packed.back(), 0xEE) << bits;
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_EQ(code_at(packed.data(), i, bits), codes[i]) << bits << " " << i;
    ASSERT_EQ(read_code(packed.data(), i, bits), codes[i]) << bits << " " << i;
  }
  CodeReader<kBits> reader(packed.data(), n, bits);
  std::vector<uint32_t> back(n);
  for (uint64_t i = 0; i < n;) {
    const uint64_t m = std::min<uint64_t>(n - i, gen() % 20);
    reader.get(back.data() + i, m);
    i += m;
  }
  ASSERT_EQ(back, codes) << bits;
}

TEST(DenseCodecParts, BitPackingRoundTripsAtEveryWidth) {
  for (unsigned bits = 1; bits <= kMaxCodeBits; ++bits) check_round_trip<0>(bits);
  check_round_trip<1>(1);
  check_round_trip<2>(2);
  check_round_trip<4>(4);
  check_round_trip<6>(6);
  check_round_trip<8>(8);
}

}  // namespace
}  // namespace gradcomm::detail
