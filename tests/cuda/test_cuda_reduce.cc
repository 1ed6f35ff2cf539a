// cuda/reduce.cu against the host reference: the same per-element functor
// (cuda/reduce_op.cuh) run on the CPU. Results must match bit for bit, and no byte
// outside [0, n) of dst (nor any byte of src) may change.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/buffer.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/reduce.cuh"
#include "cuda/reduce_op.cuh"
#include "gradcomm/errors.h"
#include "half.h"

#include "cuda_test_util.h"

namespace gradcomm::detail {
namespace {

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                                DType::kInt32,   DType::kInt64,   DType::kUInt8};
constexpr int64_t kSizes[] = {0, 1, 3, 1000003, (int64_t{1} << 22) + 3};

struct OpCase {
  ReduceOp op;
  int64_t divisor;
  const char* name;
};
constexpr OpCase kOpCases[] = {{ReduceOp::kSum, 1, "sum"},
                               {ReduceOp::kAvg, 1, "avg-intermediate"},
                               {ReduceOp::kAvg, 3, "avg-final/3"},
                               {ReduceOp::kMin, 1, "min"},
                               {ReduceOp::kMax, 1, "max"}};

// (dst offset, src offset) in elements from a 256-byte aligned base: equal offsets
// take the vector kernel (with a peeled head when non-zero), different ones the
// scalar kernel for every element size below 16.
struct Offsets {
  int64_t dst, src;
};
constexpr Offsets kOffsets[] = {{0, 0}, {1, 1}, {1, 0}, {3, 5}};
constexpr int64_t kMaxOffset = 5;
constexpr size_t kGuardBytes = 64;

// ---- inputs -------------------------------------------------------------------------
// Mostly ordinary values, with specials mixed in: NaNs with payloads and signs,
// infinities, signed zeros, subnormals, values that overflow when added, and equal
// pairs (min/max ties). Integers are raw random bits, so sums wrap.
template <class T>
T random_value(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> ordinary(-100.0, 100.0);
  const uint64_t bits = rng();
  const bool special = bits % 20 == 0;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (!special) return static_cast<T>(ordinary(rng));
    const T specials[] = {std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::quiet_NaN(),
                          std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(),
                          T(0), -T(0), std::numeric_limits<T>::denorm_min(), std::numeric_limits<T>::max(),
                          -std::numeric_limits<T>::max(), std::numeric_limits<T>::min()};
    T v = specials[(bits >> 8) % std::size(specials)];
    if ((bits >> 16) % 4 == 0) {  // a NaN with a payload, or a random bit pattern
      if constexpr (std::is_same_v<T, float>) {
        const uint32_t u = 0x7F800001u | static_cast<uint32_t>(bits >> 32);
        std::memcpy(&v, &u, sizeof v);
      } else {
        const uint64_t u = bits | 0x7FF0000000000001ull;
        std::memcpy(&v, &u, sizeof v);
      }
    }
    return v;
  } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    if (special) return T{static_cast<uint16_t>(bits >> 32)};  // any pattern: NaN, inf, subnormal, ...
    const float f = static_cast<float>(ordinary(rng));
    return T{std::is_same_v<T, Half> ? float_to_half(f) : float_to_bf16(f)};
  } else {
    return static_cast<T>(bits);
  }
}

template <class T>
std::vector<T> random_values(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = random_value<T>(rng);
  return v;
}

// A byte pattern that depends on the position, so a shifted write is caught too.
std::vector<uint8_t> guard_image(size_t bytes) {
  std::vector<uint8_t> image(bytes);
  for (size_t i = 0; i < bytes; ++i) image[i] = static_cast<uint8_t>(i * 131 + 7);
  return image;
}

std::string hex(const void* p, size_t bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = bytes; i-- > 0;) {  // little-endian: print most significant first
    s += kDigits[b[i] >> 4];
    s += kDigits[b[i] & 15];
  }
  return s;
}

// First differing element, as text; empty when equal.
std::string first_difference(const void* got, const void* want, int64_t n, size_t elem) {
  const auto* g = static_cast<const uint8_t*>(got);
  const auto* w = static_cast<const uint8_t*>(want);
  if (std::memcmp(g, w, static_cast<size_t>(n) * elem) == 0) return {};
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(g + i * elem, w + i * elem, elem) != 0) {
      return "element " + std::to_string(i) + ": got 0x" + hex(g + i * elem, elem) + ", want 0x" +
             hex(w + i * elem, elem);
    }
  }
  return {};
}

std::string first_guard_change(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, size_t begin,
                               size_t end) {
  for (size_t i = 0; i < got.size(); ++i) {
    if ((i < begin || i >= end) && got[i] != want[i]) {
      return "byte " + std::to_string(i) + " outside [" + std::to_string(begin) + ", " + std::to_string(end) +
             ") changed";
    }
  }
  return {};
}

// ---- the matrix -------------------------------------------------------------------------
// Device buffers sized for the largest offset; each case uploads a fresh image
// (guard pattern with the inputs at the case's offset), runs one launch, downloads
// everything and compares.
template <class T>
void check_dtype(DType dtype, bool divide_only) {
  constexpr size_t kElem = sizeof(T);
  for (int64_t n : kSizes) {
    const std::vector<T> a = random_values<T>(n, 1000 + static_cast<uint64_t>(n));
    std::vector<T> b = random_values<T>(n, 2000 + static_cast<uint64_t>(n));
    for (int64_t i = 0; i < n; i += 50) b[static_cast<size_t>(i)] = a[static_cast<size_t>(i)];  // ties
    const size_t bytes = kGuardBytes + static_cast<size_t>(n + kMaxOffset) * kElem + kGuardBytes;
    DeviceBuffer dst_dev(bytes), src_dev(bytes);
    const std::vector<uint8_t> guard = guard_image(bytes);

    for (const OpCase& op_case : kOpCases) {
      if (divide_only && op_case.op != ReduceOp::kSum) continue;  // divide: one pass per size/offset
      for (const Offsets& off : kOffsets) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + (divide_only ? "divide/3" : op_case.name) +
                     " n=" + std::to_string(n) + " dst_off=" + std::to_string(off.dst) +
                     " src_off=" + std::to_string(off.src));
        const size_t dst_begin = kGuardBytes + static_cast<size_t>(off.dst) * kElem;
        const size_t src_begin = kGuardBytes + static_cast<size_t>(off.src) * kElem;
        std::vector<uint8_t> dst_image = guard, src_image = guard;
        std::memcpy(dst_image.data() + dst_begin, a.data(), static_cast<size_t>(n) * kElem);
        std::memcpy(src_image.data() + src_begin, b.data(), static_cast<size_t>(n) * kElem);
        GRADCOMM_CUDA_CHECK(cudaMemcpy(dst_dev.data(), dst_image.data(), bytes, cudaMemcpyHostToDevice));
        GRADCOMM_CUDA_CHECK(cudaMemcpy(src_dev.data(), src_image.data(), bytes, cudaMemcpyHostToDevice));

        std::vector<T> want = a;
        void* dst = dst_dev.as<uint8_t>() + dst_begin;
        const void* src = src_dev.as<uint8_t>() + src_begin;
        if (divide_only) {
          reduce_elements_host<T, ElementOp::kKeep>(want.data(), want.data(), n, 3);
          launch_divide_inplace(dst, n, dtype, 3, nullptr);
        } else {
          visit_element_op(element_op_for(op_case.op), [&](auto op) {
            reduce_elements_host<T, decltype(op)::value>(want.data(), b.data(), n, op_case.divisor);
          });
          launch_reduce_inplace(dst, src, n, dtype, op_case.op, op_case.divisor, nullptr);
        }
        GRADCOMM_CUDA_CHECK(cudaDeviceSynchronize());

        std::vector<uint8_t> dst_after(bytes), src_after(bytes);
        GRADCOMM_CUDA_CHECK(cudaMemcpy(dst_after.data(), dst_dev.data(), bytes, cudaMemcpyDeviceToHost));
        GRADCOMM_CUDA_CHECK(cudaMemcpy(src_after.data(), src_dev.data(), bytes, cudaMemcpyDeviceToHost));
        const std::string diff = first_difference(dst_after.data() + dst_begin, want.data(), n, kElem);
        ASSERT_TRUE(diff.empty()) << diff;
        const std::string guard_change =
            first_guard_change(dst_after, dst_image, dst_begin, dst_begin + static_cast<size_t>(n) * kElem);
        ASSERT_TRUE(guard_change.empty()) << "dst " << guard_change;
        ASSERT_TRUE(src_after == src_image) << "src was modified";
      }
    }
  }
}

void check_all_dtypes(bool divide_only) {
  for (DType dtype : kAllDTypes) {
    visit_dtype(dtype, [&](auto type) { check_dtype<typename decltype(type)::type>(dtype, divide_only); });
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(CudaReduce, MatchesHostFunctorBitwiseForEveryDtypeOpSizeAndOffset) {
  SKIP_WITHOUT_CUDA_DEVICE();
  check_all_dtypes(/*divide_only=*/false);
}

TEST(CudaReduce, DivideInplaceMatchesHostFunctorBitwise) {
  SKIP_WITHOUT_CUDA_DEVICE();
  check_all_dtypes(/*divide_only=*/true);
}

// Both kernels index with 64 bits: an element count past 2^31 (uint8, ~2 GiB a
// buffer) must reach the last element on the vector and on the scalar path.
TEST(CudaReduce, ReachesElementsPast2To31) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t n = (int64_t{1} << 31) + 19;
  size_t free_bytes = 0, total_bytes = 0;
  GRADCOMM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes < 2 * static_cast<size_t>(n) + (size_t{1} << 30)) GTEST_SKIP() << "needs ~5 GiB of device memory";
  const size_t bytes = static_cast<size_t>(n) + 64;
  DeviceBuffer dst(bytes), src(bytes);
  std::vector<uint8_t> host(bytes);
  for (int64_t dst_off : {0, 1}) {  // 0: vector path (same phase); 1: scalar path
    SCOPED_TRACE("dst_off=" + std::to_string(dst_off));
    GRADCOMM_CUDA_CHECK(cudaMemset(dst.data(), 1, bytes));
    GRADCOMM_CUDA_CHECK(cudaMemset(src.data(), 2, bytes));
    launch_reduce_inplace(dst.as<uint8_t>() + dst_off, src.data(), n, DType::kUInt8, ReduceOp::kSum, 1, nullptr);
    GRADCOMM_CUDA_CHECK(cudaDeviceSynchronize());
    GRADCOMM_CUDA_CHECK(cudaMemcpy(host.data(), dst.data(), bytes, cudaMemcpyDeviceToHost));
    int64_t first_bad = -1;  // a plain loop: 2^31 gtest assertions would take a while
    for (int64_t i = 0; i < static_cast<int64_t>(bytes) && first_bad < 0; ++i) {
      const uint8_t want = (i >= dst_off && i < dst_off + n) ? 3 : 1;
      if (host[static_cast<size_t>(i)] != want) first_bad = i;
    }
    ASSERT_EQ(first_bad, -1) << "byte " << first_bad << " is " << int{host[static_cast<size_t>(first_bad)]};
  }
}

// Stream-ordered: the launch goes on the caller's stream and returns without
// waiting; copies before and after on the same stream see it in order.
TEST(CudaReduce, RunsInOrderOnTheCallersStream) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t n = 1 << 20;
  Stream stream;
  PinnedBuffer host_a(n * sizeof(float)), host_b(n * sizeof(float));
  for (int64_t i = 0; i < n; ++i) {
    host_a.as<float>()[i] = static_cast<float>(i);
    host_b.as<float>()[i] = 0.5f;
  }
  DeviceBuffer dev_a(n * sizeof(float)), dev_b(n * sizeof(float));
  GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(dev_a.data(), host_a.data(), dev_a.size(), cudaMemcpyHostToDevice, stream.get()));
  GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(dev_b.data(), host_b.data(), dev_b.size(), cudaMemcpyHostToDevice, stream.get()));
  launch_reduce_inplace(dev_a.data(), dev_b.data(), n, DType::kFloat32, ReduceOp::kAvg, 2, stream.get());
  GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(host_a.data(), dev_a.data(), dev_a.size(), cudaMemcpyDeviceToHost, stream.get()));
  stream.synchronize();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(host_a.as<float>()[i], (static_cast<float>(i) + 0.5f) / 2.0f) << "element " << i;
  }
}

// ---- host functor: the contract's corner cases, pinned without a GPU ----------------------
TEST(ReduceElementFunctor, NanPropagatesThroughMinAndMaxAsCanonicalNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const ReduceElement<float, ElementOp::kMin> min_op{1};
  const ReduceElement<float, ElementOp::kMax> max_op{1};
  uint32_t bits = 0;
  for (float r : {min_op(nan, 1.0f), min_op(1.0f, nan), max_op(nan, 1.0f), max_op(1.0f, -nan)}) {
    std::memcpy(&bits, &r, sizeof bits);
    EXPECT_EQ(bits, 0x7FC00000u);
  }
  EXPECT_EQ(min_op(2.0f, 1.0f), 1.0f);
  EXPECT_EQ(max_op(2.0f, 1.0f), 2.0f);
  // Ties keep dst: min(+0, -0) is +0 and min(-0, +0) is -0.
  EXPECT_FALSE(std::signbit(min_op(0.0f, -0.0f)));
  EXPECT_TRUE(std::signbit(min_op(-0.0f, 0.0f)));
  const ReduceElement<Half, ElementOp::kMax> half_max{1};
  EXPECT_EQ(half_max(Half{0x7C01}, Half{0x3C00}).bits, 0x7E00);  // signaling NaN in, canonical NaN out
  const ReduceElement<BFloat16, ElementOp::kAdd> bf16_add{1};
  EXPECT_EQ(bf16_add(BFloat16{0xFFC1}, BFloat16{0x3F80}).bits, 0x7FC0);
}

TEST(ReduceElementFunctor, IntegersWrapAndAverageTruncatesTowardZero) {
  const ReduceElement<int32_t, ElementOp::kAdd> add32{1};
  EXPECT_EQ(add32(std::numeric_limits<int32_t>::max(), 1), std::numeric_limits<int32_t>::min());
  const ReduceElement<uint8_t, ElementOp::kAdd> add8{1};
  EXPECT_EQ(add8(200, 100), 44);
  const ReduceElement<int64_t, ElementOp::kAdd> avg64{3};
  EXPECT_EQ(avg64(-4, -3), -2);  // -7 / 3 truncates toward zero
  const ReduceElement<int32_t, ElementOp::kAdd> avg32_huge{int64_t{1} << 40};
  EXPECT_EQ(avg32_huge(-5, 0), 0);  // divisor past int32's range still divides
  const ReduceElement<uint8_t, ElementOp::kKeep> div8{4};
  EXPECT_EQ(div8(255, 0), 63);
}

TEST(ReduceElementFunctor, HalfTypesRoundOnceAfterFp32DivideAndOverflowToInf) {
  // ((1 + 2^-10) + 1) / 2 = 1 + 2^-11 is exact in fp32 and a tie in fp16: one
  // rounding (to even) gives 1.0.
  const ReduceElement<Half, ElementOp::kAdd> avg2{2};
  const float a = half_to_float(0x3C01);  // 1 + 2^-10
  const float b = 1.0f;
  EXPECT_EQ(avg2(Half{0x3C01}, Half{0x3C00}).bits, float_to_half((a + b) / 2.0f));
  EXPECT_EQ(avg2(Half{0x3C01}, Half{0x3C00}).bits, 0x3C00);
  const ReduceElement<Half, ElementOp::kAdd> sum{1};
  EXPECT_EQ(sum(Half{0x7BFF}, Half{0x7BFF}).bits, 0x7C00);  // 65504 + 65504 = +inf
}

// ---- launcher argument checks: run without a GPU (rejected before any CUDA call) ----------
TEST(CudaReduceLauncher, RejectsBadArgumentsBeforeTouchingTheDevice) {
  float dummy[4] = {};
  EXPECT_THROW(launch_reduce_inplace(dummy, dummy, -1, DType::kFloat32, ReduceOp::kSum, 1, nullptr), InvalidArgument);
  EXPECT_THROW(launch_reduce_inplace(dummy, dummy, 4, DType::kFloat32, ReduceOp::kAvg, 0, nullptr), InvalidArgument);
  EXPECT_THROW(launch_reduce_inplace(nullptr, dummy, 4, DType::kFloat32, ReduceOp::kSum, 1, nullptr), InvalidArgument);
  EXPECT_THROW(launch_reduce_inplace(dummy, nullptr, 4, DType::kFloat32, ReduceOp::kSum, 1, nullptr), InvalidArgument);
  EXPECT_THROW(launch_reduce_inplace(reinterpret_cast<char*>(dummy) + 1, dummy, 2, DType::kFloat32, ReduceOp::kSum, 1,
                                     nullptr),
               InvalidArgument);
  EXPECT_THROW(launch_reduce_inplace(dummy, dummy, 4, static_cast<DType>(99), ReduceOp::kSum, 1, nullptr),
               InvalidArgument);
  EXPECT_THROW(launch_reduce_inplace(dummy, dummy, 4, DType::kFloat32, static_cast<ReduceOp>(99), 1, nullptr),
               InvalidArgument);
  EXPECT_THROW(launch_reduce_inplace(dummy + 1, dummy, 3, DType::kFloat32, ReduceOp::kSum, 1, nullptr),
               InvalidArgument);  // partial overlap
  EXPECT_THROW(launch_divide_inplace(dummy, 4, DType::kFloat32, 0, nullptr), InvalidArgument);
  EXPECT_THROW(launch_divide_inplace(nullptr, 4, DType::kFloat32, 2, nullptr), InvalidArgument);
  try {
    launch_reduce_inplace(dummy, dummy, -7, DType::kFloat32, ReduceOp::kSum, 1, nullptr);
    ADD_FAILURE() << "n=-7 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("n=-7"), std::string::npos) << e.what();
  }
}

TEST(CudaReduceLauncher, EmptyInputsAndUnitDivisorAreNoOpsWithoutCudaCalls) {
  EXPECT_NO_THROW(launch_reduce_inplace(nullptr, nullptr, 0, DType::kFloat16, ReduceOp::kMax, 1, nullptr));
  EXPECT_NO_THROW(launch_divide_inplace(nullptr, 0, DType::kInt64, 5, nullptr));
  float dummy[2] = {};  // host memory: would fault if anything were launched on it
  EXPECT_NO_THROW(launch_divide_inplace(dummy, 2, DType::kFloat32, 1, nullptr));
}

}  // namespace
}  // namespace gradcomm::detail
