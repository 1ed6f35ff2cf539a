// fp16/bf16 conversions against independent references: GCC's _Float16 (IEEE
// binary16 with hardware-defined round-to-nearest-even) and a bf16 rounding
// computed in double arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "half.h"

namespace gradcomm::detail {
namespace {

uint16_t reference_half(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

TEST(Half, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    _Float16 ref;
    const uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&ref, &bits, 2);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(static_cast<float>(ref))) << std::hex << h;
      ASSERT_TRUE(std::isnan(half_to_float(float_to_half(f))));
      continue;
    }
    ASSERT_EQ(f, static_cast<float>(ref)) << std::hex << h;
    ASSERT_EQ(float_to_half(f), h) << std::hex << h;
  }
}

TEST(Half, NarrowingMatchesHardwareRounding) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2'000'000; ++i) {
    uint32_t u = bits(rng);
    // Bias towards the half range (exponents near 0) where rounding is subtle.
    if (i % 2) u = (u & 0x807FFFFFu) | ((100u + (u >> 24) % 45u) << 23);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), reference_half(f)) << std::hex << u;
  }
}

uint16_t reference_bf16(float f) {
  // Round to nearest even on the top 16 bits, computed with exact double arithmetic.
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t lower = u & 0xFFFFu;
  uint32_t upper = u >> 16;
  if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u))) upper += 1;
  return static_cast<uint16_t>(upper);
}

TEST(BFloat16, NarrowingRoundsToNearestEven) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2'000'000; ++i) {
    const uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(float_to_bf16(f), reference_bf16(f)) << std::hex << u;
  }
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(3.4e38f))));
}

}  // namespace
}  // namespace gradcomm::detail
