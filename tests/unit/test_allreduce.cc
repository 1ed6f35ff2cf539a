// The allreduce matrix over the in-process transport (sizes up to 128 KiB take
// recursive doubling, up to 4 MiB halving + doubling when N > 2, larger ones the
// ring; all three are covered):
// N in 1..8 x numel in {0, 1, N-1, 1000003, 2^22+3} x {sum, avg, min, max} x
// {fp32, fp16, bf16, fp64, int32}. Rank r contributes v(r, i) = (3r + i) mod 13 - 6,
// small integers, so every sum is exact in every dtype and the expected result
// is known in closed form. Every rank must end with the same bytes as that
// result, and nothing outside the tensor may change.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <tuple>

#include "common/closed_form.h"
#include "test_util.h"

namespace gradcomm {
namespace {

using testing::GuardedBuffer;

using testing::contribution;

// The expected bytes of allreduce(op) over n ranks, computed independently of the ring.
std::vector<uint8_t> expected_result(DType dtype, ReduceOp op, int n, int64_t numel) {
  return testing::expected_allreduce(dtype, op, n, numel, contribution);
}

// Allreduces v(r, i) on n threads; every rank must hold the closed-form bytes and
// leave the guard bytes around its tensor alone.
void check_allreduce(int n, int64_t numel, DType dtype, ReduceOp op) {
  SCOPED_TRACE(fmt::format("N={} numel={} {} {}", n, numel, dtype_name(dtype), reduce_op_name(op)));
  const size_t bytes = numel * dtype_size(dtype);
  std::vector<GuardedBuffer> buffers;
  for (int r = 0; r < n; ++r) {
    buffers.emplace_back(bytes);
    for (int64_t i = 0; i < numel; ++i) testing::store_value(dtype, buffers[r].data(), i, contribution(r, i));
  }
  testing::run_ranks(n, [&](Communicator& comm) {
    comm.allreduce(TensorView{buffers[comm.rank()].data(), numel, dtype, {}}, op);
  });
  const auto expected = expected_result(dtype, op, n, numel);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(buffers[r].guards_intact()) << "rank " << r << " wrote outside the tensor";
    ASSERT_TRUE(testing::same_bytes(buffers[r].bytes(), expected.data(), bytes)) << "rank " << r;
  }
}

using MatrixParam = std::tuple<int, int, DType>;  // world size, numel case, dtype

int64_t numel_for(int n, int numel_case) {
  switch (numel_case) {
    case 0: return 0;
    case 1: return 1;
    case 2: return n - 1;
    case 3: return 1000003;
    default: return (int64_t{1} << 22) + 3;
  }
}

std::string matrix_name(const ::testing::TestParamInfo<MatrixParam>& info) {
  static const char* kNumel[] = {"Zero", "One", "NMinus1", "Million", "FourMillion"};
  return fmt::format("N{}_{}_{}", std::get<0>(info.param), kNumel[std::get<1>(info.param)],
                     dtype_name(std::get<2>(info.param)));
}

class AllreduceMatrix : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(AllreduceMatrix, EveryRankHoldsTheExactResultBitwise) {
  const auto [n, numel_case, dtype] = GetParam();
  const int64_t numel = numel_for(n, numel_case);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
    check_allreduce(n, numel, dtype, op);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllSizes, AllreduceMatrix,
    ::testing::Combine(::testing::Range(1, 9), ::testing::Range(0, 5),
                       ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                                         DType::kInt32)),
    matrix_name);

// Small chunks force many pipeline units per segment, so forwarding, staging-slot
// reuse and the allgather's wait on the twin send all get exercised, at every
// pipeline depth from one receive ahead (one staging slot) to more than a segment.
TEST(RingAllreduce, ManySmallChunksStayCorrect) {
  ::setenv("GRADCOMM_CHUNK_BYTES", "64", 1);
  ::setenv("GRADCOMM_SMALL_ALLREDUCE_BYTES", "0", 1);  // the ring, even for this small tensor
  for (const char* depth : {"1", "3", "8", "200"})
  for (int n : {2, 3, 5}) {
    SCOPED_TRACE(std::string("GRADCOMM_PIPELINE_DEPTH=") + depth);
    ::setenv("GRADCOMM_PIPELINE_DEPTH", depth, 1);
    const int64_t numel = 10007;
    std::vector<std::vector<float>> data(n, std::vector<float>(numel));
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < numel; ++i) data[r][i] = static_cast<float>(contribution(r, i));
    }
    testing::run_ranks(n, [&](Communicator& comm) {
      comm.allreduce(TensorView::of(data[comm.rank()].data(), numel));
    });
    const auto expected = expected_result(DType::kFloat32, ReduceOp::kSum, n, numel);
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(testing::same_bytes(data[r].data(), expected.data(), expected.size())) << "N=" << n << " rank " << r;
    }
  }
  ::unsetenv("GRADCOMM_CHUNK_BYTES");
  ::unsetenv("GRADCOMM_SMALL_ALLREDUCE_BYTES");
  ::unsetenv("GRADCOMM_PIPELINE_DEPTH");
}

// World sizes first_n..8 x numel 1, 7, 100003 x every dtype and op: the closed-form
// bytes on every rank. Stops at the first failure.
void check_world_sizes(int first_n) {
  for (int n = first_n; n <= 8; ++n) {
    for (int64_t numel : {int64_t{1}, int64_t{7}, int64_t{100003}}) {
      for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt32}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
          check_allreduce(n, numel, dtype, op);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

// The small-tensor path forced on every size: power-of-two and folded world sizes,
// every dtype and op, the same closed-form bytes as the ring.
TEST(RecursiveDoubling, ExactResultOnEveryRankForEveryWorldSize) {
  ::setenv("GRADCOMM_SMALL_ALLREDUCE_BYTES", "1G", 1);
  check_world_sizes(1);
  ::unsetenv("GRADCOMM_SMALL_ALLREDUCE_BYTES");
}

// NaNs with different payloads on different ranks: whichever survives, every rank
// must hold the same bits (both partners combine in the same operand order).
TEST(RecursiveDoubling, NanPayloadsAgreeBitwiseAcrossRanks) {
  for (int n : {2, 3, 4, 7}) {
    std::vector<std::vector<uint32_t>> bits(n, std::vector<uint32_t>(4, 0x3F800000u));  // 1.0f
    for (int r = 0; r < n; ++r) bits[r][1] = 0x7FC00000u | static_cast<uint32_t>(r + 1);  // NaN, payload r+1
    testing::run_ranks(n, [&](Communicator& comm) {
      comm.allreduce(TensorView{bits[comm.rank()].data(), 4, DType::kFloat32, {}});
    });
    for (int r = 1; r < n; ++r) EXPECT_EQ(bits[r], bits[0]) << "N=" << n << " rank " << r;
    float v;
    std::memcpy(&v, &bits[0][1], 4);
    EXPECT_TRUE(std::isnan(v));
  }
}

// Rabenseifner's halving + doubling forced on every size (N = 2 always takes the
// ring): power-of-two and folded world sizes, ranges that halve unevenly and
// empty ones (numel < N), every dtype and op, the same closed-form bytes.
TEST(HalvingDoubling, ExactResultOnEveryRankForEveryWorldSize) {
  ::setenv("GRADCOMM_SMALL_ALLREDUCE_BYTES", "0", 1);
  ::setenv("GRADCOMM_HALVING_DOUBLING_BYTES", "1G", 1);
  check_world_sizes(3);
  ::unsetenv("GRADCOMM_SMALL_ALLREDUCE_BYTES");
  ::unsetenv("GRADCOMM_HALVING_DOUBLING_BYTES");
}

// Each block is reduced once, by its owner, and then copied: NaNs with different
// payloads on different ranks leave the same bits on every rank.
TEST(HalvingDoubling, NanPayloadsAgreeBitwiseAcrossRanks) {
  ::setenv("GRADCOMM_SMALL_ALLREDUCE_BYTES", "0", 1);
  ::setenv("GRADCOMM_HALVING_DOUBLING_BYTES", "1G", 1);
  for (int n : {3, 4, 7}) {
    std::vector<std::vector<uint32_t>> bits(n, std::vector<uint32_t>(9, 0x3F800000u));  // 1.0f
    for (int r = 0; r < n; ++r) {
      for (int i : {1, 5, 8}) bits[r][i] = 0x7FC00000u | static_cast<uint32_t>(r + 1 + 16 * i);  // NaN payloads
    }
    testing::run_ranks(n, [&](Communicator& comm) {
      comm.allreduce(TensorView{bits[comm.rank()].data(), 9, DType::kFloat32, {}});
    });
    for (int r = 1; r < n; ++r) EXPECT_EQ(bits[r], bits[0]) << "N=" << n << " rank " << r;
    for (int i : {1, 5, 8}) {
      float v;
      std::memcpy(&v, &bits[0][i], 4);
      EXPECT_TRUE(std::isnan(v)) << "element " << i;
    }
  }
  ::unsetenv("GRADCOMM_SMALL_ALLREDUCE_BYTES");
  ::unsetenv("GRADCOMM_HALVING_DOUBLING_BYTES");
}

// The default thresholds pick the algorithm by size, and the message counts show
// which ran: at N = 4 a 1 MB tensor takes halving + doubling (2 log2 4 = 4
// messages per rank), 16 MB the ring (2(N-1) steps of C chunks), and at N = 2
// even 1 MB the ring. Every one moves 2(N-1)/N of the bytes, plus the call header.
// Without GRADCOMM_CHUNK_BYTES the dense ring's chunk is 256K for two ranks and 1M
// above: 16 MB at N = 2 is 2 x 32 chunks of 256K, at N = 4 6 x 4 chunks of 1M.
TEST(DenseAllreduce, SizeAndWorldSizePickTheAlgorithm) {
  struct Case {
    int n;
    int64_t bytes;
    uint64_t messages;  // data messages per rank
    const char* chunk;  // GRADCOMM_CHUNK_BYTES, or nullptr for the default
  };
  ::setenv("GRADCOMM_FUSION_BYTES", "0", 1);  // the algorithms' own messages: no fusion plan from rank 0
  for (const Case& c : {Case{4, int64_t{1} << 20, 4, "1M"}, Case{4, int64_t{16} << 20, 6 * 4, "1M"},
                        Case{2, int64_t{1} << 20, 2, "1M"}, Case{8, int64_t{2} << 20, 6, "1M"},
                        Case{2, int64_t{16} << 20, 2 * 32, nullptr}, Case{4, int64_t{16} << 20, 6 * 4, nullptr}}) {
    SCOPED_TRACE(fmt::format("N={} bytes={} chunk={}", c.n, c.bytes, c.chunk ? c.chunk : "default"));
    if (c.chunk) {
      ::setenv("GRADCOMM_CHUNK_BYTES", c.chunk, 1);
    } else {
      ::unsetenv("GRADCOMM_CHUNK_BYTES");
    }
    const int64_t numel = c.bytes / 4;
    std::vector<Stats> stats(c.n);
    testing::run_ranks(c.n, [&](Communicator& comm) {
      std::vector<float> x(numel, 1.0f);
      comm.allreduce(TensorView::of(x.data(), numel));
      for (float v : x) ASSERT_EQ(v, static_cast<float>(c.n));
      stats[comm.rank()] = comm.stats();
    });
    const auto payload = static_cast<uint64_t>(2 * (c.n - 1) * c.bytes / c.n);
    for (int r = 0; r < c.n; ++r) {
      EXPECT_EQ(stats[r].messages_sent, c.messages + 1) << "rank " << r;
      EXPECT_EQ(stats[r].bytes_sent, payload + 96) << "rank " << r;
    }
  }
  ::unsetenv("GRADCOMM_CHUNK_BYTES");
  ::unsetenv("GRADCOMM_FUSION_BYTES");
}

TEST(RingAllreduce, OtherIntegerTypesWrapAndAverage) {
  const int n = 3;
  const int64_t numel = 101;
  std::vector<std::vector<int64_t>> big(n, std::vector<int64_t>(numel));
  std::vector<std::vector<uint8_t>> small(n, std::vector<uint8_t>(numel));
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < numel; ++i) {
      big[r][i] = (int64_t{1} << 40) * (r + 1) + i;
      small[r][i] = static_cast<uint8_t>(100 + r + i);  // sums pass 255: uint8 wraps
    }
  }
  testing::run_ranks(n, [&](Communicator& comm) {
    comm.allreduce(TensorView::of(big[comm.rank()].data(), numel), ReduceOp::kAvg);
    comm.allreduce(TensorView::of(small[comm.rank()].data(), numel), ReduceOp::kSum);
  });
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < numel; ++i) {
      ASSERT_EQ(big[r][i], ((int64_t{1} << 40) * 6 + 3 * i) / 3);
      ASSERT_EQ(small[r][i], static_cast<uint8_t>(300 + 3 + 3 * i));
    }
  }
}

// IEEE arithmetic, not silence (docs/fault-model.md): a NaN anywhere gives NaN for
// every op (min/max included, unlike std::min); +Inf meeting -Inf sums to NaN; a lone
// +Inf survives sum, avg and max. Small tensors (recursive doubling) and large ones
// (the chunked ring), every floating dtype, N = 2..4; every rank holds the same bits.
TEST(RingAllreduce, NanAndInfPropagate) {
  enum Class { kFinite, kNan, kPosInf, kNegInf };
  const auto load = [](DType dtype, const std::vector<uint8_t>& bytes, int64_t i) -> double {
    switch (dtype) {
      case DType::kFloat32: return reinterpret_cast<const float*>(bytes.data())[i];
      case DType::kFloat64: return reinterpret_cast<const double*>(bytes.data())[i];
      case DType::kFloat16: return detail::half_to_float(reinterpret_cast<const uint16_t*>(bytes.data())[i]);
      default: return detail::bf16_to_float(reinterpret_cast<const uint16_t*>(bytes.data())[i]);
    }
  };
  const auto classify = [](double v) { return std::isnan(v) ? kNan : v == INFINITY ? kPosInf : v == -INFINITY ? kNegInf : kFinite; };
  for (int n : {2, 3, 4}) {
    for (int64_t numel : {int64_t{4}, int64_t{300007}}) {
      for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
          SCOPED_TRACE(fmt::format("N={} numel={} {} {}", n, numel, dtype_name(dtype), reduce_op_name(op)));
          const size_t bytes = numel * dtype_size(dtype);
          std::vector<std::vector<uint8_t>> data(n, std::vector<uint8_t>(bytes));
          const int64_t last = numel - 1;
          for (int r = 0; r < n; ++r) {
            for (int64_t i = 0; i < numel; ++i) testing::store_value(dtype, data[r].data(), i, testing::contribution(r, i));
          }
          testing::store_value(dtype, data[n - 1].data(), 0, NAN);       // NaN on one rank
          testing::store_value(dtype, data[0].data(), 1, INFINITY);      // +Inf meets -Inf
          testing::store_value(dtype, data[n - 1].data(), 1, -INFINITY);
          testing::store_value(dtype, data[1].data(), last, INFINITY);   // a lone +Inf, in the last chunk
          testing::run_ranks(n, [&](Communicator& comm) {
            comm.allreduce(TensorView{data[comm.rank()].data(), numel, dtype, {}}, op);
          });
          for (int r = 1; r < n; ++r) ASSERT_TRUE(testing::same_bytes(data[r].data(), data[0].data(), bytes));
          const bool adds = op == ReduceOp::kSum || op == ReduceOp::kAvg;
          EXPECT_EQ(classify(load(dtype, data[0], 0)), kNan);
          EXPECT_EQ(classify(load(dtype, data[0], 1)), adds ? kNan : op == ReduceOp::kMin ? kNegInf : kPosInf);
          EXPECT_EQ(classify(load(dtype, data[0], last)), op == ReduceOp::kMin ? kFinite : kPosInf);
          for (int64_t i = 2; i < last; ++i) ASSERT_EQ(classify(load(dtype, data[0], i)), kFinite) << "element " << i;
        }
      }
    }
  }
}

TEST(RingAllreduce, StatsCountBandwidthOptimalTraffic) {
  ::setenv("GRADCOMM_HALVING_DOUBLING_BYTES", "0", 1);  // 4 MB at N = 4: the ring, not halving + doubling
  ::setenv("GRADCOMM_FUSION_BYTES", "0", 1);            // and no fusion plan from rank 0
  const int n = 4;
  const int64_t numel = 1 << 20;
  std::vector<Stats> stats(n);
  testing::run_ranks(n, [&](Communicator& comm) {
    std::vector<float> x(numel, 1.0f);
    comm.allreduce(TensorView::of(x.data(), numel));
    stats[comm.rank()] = comm.stats();
  });
  const double payload = 2.0 * (n - 1) / n * numel * sizeof(float);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(stats[r].ops, 1u);
    // Payload plus one 96-byte call header: the ring's 2(N-1)/N, nothing more.
    EXPECT_EQ(stats[r].bytes_sent, static_cast<uint64_t>(payload) + 96) << "rank " << r;
    EXPECT_GT(stats[r].total_s, 0.0);
    EXPECT_GE(stats[r].comm_s(), 0.0);
  }
  ::unsetenv("GRADCOMM_HALVING_DOUBLING_BYTES");
  ::unsetenv("GRADCOMM_FUSION_BYTES");
}

// More than 2^31 bytes: 64-bit sizes all the way through the ring.
TEST(RingAllreduceLarge, MoreThanTwoGiBOfBytes) {
  const int n = 2;
  const int64_t numel = (int64_t{1} << 31) + 7;
  std::vector<std::vector<uint8_t>> data(n);
  for (int r = 0; r < n; ++r) data[r].assign(numel, static_cast<uint8_t>(r + 1));
  data[1][numel - 1] = 40;
  testing::run_ranks(n, [&](Communicator& comm) {
    comm.allreduce(TensorView::of(data[comm.rank()].data(), numel));
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(data[r][0], 3);
    EXPECT_EQ(data[r][numel / 2], 3);
    EXPECT_EQ(data[r][(int64_t{1} << 31) + 1], 3);
    EXPECT_EQ(data[r][numel - 1], 41);
    EXPECT_TRUE(testing::same_bytes(data[0].data(), data[r].data(), numel));
  }
}

}  // namespace
}  // namespace gradcomm
