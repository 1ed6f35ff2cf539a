// The CUDA dense codecs (GpuDenseCodec) against the CPU reference codecs: payload
// bytes equal, decode and decode-add equal bitwise, fused error feedback equal to the
// CPU's acc - decode(encode(acc)), NaN/Inf buckets poisoned the same way, and every
// kind of corrupted payload reported in the DeviceStatus with the output untouched.
// Skips on machines without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compressors/codec.h"
#include "compressors/family.h"
#include "compressors/dense/gpu_dense_codec.h"
#include "compressors/dense/gpu_dense_launch.h"
#include "compressors/dense/gpu_dense_logic.h"
#include "compressors/dense_codec_spec.h"
#include "compressors/quantize/quantize.h"
#include "compressors/spec.h"
#include "cuda/buffer.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/device_status.h"
#include "gradcomm/errors.h"

#include "cuda_test_util.h"

namespace gradcomm::detail {
namespace {


std::string name_of(const CompressorSpec& s) {
  std::string n = compressor_name(s.id);
  if (s.id == CompressorId::kQuant) n += std::to_string(dense_codec_fields(s).bits) + (dense_codec_fields(s).round == Rounding::kNearest ? "n" : "s");
  if (s.id == CompressorId::kQsgd) n += std::to_string(dense_codec_fields(s).levels);
  if (dense_codec_fields(s).bucket != 0) n += "/B" + std::to_string(dense_codec_fields(s).bucket);
  return n;
}

// Buckets: the default 512, and 100 (not a multiple of the 8-element group).
std::vector<CompressorSpec> all_specs() {
  std::vector<CompressorSpec> v = {dense_codec_spec(CompressorId::kFp16), dense_codec_spec(CompressorId::kBf16)};
  for (int64_t bucket : {512, 100}) {
    for (int bits : {1, 2, 4, 8}) {
      for (Rounding r : {Rounding::kStochastic, Rounding::kNearest}) v.push_back(dense_codec_spec(CompressorId::kQuant, bits, r, 0, bucket));
    }
    for (int levels : {1, 4, 127}) v.push_back(dense_codec_spec(CompressorId::kQsgd, 0, Rounding::kStochastic, levels, bucket));
    v.push_back(dense_codec_spec(CompressorId::kSign, 0, Rounding::kStochastic, 0, bucket));
  }
  v.push_back(dense_codec_spec(CompressorId::kSign, 0, Rounding::kStochastic, 0, 7));     // buckets shorter than a group
  v.push_back(dense_codec_spec(CompressorId::kQsgd, 0, Rounding::kStochastic, 1000, 7));  // 11-bit codes across words
  return v;
}

std::vector<int64_t> sizes_for(const CompressorSpec& s) {
  const int64_t b = dense_codec_fields(s).bucket == 0 ? 64 : dense_codec_fields(s).bucket;
  return {0, 1, 7, std::max<int64_t>(1, b / 2), b - 1, b, b + 1, 1000003, (int64_t{1} << 22) + 5};
}

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

::testing::AssertionResult same_floats(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (!same_float(got[i], want[i])) {
      return ::testing::AssertionFailure() << "element " << i << " is " << got[i] << ", expected " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return ::testing::AssertionFailure() << "byte " << i << " is " << int(got[i]) << ", expected " << int(want[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

// Device copies; an extra offset lets a test place data at an unaligned address.
struct Dev {
  DeviceBuffer buf;
  size_t offset = 0;
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(buf.as<uint8_t>() + offset);
  }
};
template <class T>
Dev to_device(const std::vector<T>& v, size_t offset = 0) {
  Dev d{DeviceBuffer(v.size() * sizeof(T) + offset + 16), offset};
  gradcomm::testing::copy_to_device(d.as<T>(), v.data(), v.size() * sizeof(T));
  return d;
}
template <class T>
std::vector<T> to_host(const Dev& d, size_t count) {
  std::vector<T> v(count);
  gradcomm::testing::copy_to_host(v.data(), d.as<T>(), count * sizeof(T));
  return v;
}

const PhiloxStream kRng{0x1234'5678'9ABCull, 0xFEDC'BA98'7654'3210ull};

class GpuDenseCodecs : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_F(GpuDenseCodecs, PayloadsAndDecodesMatchCpu) {
  Stream stream;
  StatusBuffer status;
  for (const auto& s : all_specs()) {
    const auto cpu = make_dense_codec(s);
    const GpuDenseCodec gpu(s);
    for (int64_t n : sizes_for(s)) {
      const int64_t first = 3 * cpu->alignment();
      const std::string what = name_of(s) + " n=" + std::to_string(n);
      SCOPED_TRACE(what);
      const auto x = random_input(n, static_cast<uint64_t>(n) + 17);
      const size_t bytes = cpu->encoded_bytes(n);
      ASSERT_EQ(gpu.encoded_bytes(n), bytes);
      std::vector<uint8_t> want(bytes);
      cpu->encode(x.data(), n, want.data(), kRng, first);

      const Dev in = to_device(x);
      const Dev payload = to_device(std::vector<uint8_t>(bytes, 0xAB));
      gpu.encode(in.as<float>(), n, payload.as<uint8_t>(), kRng, first, nullptr, stream.get());
      stream.synchronize();
      ASSERT_TRUE(same_bytes(to_host<uint8_t>(payload, bytes), want)) << "payload";

      std::vector<float> ref(x.size());
      cpu->decode(want, n, ref.data());
      const Dev out = to_device(std::vector<float>(x.size(), 123.0f));
      status.reset(stream.get());
      gpu.decode(payload.as<uint8_t>(), bytes, n, out.as<float>(), false, status.device(), stream.get());
      status.check(stream.get(), what);
      ASSERT_TRUE(same_floats(to_host<float>(out, x.size()), ref)) << "decode";

      auto y = random_input(n, 5);
      cpu->decode_add(want, n, y.data());
      const Dev acc = to_device(random_input(n, 5));
      gpu.decode(payload.as<uint8_t>(), bytes, n, acc.as<float>(), true, status.device(), stream.get());
      status.check(stream.get(), what);
      ASSERT_TRUE(same_floats(to_host<float>(acc, x.size()), y)) << "decode add";
    }
  }
}

TEST_F(GpuDenseCodecs, UnalignedPointersGiveTheSameBytes) {
  Stream stream;
  StatusBuffer status;
  for (const auto& s : all_specs()) {
    const auto cpu = make_dense_codec(s);
    const GpuDenseCodec gpu(s);
    const int64_t n = 4 * std::max<int64_t>(dense_codec_fields(s).bucket, 8) + 3;
    SCOPED_TRACE(name_of(s));
    const auto x = random_input(n, 8);
    std::vector<uint8_t> want(cpu->encoded_bytes(n));
    cpu->encode(x.data(), n, want.data(), kRng, 0);
    // floats at 4 (not 16) bytes past an allocation; payload at odd addresses.
    for (size_t payload_offset : {1, 2, 4, 8}) {
      const Dev in = to_device(x, 4);
      const Dev payload = to_device(std::vector<uint8_t>(want.size(), 0), payload_offset);
      gpu.encode(in.as<float>(), n, payload.as<uint8_t>(), kRng, 0, nullptr, stream.get());
      stream.synchronize();
      ASSERT_TRUE(same_bytes(to_host<uint8_t>(payload, want.size()), want)) << "payload offset " << payload_offset;
      std::vector<float> ref(x.size());
      cpu->decode(want, n, ref.data());
      const Dev out = to_device(std::vector<float>(x.size(), 0.0f), 4);
      status.reset(stream.get());
      gpu.decode(payload.as<uint8_t>(), want.size(), n, out.as<float>(), false, status.device(), stream.get());
      status.check(stream.get(), "unaligned decode");
      ASSERT_TRUE(same_floats(to_host<float>(out, x.size()), ref)) << "payload offset " << payload_offset;
    }
  }
}

TEST_F(GpuDenseCodecs, FusedErrorFeedbackMatchesCpu) {
  Stream stream;
  for (const auto& s : all_specs()) {
    const auto cpu = make_dense_codec(s);
    const GpuDenseCodec gpu(s);
    for (int64_t n : {int64_t{1}, 3 * std::max<int64_t>(dense_codec_fields(s).bucket, 8) + 5, int64_t{1000003}}) {
      SCOPED_TRACE(name_of(s) + " n=" + std::to_string(n));
      const int64_t first = cpu->alignment();
      const auto x = random_input(n, 21);
      auto r = random_input(n, 22);
      for (auto& v : r) v *= 0.01f;
      const size_t bytes = cpu->encoded_bytes(n);
      std::vector<uint8_t> want(bytes);
      std::vector<float> dec(x.size()), acc(x.size()), want_r(x.size());
      const Dev in = to_device(x);
      const Dev payload = to_device(std::vector<uint8_t>(bytes, 0));

      // kFold: acc = x + r, payload = encode(acc), r' = acc - decode(payload).
      for (int64_t i = 0; i < n; ++i) acc[i] = x[i] + r[i];
      cpu->encode(acc.data(), n, want.data(), kRng, first);
      cpu->decode(want, n, dec.data());
      for (int64_t i = 0; i < n; ++i) want_r[i] = acc[i] - dec[i];
      Dev res = to_device(r);
      gpu.encode(in.as<float>(), n, payload.as<uint8_t>(), kRng, first, res.as<float>(), stream.get());
      stream.synchronize();
      ASSERT_TRUE(same_bytes(to_host<uint8_t>(payload, bytes), want)) << "fold payload";
      ASSERT_TRUE(same_floats(to_host<float>(res, x.size()), want_r)) << "fold residual";

      // kAccumulate with the decoded values: payload = encode(x), r' = r + (x - dec).
      cpu->encode(x.data(), n, want.data(), kRng, first);
      cpu->decode(want, n, dec.data());
      for (int64_t i = 0; i < n; ++i) want_r[i] = r[i] + (x[i] - dec[i]);
      res = to_device(r);
      const Dev decoded = to_device(std::vector<float>(x.size(), 7.0f));
      gpu.encode(in.as<float>(), n, payload.as<uint8_t>(), kRng, first,
                 EncodeFeedback{res.as<float>(), ResidualMode::kAccumulate, decoded.as<float>()}, stream.get());
      stream.synchronize();
      ASSERT_TRUE(same_bytes(to_host<uint8_t>(payload, bytes), want)) << "accumulate payload";
      ASSERT_TRUE(same_floats(to_host<float>(res, x.size()), want_r)) << "accumulate residual";
      ASSERT_TRUE(same_floats(to_host<float>(decoded, x.size()), dec)) << "decoded";

      // decoded == in (the ring owner keeps what everyone decodes).
      const Dev inout = to_device(x);
      gpu.encode(inout.as<float>(), n, payload.as<uint8_t>(), kRng, first, EncodeFeedback{nullptr, ResidualMode::kFold, inout.as<float>()},
                 stream.get());
      stream.synchronize();
      ASSERT_TRUE(same_floats(to_host<float>(inout, x.size()), dec)) << "in-place decoded";
    }
  }
}

TEST_F(GpuDenseCodecs, NonFiniteBucketsArePoisonedAsOnCpu) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  Stream stream;
  StatusBuffer status;
  for (const auto& s : all_specs()) {
    const auto cpu = make_dense_codec(s);
    const GpuDenseCodec gpu(s);
    const int64_t b = std::max<int64_t>(dense_codec_fields(s).bucket, 8), n = 5 * b;
    SCOPED_TRACE(name_of(s));
    auto x = random_input(n, 11);
    x[1] = nan;
    x[2 * b + b / 2] = -inf;
    x[3 * b] = 3e38f;
    x[3 * b + b - 1] = -3e38f;
    x[4 * b + 1] = -nan;
    std::vector<uint8_t> want(cpu->encoded_bytes(n));
    cpu->encode(x.data(), n, want.data(), kRng, 0);
    const Dev in = to_device(x);
    const Dev payload = to_device(std::vector<uint8_t>(want.size(), 0));
    gpu.encode(in.as<float>(), n, payload.as<uint8_t>(), kRng, 0, nullptr, stream.get());
    stream.synchronize();
    ASSERT_TRUE(same_bytes(to_host<uint8_t>(payload, want.size()), want));
    std::vector<float> ref(x.size());
    cpu->decode(want, n, ref.data());
    const Dev out = to_device(std::vector<float>(x.size(), 0.0f));
    status.reset(stream.get());
    gpu.decode(payload.as<uint8_t>(), want.size(), n, out.as<float>(), false, status.device(), stream.get());
    status.check(stream.get(), "poisoned decode");
    const auto got = to_host<float>(out, x.size());
    ASSERT_TRUE(same_floats(got, ref));
    if (dense_codec_fields(s).bucket != 0) EXPECT_TRUE(std::isnan(got[0]));
  }
}

// Each corruption, the fault it must produce, and whether it applies to a layout.
struct Corruption {
  const char* name;
  PayloadFault fault;
  bool (*apply)(std::vector<uint8_t>&, const DenseLayout&);
};
const Corruption kCorruptions[] = {
    {"truncated", PayloadFault::kBadLength, [](std::vector<uint8_t>& p, const DenseLayout&) { p.pop_back(); return true; }},
    {"trailing byte", PayloadFault::kBadLength, [](std::vector<uint8_t>& p, const DenseLayout&) { p.push_back(0); return true; }},
    {"shorter than header", PayloadFault::kBadLength, [](std::vector<uint8_t>& p, const DenseLayout&) { p.resize(23); return true; }},
    {"magic", PayloadFault::kBadHeader, [](std::vector<uint8_t>& p, const DenseLayout&) { p[0] ^= 1; return true; }},
    {"version", PayloadFault::kBadHeader, [](std::vector<uint8_t>& p, const DenseLayout&) { p[4] = 2; return true; }},
    {"compressor id", PayloadFault::kBadHeader, [](std::vector<uint8_t>& p, const DenseLayout&) { p[5] ^= 0x10; return true; }},
    {"numel", PayloadFault::kBadNumel, [](std::vector<uint8_t>& p, const DenseLayout&) { p[8] ^= 1; return true; }},
    {"flags", PayloadFault::kBadHeader, [](std::vector<uint8_t>& p, const DenseLayout&) { p[6] = 1; return true; }},
    {"param0", PayloadFault::kBadHeader, [](std::vector<uint8_t>& p, const DenseLayout&) { p[16] ^= 1; return true; }},
    {"param1", PayloadFault::kBadHeader, [](std::vector<uint8_t>& p, const DenseLayout&) { p[23] ^= 0x40; return true; }},
    {"padding bit", PayloadFault::kBadPadding,
     [](std::vector<uint8_t>& p, const DenseLayout& l) {
       if (l.n * l.code_bits % 8 == 0) return false;
       p.back() |= 0x80;
       return true;
     }},
    {"negative scale", PayloadFault::kBadScale,
     [](std::vector<uint8_t>& p, const DenseLayout& l) {
       if (l.scale_width != 4) return false;
       store_f32le(p.data() + 24 + 4 * (l.buckets() - 1), -1.0f);
       return true;
     }},
    {"infinite scale", PayloadFault::kBadScale,
     [](std::vector<uint8_t>& p, const DenseLayout& l) {
       if (l.scale_width == 0) return false;
       store_f32le(p.data() + 24, std::numeric_limits<float>::infinity());
       return true;
     }},
    {"min above max", PayloadFault::kBadScale,
     [](std::vector<uint8_t>& p, const DenseLayout& l) {
       if (l.scale_width != 8) return false;
       store_f32le(p.data() + 24 + 8 * (l.buckets() / 2), 2.0f);
       store_f32le(p.data() + 28 + 8 * (l.buckets() / 2), 1.0f);
       return true;
     }},
    {"half-poisoned pair", PayloadFault::kBadScale,
     [](std::vector<uint8_t>& p, const DenseLayout& l) {
       if (l.scale_width != 8) return false;
       store_f32le(p.data() + 24, std::numeric_limits<float>::quiet_NaN());
       return true;
     }},
    {"level above s", PayloadFault::kBadCode,
     [](std::vector<uint8_t>& p, const DenseLayout& l) {
       if (l.id != CompressorId::kQsgd || ((l.param0 + 1) & l.param0) == 0) return false;
       const uint64_t bit0 = (l.n - 1) * l.code_bits;
       for (unsigned j = 0; j + 1 < l.code_bits; ++j) {
         p[l.codes_offset() + (bit0 + j) / 8] |= static_cast<uint8_t>(1u << ((bit0 + j) % 8));
       }
       return true;
     }},
};

TEST_F(GpuDenseCodecs, CorruptPayloadsAreReportedAndWriteNothing) {
  Stream stream;
  StatusBuffer status;
  auto specs = all_specs();
  specs.push_back(dense_codec_spec(CompressorId::kQsgd, 0, Rounding::kStochastic, 5, 64));  // levels can exceed s
  for (const auto& s : specs) {
    const auto cpu = make_dense_codec(s);
    const GpuDenseCodec gpu(s);
    const int64_t n = 2 * std::max<int64_t>(dense_codec_fields(s).bucket, 8) + 3;
    const DenseLayout layout = family_of(s.id).gpu_dense->layout(s, static_cast<uint64_t>(n));
    const auto x = random_input(n, 3);
    std::vector<uint8_t> valid(cpu->encoded_bytes(n));
    cpu->encode(x.data(), n, valid.data(), kRng, 0);
    for (const auto& c : kCorruptions) {
      std::vector<uint8_t> bad = valid;
      if (!c.apply(bad, layout)) continue;
      SCOPED_TRACE(name_of(s) + ": " + c.name);
      std::vector<float> cpu_out(static_cast<size_t>(n));
      EXPECT_THROW(cpu->decode(bad, n, cpu_out.data()), CorruptPayload) << "the CPU accepts it";
      const Dev payload = to_device(bad);
      const std::vector<float> sentinel(static_cast<size_t>(n), 42.0f);
      for (bool add : {false, true}) {
        const Dev out = to_device(sentinel);
        status.reset(stream.get());
        gpu.decode(payload.as<uint8_t>(), bad.size(), n, out.as<float>(), add, status.device(), stream.get());
        const DeviceStatus st = status.read(stream.get());
        EXPECT_EQ(st.fault, static_cast<uint32_t>(c.fault));
        EXPECT_TRUE(same_floats(to_host<float>(out, sentinel.size()), sentinel)) << "output written";
        EXPECT_THROW(status.check(stream.get(), "corrupt"), CorruptPayload);
      }
    }
    // A fault already in the status word: a valid payload writes nothing either.
    const Dev payload = to_device(valid);
    const Dev out = to_device(std::vector<float>(static_cast<size_t>(n), 42.0f));
    status.reset(stream.get());
    gpu.decode(payload.as<uint8_t>(), valid.size() - 1, n, out.as<float>(), false, status.device(), stream.get());
    gpu.decode(payload.as<uint8_t>(), valid.size(), n, out.as<float>(), false, status.device(), stream.get());
    EXPECT_EQ(status.read(stream.get()).fault, static_cast<uint32_t>(PayloadFault::kBadLength));
    EXPECT_TRUE(same_floats(to_host<float>(out, static_cast<size_t>(n)), std::vector<float>(static_cast<size_t>(n), 42.0f)));
  }
}

TEST(GpuDenseCodecArgs, BadArgumentsThrowBeforeAnyLaunch) {
  // Host-side checks need no device: none of these reaches a CUDA call.
  EXPECT_THROW(GpuDenseCodec(dense_codec_spec(CompressorId::kTopk)), InvalidArgument);
  EXPECT_THROW(GpuDenseCodec(dense_codec_spec(CompressorId::kQuant, 3, Rounding::kNearest, 0, 64)), InvalidArgument);
  EXPECT_THROW(GpuDenseCodec(dense_codec_spec(CompressorId::kSign, 0, Rounding::kStochastic, 0, 0)), InvalidArgument);
  const GpuDenseCodec sign(dense_codec_spec(CompressorId::kSign, 0, Rounding::kStochastic, 0, 64));
  EXPECT_EQ(sign.alignment(), 64);
  EXPECT_EQ(sign.encoded_bytes(65), 24u + 8u + 9u);
  alignas(16) float f[4] = {};
  alignas(16) uint8_t p[64] = {};
  EXPECT_THROW(sign.encode(f, 10, p, kRng, 3, nullptr, nullptr), InvalidArgument);  // first not aligned
  EXPECT_THROW(sign.encode(f, -1, p, kRng, 0, nullptr, nullptr), InvalidArgument);
  EXPECT_THROW(sign.encode(nullptr, 10, p, kRng, 0, nullptr, nullptr), InvalidArgument);
  EXPECT_THROW(sign.encode(reinterpret_cast<float*>(p + 1), 2, p + 32, kRng, 0, nullptr, nullptr), InvalidArgument);
  EXPECT_THROW(sign.decode(p, 64, 4, f, false, nullptr, nullptr), InvalidArgument);  // no status
}

}  // namespace
}  // namespace gradcomm::detail
