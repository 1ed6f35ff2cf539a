// The bulk conversions (base/half_bulk.h): the F16C (fp16) and AVX2 (bf16) paths, where
// this CPU has them, against half.h's scalar definitions, bit for bit.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "half.h"
#include "half_bulk.h"

namespace gradcomm::detail {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Every half pattern (normals, subnormals, +-0, +-inf, quiet and signalling NaNs),
// widened and widened-and-added, in lengths that leave every vector tail.
TEST(HalfBulk, WideningEveryHalfMatchesHalfToFloat) {
  std::printf("half_bulk path on this CPU: %s\n", half_bulk_path());
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> out(all.size()), ref(all.size());
  halves_to_floats(all.data(), out.data(), all.size(), false);
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(bits_of(out[h]), bits_of(half_to_float(static_cast<uint16_t>(h)))) << "half 0x" << std::hex << h;
  }
  // out += widen(h): start from values that make every kind of sum (finite, inf, NaN).
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> any;
  for (size_t i = 0; i < out.size(); ++i) out[i] = ref[i] = bits_float(i % 5 == 0 ? any(gen) : bits_of(1.5f) + (any(gen) & 0xFFFF));
  halves_to_floats(all.data(), out.data(), all.size(), true);
  halves_to_floats_scalar(all.data(), ref.data(), all.size(), true);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(bits_of(out[i]), bits_of(ref[i])) << "element " << i;
  for (size_t n = 0; n <= 19; ++n) {  // short runs: the scalar tail and the first vector
    std::vector<float> a(n + 1, -7.0f);
    halves_to_floats(all.data() + 0x3C00, a.data(), n, false);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(a[i], half_to_float(static_cast<uint16_t>(0x3C00 + i)));
    ASSERT_EQ(a[n], -7.0f) << "wrote past " << n;
  }
}

// Narrowing: every float exponent with mantissas at and around the rounding
// boundaries (ties to even, the subnormal range, overflow to inf, NaN payloads),
// plus random bit patterns, against float_to_half.
TEST(HalfBulk, NarrowingMatchesFloatToHalf) {
  std::vector<float> in;
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t exp = 0; exp < 256; ++exp) {
      for (uint32_t mant : {0u, 1u, 0xFFFu, 0x1000u, 0x1001u, 0x2000u, 0x2FFFu, 0x3000u, 0x3001u, 0x7FF000u, 0x7FE000u,
                            0x7FEFFFu, 0x7FFFFFu, 0x400000u, 0x400001u, 0x200000u, 0x3FFFFFu}) {
        in.push_back(bits_float(sign | exp << 23 | mant));
      }
    }
  }
  std::mt19937 gen(11);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 1 << 20; ++i) in.push_back(bits_float(any(gen)));
  std::vector<uint16_t> out(in.size() + 1, 0xABCD);
  floats_to_halves(in.data(), out.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], float_to_half(in[i])) << "float bits 0x" << std::hex << bits_of(in[i]);
  }
  ASSERT_EQ(out[in.size()], 0xABCD) << "wrote past the end";
  for (size_t n = 0; n <= 19; ++n) {
    std::vector<uint16_t> o(n + 1, 0xABCD);
    floats_to_halves(in.data(), o.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(o[i], float_to_half(in[i]));
    ASSERT_EQ(o[n], 0xABCD) << "wrote past " << n;
  }
}

// bf16 (compression_16bit.cc's pieces): every bf16 pattern widens to bf16_to_float's bits;
// narrowing at and around the rounding boundary of every exponent (ties to even, the
// carry into the exponent, overflow to inf, NaN payloads that the low bits alone hold),
// plus random patterns, gives float_to_bf16's bits; short runs leave every tail.
TEST(HalfBulk, Bf16WideningAndNarrowingMatchHalfH) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> wide(all.size());
  bf16s_to_floats(all.data(), wide.data(), all.size());
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(bits_of(wide[h]), bits_of(bf16_to_float(static_cast<uint16_t>(h)))) << "bf16 0x" << std::hex << h;
  }
  std::vector<float> in;
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t exp = 0; exp < 256; ++exp) {
      for (uint32_t mant : {0u, 1u, 0x7FFFu, 0x8000u, 0x8001u, 0x17FFFu, 0x18000u, 0x18001u, 0x7F8000u, 0x7FFFFFu,
                            0x7F7FFFu, 0x400000u, 0x400001u, 0x10000u, 0xFFFFu}) {
        in.push_back(bits_float(sign | exp << 23 | mant));
      }
    }
  }
  std::mt19937 gen(13);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 1 << 20; ++i) in.push_back(bits_float(any(gen)));
  std::vector<uint16_t> out(in.size() + 1, 0xABCD);
  floats_to_bf16s(in.data(), out.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], float_to_bf16(in[i])) << "float bits 0x" << std::hex << bits_of(in[i]);
  }
  ASSERT_EQ(out[in.size()], 0xABCD) << "wrote past the end";
  for (size_t n = 0; n <= 19; ++n) {
    std::vector<uint16_t> o(n + 1, 0xABCD);
    std::vector<float> w(n + 1, -7.0f);
    floats_to_bf16s(in.data(), o.data(), n);
    bf16s_to_floats(all.data() + 0x3F80, w.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(o[i], float_to_bf16(in[i]));
      ASSERT_EQ(bits_of(w[i]), bits_of(bf16_to_float(static_cast<uint16_t>(0x3F80 + i))));
    }
    ASSERT_EQ(o[n], 0xABCD) << "wrote past " << n;
    ASSERT_EQ(w[n], -7.0f) << "wrote past " << n;
  }
}

}  // namespace
}  // namespace gradcomm::detail
