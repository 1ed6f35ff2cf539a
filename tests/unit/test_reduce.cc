// The CPU reduction kernels' averages (base/reduce.h): a power-of-two divisor takes a
// multiply by its exact reciprocal, which must give the bits of x / d everywhere --
// subnormal results, values near the top of the range, signed zeros, infinities and
// NaNs -- as must the division kept for every other divisor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "reduce.h"

namespace gradcomm::detail {
namespace {

template <class T>
std::vector<T> awkward_values() {
  using L = std::numeric_limits<T>;
  std::vector<T> v = {T(0),          -T(0),          T(1),          T(-3),          L::denorm_min(),
                      -L::denorm_min(), L::min(),     -L::min() * T(3), L::max(),       -L::max(),
                      L::infinity(), -L::infinity(), L::quiet_NaN(), -L::quiet_NaN(), L::min() * T(1.5)};
  std::mt19937_64 gen(7);
  std::uniform_int_distribution<uint64_t> bits;
  for (int i = 0; i < 4000; ++i) {  // any bit pattern: every exponent, NaN payloads included
    T x;
    const uint64_t b = bits(gen);
    std::memcpy(&x, &b, sizeof x);
    v.push_back(x);
  }
  return v;
}

template <class T>
void expect_same_bits(const std::vector<T>& got, const std::vector<T>& want, int64_t divisor) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(T)), 0)
        << "element " << i << ": " << got[i] << " vs " << want[i] << " (divisor " << divisor << ")";
  }
}

template <class T>
void check_divisors(DType dtype) {
  const std::vector<T> x = awkward_values<T>();
  const std::vector<T> y(x.rbegin(), x.rend());
  for (int64_t d : {int64_t{2}, int64_t{3}, int64_t{4}, int64_t{7}, int64_t{1024}, int64_t{1} << 40}) {
    SCOPED_TRACE(testing::Message() << "divisor " << d);
    std::vector<T> want(x.size()), got = x;
    for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] / static_cast<T>(d);
    divide_inplace(got.data(), static_cast<int64_t>(got.size()), dtype, d);
    expect_same_bits(got, want, d);
    // The owner's last hop of an average: (a + b) / d.
    for (size_t i = 0; i < x.size(); ++i) want[i] = (x[i] + y[i]) / static_cast<T>(d);
    got = x;
    reduce_inplace(got.data(), y.data(), static_cast<int64_t>(got.size()), dtype, ReduceOp::kAvg, d);
    expect_same_bits(got, want, d);
  }
}

TEST(Reduce, AverageOfFloatsIsTheDivisionBitForBit) { check_divisors<float>(DType::kFloat32); }
TEST(Reduce, AverageOfDoublesIsTheDivisionBitForBit) { check_divisors<double>(DType::kFloat64); }

// reduce_into(dst, a, b) (the node segment's one-pass reduction) stores what a copy of a
// and an in-place reduction with b store, for every op, into a third buffer or into a.
TEST(Reduce, IntoAThirdBufferIsTheCopyAndInPlaceReduction) {
  const std::vector<float> x = awkward_values<float>();
  const std::vector<float> y(x.rbegin(), x.rend());
  const auto n = static_cast<int64_t>(x.size());
  for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
    for (const int64_t d : {int64_t{1}, int64_t{2}, int64_t{3}}) {
      SCOPED_TRACE(testing::Message() << "op " << static_cast<int>(op) << ", divisor " << d);
      std::vector<float> want = x;
      reduce_inplace(want.data(), y.data(), n, DType::kFloat32, op, d);
      std::vector<float> got(x.size(), 7.0f);
      reduce_into(got.data(), x.data(), y.data(), n, DType::kFloat32, op, d);
      expect_same_bits(got, want, d);
      got = x;
      reduce_into(got.data(), got.data(), y.data(), n, DType::kFloat32, op, d);
      expect_same_bits(got, want, d);
    }
  }
  // And the sum is the elementwise sum, bit for bit.
  std::vector<float> want(x.size()), got(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] + y[i];
  reduce_into(got.data(), x.data(), y.data(), n, DType::kFloat32, ReduceOp::kSum);
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << i;
    } else {
      ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace gradcomm::detail
