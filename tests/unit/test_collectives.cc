// allgather, allgatherv, reduce_scatter, broadcast and barrier over the in-process transport,
// against closed-form expectations.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>

#include "test_util.h"

namespace gradcomm {
namespace {

int32_t value(int rank, int64_t i) { return rank * 1000003 + static_cast<int32_t>(i % 1000003); }

TEST(RingAllgather, EveryRankHoldsEveryBlockInRankOrder) {
  for (int n = 1; n <= 8; ++n) {
    for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{n - 1}, int64_t{1000003}}) {
      SCOPED_TRACE(fmt::format("N={} numel={}", n, numel));
      std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(numel));
      std::vector<testing::GuardedBuffer> out;
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < numel; ++i) in[r][i] = value(r, i);
        out.emplace_back(n * numel * sizeof(int32_t));
      }
      testing::run_ranks(n, [&](Communicator& comm) {
        const int r = comm.rank();
        comm.allgather(TensorView::of(in[r].data(), numel),
                       TensorView{out[r].data(), n * numel, DType::kInt32, {}});
      });
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(out[r].guards_intact());
        const auto* got = reinterpret_cast<const int32_t*>(out[r].bytes());
        for (int s = 0; s < n; ++s) {
          for (int64_t i = 0; i < numel; ++i) ASSERT_EQ(got[s * numel + i], value(s, i)) << "rank " << r;
        }
      }
    }
  }
}

TEST(RingAllgather, InPlaceInputInsideOutput) {
  const int n = 4;
  const int64_t numel = 1001;
  std::vector<std::vector<double>> out(n, std::vector<double>(n * numel, -1.0));
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < numel; ++i) out[r][r * numel + i] = r + i * 0.5;
  }
  testing::run_ranks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    comm.allgather(TensorView::of(out[r].data() + r * numel, numel), TensorView::of(out[r].data(), n * numel));
  });
  for (int r = 0; r < n; ++r) {
    for (int s = 0; s < n; ++s) {
      for (int64_t i = 0; i < numel; ++i) ASSERT_EQ(out[r][s * numel + i], s + i * 0.5);
    }
  }
}

// reduce_scatter: rank r gets segment r of the sum over ranks, exact in int32; the
// input is untouched and nothing is written outside the output. Counts up to 4 MB a
// segment cut into several pipeline chunks.
TEST(RingReduceScatter, EveryRankHoldsItsSegmentOfTheSum) {
  for (int n = 1; n <= 8; ++n) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000003}}) {
      SCOPED_TRACE(fmt::format("N={} count={}", n, count));
      const int64_t numel = n * count;
      std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(numel));
      std::vector<testing::GuardedBuffer> out;
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < numel; ++i) in[r][i] = value(r, i);
        out.emplace_back(count * sizeof(int32_t));
      }
      const std::vector<std::vector<int32_t>> before = in;
      testing::run_ranks(n, [&](Communicator& comm) {
        const int r = comm.rank();
        comm.reduce_scatter(TensorView::of(in[r].data(), numel), TensorView{out[r].data(), count, DType::kInt32, {}});
      });
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(out[r].guards_intact());
        ASSERT_EQ(in[r], before[r]) << "rank " << r << "'s input changed";
        const auto* got = reinterpret_cast<const int32_t*>(out[r].bytes());
        for (int64_t i = 0; i < count; ++i) {
          int32_t want = 0;
          for (int s = 0; s < n; ++s) want += value(s, r * count + i);
          ASSERT_EQ(got[i], want) << "rank " << r << " element " << i;
        }
      }
    }
  }
}

// avg, min and max on doubles whose sums are exact: avg is sum / N rounded once.
TEST(RingReduceScatter, AverageMinAndMax) {
  const int n = 3;
  const int64_t count = 50001;
  auto x = [](int r, int64_t i) { return static_cast<double>((r * 7919 + i * 31) % 1013) - 500.0; };
  for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
    SCOPED_TRACE(reduce_op_name(op));
    std::vector<std::vector<double>> in(n, std::vector<double>(n * count)), out(n, std::vector<double>(count));
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < n * count; ++i) in[r][i] = x(r, i);
    }
    testing::run_ranks(n, [&](Communicator& comm) {
      const int r = comm.rank();
      comm.reduce_scatter(TensorView::of(in[r].data(), n * count), TensorView::of(out[r].data(), count), op);
    });
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < count; ++i) {
        const int64_t j = r * count + i;
        double want = x(0, j);
        for (int s = 1; s < n; ++s) {
          want = op == ReduceOp::kMin ? std::min(want, x(s, j)) : op == ReduceOp::kMax ? std::max(want, x(s, j))
                                                                                     : want + x(s, j);
        }
        if (op == ReduceOp::kAvg) want /= n;
        ASSERT_EQ(out[r][i], want) << "rank " << r << " element " << i;
      }
    }
  }
}

// The output may be this rank's own segment of the input (NCCL's in-place form).
TEST(RingReduceScatter, InPlaceOutputIsTheRanksSegmentOfTheInput) {
  const int n = 4;
  const int64_t count = 1001;
  std::vector<std::vector<int64_t>> buf(n, std::vector<int64_t>(n * count));
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < n * count; ++i) buf[r][i] = r * 100000 + i;
  }
  testing::run_ranks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    comm.reduce_scatter(TensorView::of(buf[r].data(), n * count), TensorView::of(buf[r].data() + r * count, count));
  });
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(buf[r][r * count + i], (0 + 1 + 2 + 3) * 100000 + n * (r * count + i)) << "rank " << r;
    }
  }
}

TEST(RingAllgatherv, VariableCountsIncludingEmptyBlocks) {
  for (int n : {1, 2, 3, 5, 8}) {
    std::vector<std::vector<uint8_t>> results(n);
    std::vector<std::vector<int64_t>> counts(n);
    auto count_of = [](int r) { return r % 3 == 1 ? int64_t{0} : int64_t{r * 70001 + 3}; };
    testing::run_ranks(n, [&](Communicator& comm) {
      const int r = comm.rank();
      std::vector<int32_t> mine(count_of(r));
      for (size_t i = 0; i < mine.size(); ++i) mine[i] = value(r, i);
      counts[r] = comm.impl().allgatherv(mine.data(), mine.size(), DType::kInt32, results[r]);
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(counts[r].size(), static_cast<size_t>(n));
      const auto* got = reinterpret_cast<const int32_t*>(results[r].data());
      int64_t at = 0;
      for (int s = 0; s < n; ++s) {
        ASSERT_EQ(counts[r][s], count_of(s));
        for (int64_t i = 0; i < count_of(s); ++i) ASSERT_EQ(got[at + i], value(s, i)) << "N=" << n;
        at += count_of(s);
      }
      ASSERT_EQ(results[r].size(), static_cast<size_t>(at) * sizeof(int32_t));
    }
  }
}

TEST(ChainBroadcast, EveryRootEverySize) {
  ::setenv("GRADCOMM_CHUNK_BYTES", "4096", 1);  // several pipeline chunks
  for (int n = 1; n <= 6; ++n) {
    for (int root = 0; root < n; ++root) {
      for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{100003}}) {
        std::vector<std::vector<float>> data(n, std::vector<float>(numel, -7.0f));
        for (int64_t i = 0; i < numel; ++i) data[root][i] = static_cast<float>(i) * 0.25f;
        testing::run_ranks(n, [&](Communicator& comm) {
          comm.broadcast(TensorView::of(data[comm.rank()].data(), numel), root);
        });
        for (int r = 0; r < n; ++r) {
          ASSERT_TRUE(testing::same_bytes(data[r].data(), data[root].data(), numel * sizeof(float)))
              << "N=" << n << " root=" << root << " rank=" << r;
        }
      }
    }
  }
  ::unsetenv("GRADCOMM_CHUNK_BYTES");
}

TEST(DisseminationBarrier, NoRankLeavesBeforeTheLastArrives) {
  for (int n : {1, 2, 3, 5, 8}) {
    std::atomic<int> arrived{0};
    std::vector<int> seen_on_exit(n);
    testing::run_ranks(n, [&](Communicator& comm) {
      for (int round = 0; round < 3; ++round) {
        // Stagger arrivals: the last rank comes late.
        std::this_thread::sleep_for(std::chrono::milliseconds(comm.rank() == n - 1 ? 30 : 0));
        arrived.fetch_add(1);
        comm.barrier();
        if (round == 0) seen_on_exit[comm.rank()] = arrived.load();
        comm.barrier();
      }
    });
    for (int r = 0; r < n; ++r) EXPECT_GE(seen_on_exit[r], n) << "N=" << n << " rank " << r;
  }
}

TEST(Communicator, SingleRankIsTheIdentity) {
  std::vector<float> x{1, 2, 3};
  std::vector<float> gathered(3);
  testing::run_ranks(1, [&](Communicator& comm) {
    comm.allreduce(TensorView::of(x.data(), 3), ReduceOp::kAvg);
    comm.allgather(TensorView::of(x.data(), 3), TensorView::of(gathered.data(), 3));
    comm.broadcast(TensorView::of(x.data(), 3), 0);
    comm.barrier();
    EXPECT_EQ(comm.stats().ops, 4u);
    EXPECT_EQ(comm.stats().bytes_sent, 0u);
  });
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(gathered, x);
}

// Stats::engine_cpu_s is the engine thread's CPU time: it grows with the work the
// collectives do there (a compressed allreduce of 4M elements costs milliseconds of
// encode and decode) and never goes backwards.
TEST(Communicator, EngineCpuTimeCountsTheCollectivesWork) {
  testing::run_ranks(2, [&](Communicator& comm) {
    const double before = comm.stats().engine_cpu_s;
    EXPECT_GE(before, 0.0);
    std::vector<float> x(size_t{1} << 22, 1.0f);
    CompressOptions opts;
    opts.compressor = "quant:bits=4";
    opts.key = "x";
    for (int i = 0; i < 3; ++i) comm.allreduce(TensorView::of(x.data(), static_cast<int64_t>(x.size())), ReduceOp::kSum, opts);
    const double after = comm.stats().engine_cpu_s;
    EXPECT_GT(after - before, 1e-3) << "before " << before << " s, after " << after << " s";
    EXPECT_GE(comm.stats().engine_cpu_s, after);
  });
}

TEST(Communicator, ManyCallsInSequenceKeepTheirOrder) {
  const int n = 4;
  testing::run_ranks(n, [&](Communicator& comm) {
    for (int it = 0; it < 200; ++it) {
      int64_t v[3] = {comm.rank(), it, 1};
      comm.allreduce(TensorView::of(v, 3));
      ASSERT_EQ(v[0], 6);
      ASSERT_EQ(v[1], 4 * it);
      ASSERT_EQ(v[2], 4);
      if (it % 50 == 0) comm.barrier();
    }
  });
}

}  // namespace
}  // namespace gradcomm
