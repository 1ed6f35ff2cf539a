// The logic of the CUDA dense codecs (compressors/dense/gpu_dense_logic.h, and each family's
// layout and policy in its folder: compressors/cast/gpu_cast_logic.h,
// compressors/quantize/gpu_quant_logic.h, compressors/quantize/gpu_qsgd_logic.h,
// compressors/sign/gpu_sign_logic.h), run on the CPU the way the kernels run it: 8 lanes
// per bucket combined with the kernel's shuffle tree, then independent groups of 8
// elements. Held to the CPU codecs (the reference) byte for byte: payloads, decoded
// values, error-feedback residuals, and the decoder's verdict on corrupted payloads.
// Needs no GPU, so the GPU codecs' logic is tested on every machine;
// tests/cuda/test_gpu_dense_codecs.cc runs the kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compressors/codec.h"
#include "compressors/payload.h"
#include "compressors/philox.h"
#include "compressors/cast/gpu_cast_logic.h"
#include "compressors/dense/gpu_dense_logic.h"
#include "compressors/dense/bitpack.h"
#include "compressors/quantize/gpu_qsgd_logic.h"
#include "compressors/quantize/gpu_quant_logic.h"
#include "compressors/sign/gpu_sign_logic.h"
#include "compressors/dense_codec_spec.h"
#include "compressors/quantize/quantize.h"
#include "compressors/spec.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {


std::string name_of(const CompressorSpec& s) {
  std::string n = compressor_name(s.id);
  if (s.id == CompressorId::kQuant) n += std::to_string(dense_codec_fields(s).bits) + (dense_codec_fields(s).round == Rounding::kNearest ? "n" : "s");
  if (s.id == CompressorId::kQsgd) n += std::to_string(dense_codec_fields(s).levels);
  if (dense_codec_fields(s).bucket != 0) n += "/B" + std::to_string(dense_codec_fields(s).bucket);
  return n;
}

// Buckets: the default (a multiple of 8 and 32), one that is not (groups straddle
// buckets), and one shorter than a group (several buckets per group).
std::vector<CompressorSpec> all_specs() {
  std::vector<CompressorSpec> v = {dense_codec_spec(CompressorId::kFp16), dense_codec_spec(CompressorId::kBf16)};
  for (int64_t bucket : {512, 100, 7}) {
    for (int bits : {1, 2, 4, 8}) {
      for (Rounding r : {Rounding::kStochastic, Rounding::kNearest}) v.push_back(dense_codec_spec(CompressorId::kQuant, bits, r, 0, bucket));
    }
    for (int levels : {1, 4, 5, 127, 1000}) v.push_back(dense_codec_spec(CompressorId::kQsgd, 0, Rounding::kStochastic, levels, bucket));
    v.push_back(dense_codec_spec(CompressorId::kSign, 0, Rounding::kStochastic, 0, bucket));
  }
  return v;
}

std::vector<int64_t> sizes_for(const CompressorSpec& s) {
  const int64_t b = dense_codec_fields(s).bucket == 0 ? 64 : dense_codec_fields(s).bucket;
  return {0, 1, 7, std::max<int64_t>(1, b / 2), b - 1, b, b + 1, 3 * b + 5, 20011};
}

// Values of varied magnitude per region, exact zeros, -0.0, repeats and ties.
std::vector<float> random_input(int64_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  float scale = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 37 == 0) scale = std::ldexp(1.0f, static_cast<int>(g() % 40) - 20);
    const uint64_t kind = g() % 50;
    x[i] = kind == 0 ? 0.0f : kind == 1 ? -0.0f : kind == 2 && i > 0 ? x[i - 1] : normal(g) * scale;
  }
  return x;
}

bool same_float(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (std::isnan(a) && std::isnan(b));  // NaN payload bits are not part of the contract
}

void expect_same_floats(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!same_float(got[i], want[i])) {
      FAIL() << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
    }
  }
}

void expect_same_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) FAIL() << what << ": byte " << i << " is " << int(got[i]) << ", expected " << int(want[i]);
  }
}

// Calls f(policy) with the policy the kernels use for this spec.
template <class F>
void visit_policy(const CompressorSpec& s, const DenseLayout& l, F&& f) {
  switch (s.id) {
    case CompressorId::kFp16: return f(CastPolicy<false>{});
    case CompressorId::kBf16: return f(CastPolicy<true>{});
    case CompressorId::kQuant: return f(quant_policy(l, dense_codec_fields(s).round == Rounding::kStochastic));
    case CompressorId::kQsgd: return f(qsgd_policy(l));
    case CompressorId::kSign: return f(SignPolicy{});
    default: FAIL() << "not dense";
  }
}

// The layout each family's GPU codec names (its GpuDenseKernels::layout).
DenseLayout layout_of(const CompressorSpec& s, int64_t n) {
  const auto u = static_cast<uint64_t>(n);
  switch (s.id) {
    case CompressorId::kQuant: return quant_layout(dense_codec_fields(s).bits, dense_codec_fields(s).bucket, u);
    case CompressorId::kQsgd: return qsgd_layout(dense_codec_fields(s).levels, dense_codec_fields(s).bucket, u);
    case CompressorId::kSign: return sign_layout(dense_codec_fields(s).bucket, u);
    default: return cast_layout(s.id, u);
  }
}

// The kernel's lane combine: shfl_down by 1, 2, 4 over an 8-lane group, each lane
// combining its value with the shifted one; lane 0 holds the result. (Lanes whose
// source is past the group read another bucket's lane in the kernel: filled here
// with a value that must not matter.)
template <class Policy>
typename Policy::Acc shuffle_combine(const Policy& p, std::vector<typename Policy::Acc> v) {
  for (unsigned d : {1u, 2u, 4u}) {
    std::vector<typename Policy::Acc> next(8);
    for (unsigned lane = 0; lane < 8; ++lane) next[lane] = p.combine(v[lane], v[lane + d < 8 ? lane + d : lane]);
    v = next;
  }
  return v[0];
}

enum class Ef { kNone, kFold, kAccumulate };

struct Emulated {
  std::vector<uint8_t> payload;
  std::vector<float> residual, decoded;
};

// The encode kernels' work, in order: header, bucket pass, group pass.
Emulated emulate_encode(const CompressorSpec& s, const std::vector<float>& x, const PhiloxStream& rng, int64_t first,
                        Ef ef, std::vector<float> residual) {
  const int64_t n = static_cast<int64_t>(x.size());
  const DenseLayout l = layout_of(s, n);
  Emulated e;
  e.payload.assign(l.total_bytes(), 0xAB);  // garbage: every byte must be written
  e.decoded.assign(x.size(), 0.0f);
  write_dense_header(l, e.payload.data());
  uint8_t* scales = e.payload.data() + kDenseHeaderBytes;
  uint8_t* codes = e.payload.data() + l.codes_offset();
  visit_policy(s, l, [&](auto p) {
    using P = decltype(p);
    if constexpr (P::kBucketed) {
      for (uint64_t b = 0; b < l.buckets(); ++b) {
        const uint64_t start = b * l.bucket, m = std::min(l.bucket, l.n - start);
        const AccLoad load{x.data() + start, ef == Ef::kFold ? residual.data() + start : nullptr};
        std::vector<typename P::Acc> lanes(8);
        for (unsigned lane = 0; lane < 8; ++lane) lanes[lane] = lane_partial(p, load, m, lane);
        const auto acc = shuffle_combine(p, lanes);
        // The shuffle tree and dense_math.h's combine8 order are the same tree.
        const auto tree = combine8(p, lanes.data());
        EXPECT_EQ(std::memcmp(&acc, &tree, sizeof acc), 0) << "bucket " << b;
        p.finalize(acc, m, scales + b * l.scale_width);
      }
    }
    for (uint64_t g = 0; g < l.groups(); ++g) {
      const uint64_t i0 = g * 8;
      const int cnt = static_cast<int>(std::min<uint64_t>(8, l.n - i0));
      float acc[8] = {}, v[8];
      for (int k = 0; k < cnt; ++k) acc[k] = ef == Ef::kFold ? add_rn(x[i0 + k], residual[i0 + k]) : x[i0 + k];
      uint32_t words[kGroupWords];
      encode_group(p, l, scales, acc, cnt, i0, rng, static_cast<uint64_t>(first), words, v);
      for (unsigned j = 0; j < group_bytes(cnt, p.bits); ++j) codes[g * p.bits + j] = group_byte(words, j);
      for (int k = 0; k < cnt; ++k) {
        e.decoded[i0 + k] = v[k];
        if (ef == Ef::kFold) residual[i0 + k] = sub_rn(acc[k], v[k]);
        if (ef == Ef::kAccumulate) residual[i0 + k] = add_rn(residual[i0 + k], sub_rn(x[i0 + k], v[k]));
      }
    }
  });
  e.residual = residual;
  return e;
}

// The decode kernels' work: framing, sections, then (only when clean) the writes.
DenseFaultRecord emulate_decode(const CompressorSpec& s, const std::vector<uint8_t>& payload, int64_t n,
                                std::vector<float>& out, bool add) {
  const DenseLayout l = layout_of(s, n);
  DenseFaultRecord r = check_dense_header(payload.data(), payload.size(), l);
  if (r.fault != DenseFault::kNone) return r;
  const uint8_t* scales = payload.data() + kDenseHeaderBytes;
  const uint8_t* codes = payload.data() + l.codes_offset();
  visit_policy(s, l, [&](auto p) {
    using P = decltype(p);
    if constexpr (P::kBucketed) {
      for (uint64_t b = 0; b < l.buckets() && r.fault == DenseFault::kNone; ++b) {
        if (!p.scale_valid(scales + b * l.scale_width)) r = {DenseFault::kBadScale, 0, s64(b)};
      }
      if (p.check_codes()) {
        for (uint64_t i = 0; i < l.n && r.fault == DenseFault::kNone; ++i) {
          if (!p.code_valid(read_code(codes, i, p.bits))) r = {DenseFault::kBadCode, 0, s64(i)};
        }
      }
    }
    if (r.fault != DenseFault::kNone) return;
    for (uint64_t g = 0; g < l.groups(); ++g) {
      const uint64_t i0 = g * 8;
      const int cnt = static_cast<int>(std::min<uint64_t>(8, l.n - i0));
      uint32_t words[kGroupWords] = {};
      for (unsigned j = 0; j < group_bytes(cnt, p.bits); ++j) {
        words[j / 4] |= static_cast<uint32_t>(codes[g * p.bits + j]) << (8 * (j % 4));
      }
      float v[8];
      decode_group(p, l, scales, words, cnt, i0, v);
      for (int k = 0; k < cnt; ++k) out[i0 + k] = add ? add_rn(out[i0 + k], v[k]) : v[k];
    }
  });
  return r;
}

const PhiloxStream kRng{0x1234'5678'9ABCull, 0xFEDC'BA98'7654'3210ull};

TEST(GpuDenseLogic, PackMatchesCpuBitpackForEveryWidth) {
  std::mt19937 g(7);
  for (unsigned bits = 1; bits <= kMaxCodeBits; ++bits) {
    for (int trial = 0; trial < 200; ++trial) {
      uint32_t codes[8], back[8], words[kGroupWords];
      for (auto& c : codes) c = g() & ((1u << bits) - 1u);
      uint8_t cpu[kMaxCodeBits];
      pack_group8<0>(codes, bits, cpu);
      pack_codes8(codes, bits, words);
      for (unsigned j = 0; j < bits; ++j) ASSERT_EQ(group_byte(words, j), cpu[j]) << "bits " << bits << " byte " << j;
      for (unsigned j = bits; j < 4 * kGroupWords; ++j) ASSERT_EQ(group_byte(words, j), 0) << "bits " << bits;
      unpack_codes8(words, bits, back);
      for (int k = 0; k < 8; ++k) ASSERT_EQ(back[k], codes[k]) << "bits " << bits;
    }
  }
}

TEST(GpuDenseLogic, LayoutSizeMatchesCpuCodec) {
  for (const auto& s : all_specs()) {
    const auto cpu = make_dense_codec(s);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{9}, int64_t{1000003}, (int64_t{1} << 40) + 3}) {
      EXPECT_EQ(layout_of(s, n).total_bytes(), cpu->encoded_bytes(n)) << name_of(s) << " n=" << n;
    }
  }
}

TEST(GpuDenseLogic, EncodeDecodeMatchCpuByteForByte) {
  for (const auto& s : all_specs()) {
    const auto cpu = make_dense_codec(s);
    for (int64_t n : sizes_for(s)) {
      for (int64_t first : {int64_t{0}, 3 * cpu->alignment()}) {
        const std::string what = name_of(s) + " n=" + std::to_string(n) + " first=" + std::to_string(first);
        const auto x = random_input(n, static_cast<uint64_t>(n) * 31 + first);
        std::vector<uint8_t> want(cpu->encoded_bytes(n));
        cpu->encode(x.data(), n, want.data(), kRng, first);
        const Emulated e = emulate_encode(s, x, kRng, first, Ef::kNone, {});
        expect_same_bytes(e.payload, want, what + " payload");
        std::vector<float> ref(x.size()), got(x.size(), 123.0f);
        cpu->decode(want, n, ref.data());
        expect_same_floats(e.decoded, ref, what + " values computed while encoding");
        ASSERT_EQ(emulate_decode(s, want, n, got, false).fault, DenseFault::kNone) << what;
        expect_same_floats(got, ref, what + " decode");
        std::vector<float> y = random_input(n, 99), y_ref = y;
        cpu->decode_add(want, n, y_ref.data());
        ASSERT_EQ(emulate_decode(s, want, n, y, true).fault, DenseFault::kNone) << what;
        expect_same_floats(y, y_ref, what + " decode_add");
      }
    }
  }
}

TEST(GpuDenseLogic, ErrorFeedbackMatchesCpuReference) {
  for (const auto& s : all_specs()) {
    const auto cpu = make_dense_codec(s);
    const int64_t n = 3 * std::max<int64_t>(dense_codec_fields(s).bucket, 8) + 5;
    const int64_t first = cpu->alignment();
    const std::string what = name_of(s);
    const auto x = random_input(n, 5);
    auto r = random_input(n, 6);
    for (auto& v : r) v *= 0.01f;
    std::vector<float> dec(x.size());
    // kFold: acc = x + r; payload = encode(acc); r' = acc - decode(payload).
    std::vector<float> acc(x.size()), want_r(x.size());
    for (int64_t i = 0; i < n; ++i) acc[i] = x[i] + r[i];
    std::vector<uint8_t> want(cpu->encoded_bytes(n));
    cpu->encode(acc.data(), n, want.data(), kRng, first);
    cpu->decode(want, n, dec.data());
    for (int64_t i = 0; i < n; ++i) want_r[i] = acc[i] - dec[i];
    Emulated e = emulate_encode(s, x, kRng, first, Ef::kFold, r);
    expect_same_bytes(e.payload, want, what + " fold payload");
    expect_same_floats(e.residual, want_r, what + " fold residual");
    // kAccumulate: payload = encode(x); r' = r + (x - decode(payload)).
    cpu->encode(x.data(), n, want.data(), kRng, first);
    cpu->decode(want, n, dec.data());
    for (int64_t i = 0; i < n; ++i) want_r[i] = r[i] + (x[i] - dec[i]);
    e = emulate_encode(s, x, kRng, first, Ef::kAccumulate, r);
    expect_same_bytes(e.payload, want, what + " accumulate payload");
    expect_same_floats(e.residual, want_r, what + " accumulate residual");
    expect_same_floats(e.decoded, dec, what + " accumulate decoded");
  }
}

TEST(GpuDenseLogic, NonFiniteBucketsArePoisonedAsOnCpu) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto& s : all_specs()) {
    const auto cpu = make_dense_codec(s);
    const int64_t b = std::max<int64_t>(dense_codec_fields(s).bucket, 8);
    const int64_t n = 5 * b;
    auto x = random_input(n, 11);
    x[1] = nan;                    // bucket 0
    x[2 * b + b / 2] = -inf;       // bucket 2
    x[3 * b] = 3e38f;              // bucket 3: a range / square sum that overflows
    x[3 * b + b - 1] = -3e38f;
    x[4 * b + 1] = -nan;           // bucket 4
    std::vector<uint8_t> want(cpu->encoded_bytes(n));
    cpu->encode(x.data(), n, want.data(), kRng, 0);
    const Emulated e = emulate_encode(s, x, kRng, 0, Ef::kNone, {});
    expect_same_bytes(e.payload, want, name_of(s));
    std::vector<float> ref(x.size()), got(x.size());
    cpu->decode(want, n, ref.data());
    ASSERT_EQ(emulate_decode(s, want, n, got, false).fault, DenseFault::kNone);
    expect_same_floats(got, ref, name_of(s) + " decode");
    if (dense_codec_fields(s).bucket != 0) EXPECT_TRUE(std::isnan(got[0])) << name_of(s) << ": a NaN bucket decodes to NaN";
  }
}

// One corruption of a valid payload and the fault the GPU decoder must report.
struct Corruption {
  const char* name;
  DenseFault fault;
  std::function<bool(std::vector<uint8_t>&, const DenseLayout&)> apply;  // false: not applicable to this spec
};

std::vector<Corruption> corruptions() {
  auto set_f32 = [](std::vector<uint8_t>& p, uint64_t at, float v) { store_f32le(p.data() + at, v); };
  return {
      {"truncated", DenseFault::kBadLength, [](auto& p, auto&) { p.pop_back(); return true; }},
      {"trailing byte", DenseFault::kBadLength, [](auto& p, auto&) { p.push_back(0); return true; }},
      {"shorter than header", DenseFault::kBadLength, [](auto& p, auto&) { p.resize(23); return true; }},
      {"empty", DenseFault::kBadLength, [](auto& p, auto&) { p.clear(); return true; }},
      {"magic", DenseFault::kBadHeader, [](auto& p, auto&) { p[0] ^= 1; return true; }},
      {"version", DenseFault::kBadHeader, [](auto& p, auto&) { p[4] = 2; return true; }},
      {"compressor id", DenseFault::kBadHeader, [](auto& p, auto&) { p[5] ^= 0x10; return true; }},
      {"numel", DenseFault::kBadNumel, [](auto& p, auto&) { p[8] ^= 1; return true; }},
      {"numel high byte", DenseFault::kBadNumel, [](auto& p, auto&) { p[15] = 0x80; return true; }},
      {"flags", DenseFault::kBadHeader, [](auto& p, auto&) { p[7] = 1; return true; }},
      {"param0", DenseFault::kBadHeader, [](auto& p, auto&) { p[16] ^= 1; return true; }},
      {"param1", DenseFault::kBadHeader, [](auto& p, auto&) { p[23] ^= 0x40; return true; }},
      {"padding bit", DenseFault::kBadPadding,
       [](auto& p, const DenseLayout& l) {
         const unsigned used = static_cast<unsigned>(l.n * l.code_bits % 8);
         if (used == 0) return false;
         p.back() |= static_cast<uint8_t>(0x80);
         return true;
       }},
      {"negative scale", DenseFault::kBadScale,
       [=](auto& p, const DenseLayout& l) {
         if (l.scale_width != 4) return false;
         set_f32(p, 24 + 4 * (l.buckets() - 1), -1.0f);
         return true;
       }},
      {"infinite scale", DenseFault::kBadScale,
       [=](auto& p, const DenseLayout& l) {
         if (l.scale_width == 0) return false;
         set_f32(p, 24, std::numeric_limits<float>::infinity());
         return true;
       }},
      {"min above max", DenseFault::kBadScale,
       [=](auto& p, const DenseLayout& l) {
         if (l.scale_width != 8) return false;
         set_f32(p, 24 + 8 * (l.buckets() / 2), 2.0f);
         set_f32(p, 24 + 8 * (l.buckets() / 2) + 4, 1.0f);
         return true;
       }},
      {"half-poisoned pair", DenseFault::kBadScale,
       [=](auto& p, const DenseLayout& l) {
         if (l.scale_width != 8) return false;
         set_f32(p, 24, std::numeric_limits<float>::quiet_NaN());
         return true;
       }},
      {"range overflows", DenseFault::kBadScale,
       [=](auto& p, const DenseLayout& l) {
         if (l.scale_width != 8) return false;
         set_f32(p, 24, -3e38f);
         set_f32(p, 28, 3e38f);
         return true;
       }},
      {"level above s", DenseFault::kBadCode,
       [](auto& p, const DenseLayout& l) {
         if (l.id != CompressorId::kQsgd || ((l.param0 + 1) & l.param0) == 0) return false;
         // Element n - 1 gets level 2^(bits-1) - 1 > s (its sign bit untouched).
         const uint64_t i = l.n - 1, bit0 = i * l.code_bits;
         for (unsigned j = 0; j + 1 < l.code_bits; ++j) {
           const uint64_t bit = bit0 + j;
           p[l.codes_offset() + bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
         }
         return true;
       }},
  };
}

TEST(GpuDenseLogic, CorruptPayloadsAreRejectedAsOnCpu) {
  for (const auto& s : all_specs()) {
    const auto cpu = make_dense_codec(s);
    const int64_t n = 2 * std::max<int64_t>(dense_codec_fields(s).bucket, 8) + 3;  // a partial last bucket and byte
    const auto x = random_input(n, 3);
    std::vector<uint8_t> valid(cpu->encoded_bytes(n));
    cpu->encode(x.data(), n, valid.data(), kRng, 0);
    const DenseLayout l = layout_of(s, n);
    for (const auto& c : corruptions()) {
      std::vector<uint8_t> bad = valid;
      if (!c.apply(bad, l)) continue;
      const std::string what = name_of(s) + ": " + c.name;
      std::vector<float> out(static_cast<size_t>(n), 42.0f);
      const DenseFaultRecord r = emulate_decode(s, bad, n, out, false);
      EXPECT_EQ(static_cast<int>(r.fault), static_cast<int>(c.fault)) << what;
      for (float v : out) ASSERT_EQ(v, 42.0f) << what << ": output written";
      std::vector<float> cpu_out(static_cast<size_t>(n));
      EXPECT_THROW(cpu->decode(bad, n, cpu_out.data()), CorruptPayload) << what << ": the CPU accepts it";
    }
  }
}

TEST(GpuDenseLogic, HeaderMatchesCpuWriter) {
  for (const auto& s : all_specs()) {
    const auto cpu = make_dense_codec(s);
    const auto x = random_input(77, 1);
    std::vector<uint8_t> want(cpu->encoded_bytes(77));
    cpu->encode(x.data(), 77, want.data(), kRng, 0);
    uint8_t header[24];
    write_dense_header(layout_of(s, 77), header);
    EXPECT_EQ(std::memcmp(header, want.data(), 24), 0) << name_of(s);
  }
}

}  // namespace
}  // namespace gradcomm::detail
