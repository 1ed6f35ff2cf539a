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

}  // namespace
}  // namespace gradcomm::detail
