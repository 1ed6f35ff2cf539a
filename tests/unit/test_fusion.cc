// Tensor fusion (src/fusion.h): small allreduces issued together travel as one
// collective planned by rank 0; results stay exact (closed-form sums), per-key
// error feedback stays per key, groups close on a wait or after the cycle, and
// ranks whose calls cannot travel together raise MismatchError.
#include <fmt/format.h>

#include <cmath>
#include <random>

#include "introspect.h"
#include "test_util.h"

namespace gradcomm {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Forty small dense calls issued back to back: they fuse (rank 0 sees them queued
// within its cycle), every element is the exact closed-form sum, and every rank
// reports the same fused count.
TEST(Fusion, SmallCallsIssuedTogetherFuseAndSumExactly) {
  const int n = 4, calls = 40;
  std::vector<uint64_t> fused(n);
  testing::run_ranks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<std::vector<float>> x(calls);
    std::vector<std::shared_ptr<Work>> works;
    for (int c = 0; c < calls; ++c) {
      const int64_t numel = 1 + (c * 577) % 3000;
      x[c].resize(numel);
      for (int64_t i = 0; i < numel; ++i) x[c][i] = static_cast<float>(testing::contribution(r, i + c));
      works.push_back(comm.allreduce_async(TensorView::of(x[c].data(), numel)));
    }
    for (auto& w : works) w->wait();
    for (int c = 0; c < calls; ++c) {
      for (size_t i = 0; i < x[c].size(); ++i) {
        double sum = 0;
        for (int s = 0; s < n; ++s) sum += testing::contribution(s, static_cast<int64_t>(i) + c);
        ASSERT_EQ(x[c][i], static_cast<float>(sum)) << "call " << c << " element " << i;
      }
    }
    fused[r] = comm.stats().fused_calls;
    EXPECT_EQ(comm.stats().ops, static_cast<uint64_t>(calls));
  });
  EXPECT_GT(fused[0], 0u) << "nothing fused";
  for (int r = 1; r < n; ++r) EXPECT_EQ(fused[r], fused[0]);
}

TEST(Fusion, ZeroFusionBytesTurnsItOff) {
  testing::ScopedEnv off("GRADCOMM_FUSION_BYTES", "0");
  testing::run_ranks(3, [&](Communicator& comm) {
    std::vector<std::vector<float>> x(20, std::vector<float>(10, 1.0f));
    std::vector<std::shared_ptr<Work>> works;
    for (auto& v : x) works.push_back(comm.allreduce_async(TensorView::of(v.data(), 10)));
    for (auto& w : works) w->wait();
    EXPECT_EQ(comm.stats().fused_calls, 0u);
    for (auto& v : x) ASSERT_EQ(v[9], 3.0f);
  });
}

// Mixed dtypes and ops in one burst: only neighbours of one class fuse, and each
// call still gets its own op (max stays max, avg stays avg).
TEST(Fusion, OnlyCallsOfOneOpAndDtypeTravelTogether) {
  const int n = 3;
  testing::run_ranks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> a(100, static_cast<float>(r + 1)), b(100, static_cast<float>(r + 1)), e(100, 2.0f);
    std::vector<double> c(100, static_cast<double>(r + 1));
    std::vector<int32_t> d(100, r + 1);
    auto wa = comm.allreduce_async(TensorView::of(a.data(), 100), ReduceOp::kSum);
    auto wb = comm.allreduce_async(TensorView::of(b.data(), 100), ReduceOp::kMax);
    auto wc = comm.allreduce_async(TensorView::of(c.data(), 100), ReduceOp::kSum);
    auto wd = comm.allreduce_async(TensorView::of(d.data(), 100), ReduceOp::kSum);
    auto we = comm.allreduce_async(TensorView::of(e.data(), 100), ReduceOp::kAvg);
    for (auto* w : {&wa, &wb, &wc, &wd, &we}) (*w)->wait();
    EXPECT_EQ(a[99], 6.0f);
    EXPECT_EQ(b[99], 3.0f);
    EXPECT_EQ(c[99], 6.0);
    EXPECT_EQ(d[99], 6);
    EXPECT_EQ(e[99], 2.0f);
  });
}

// A call that reads an earlier call's output (the same memory) must not travel
// beside it: the sums are applied one after another.
TEST(Fusion, CallsOnOverlappingMemoryRunOneAfterAnother) {
  testing::run_ranks(2, [&](Communicator& comm) {
    std::vector<float> x(1000, 1.0f);
    auto w1 = comm.allreduce_async(TensorView::of(x.data(), 600));
    auto w2 = comm.allreduce_async(TensorView::of(x.data() + 500, 500));  // overlaps the first in [500, 600)
    auto w3 = comm.allreduce_async(TensorView::of(x.data(), 500));
    w3->wait();
    w1->wait();
    w2->wait();
    EXPECT_EQ(x[0], 4.0f);     // calls 1 and 3
    EXPECT_EQ(x[550], 4.0f);   // calls 1 and 2
    EXPECT_EQ(x[999], 2.0f);   // call 2 only
  });
}

// Top-k over a fused group: error feedback stays per key. For every key and step,
// what the ranks fed in (gradient + old residual) equals what came out plus what
// the ranks kept back (new residuals), and every rank holds the same bytes.
TEST(Fusion, CompressedGroupsKeepErrorFeedbackPerKey) {
  const int n = 3, keys = 8, steps = 4;
  std::vector<uint64_t> fused(n);
  // in[step][key][rank], res[step][key][rank] (residual after the step), out[step][key][rank]
  using Grid = std::vector<std::vector<std::vector<std::vector<float>>>>;
  Grid in(steps, std::vector<std::vector<std::vector<float>>>(keys, std::vector<std::vector<float>>(n)));
  Grid res = in, out = in;
  testing::run_ranks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    std::mt19937 rng(77 + r);
    std::normal_distribution<float> dist;
    for (int s = 0; s < steps; ++s) {
      std::vector<std::vector<float>> g(keys);
      std::vector<std::shared_ptr<Work>> works;
      for (int k = 0; k < keys; ++k) {
        g[k].resize(200 + 37 * k);
        for (float& v : g[k]) v = dist(rng);
        in[s][k][r] = g[k];
        works.push_back(comm.allreduce_async(TensorView::of(g[k].data(), static_cast<int64_t>(g[k].size())),
                                             ReduceOp::kSum, {"topk:ratio=0.05", fmt::format("k{}", k)}));
      }
      for (auto& w : works) w->wait();
      for (int k = 0; k < keys; ++k) {
        out[s][k][r] = g[k];
        const auto view = detail::residual_view(comm, fmt::format("k{}", k));
        res[s][k][r].assign(view.begin(), view.end());
      }
    }
    fused[r] = comm.stats().fused_calls;
  });
  EXPECT_GT(fused[0], 0u) << "nothing fused";
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < keys; ++k) {
      const size_t numel = in[s][k][0].size();
      for (int r = 1; r < n; ++r) ASSERT_EQ(out[s][k][r], out[s][k][0]) << "step " << s << " key " << k;
      for (size_t i = 0; i < numel; ++i) {
        double fed = 0, kept = 0, magnitude = 0;
        for (int r = 0; r < n; ++r) {
          const double old = s > 0 ? res[s - 1][k][r][i] : 0.0;
          fed += in[s][k][r][i] + old;
          kept += res[s][k][r][i];
          magnitude += std::abs(in[s][k][r][i]) + std::abs(old);
        }
        ASSERT_NEAR(out[s][k][0][i] + kept, fed, 1e-5 * (1 + magnitude)) << "step " << s << " key " << k << " i " << i;
      }
    }
  }
}

// Keys in warm-up go dense: they fuse with plain dense calls, their (zero) residual
// folded in, and the sums are exact.
TEST(Fusion, WarmUpKeysTravelWithDenseCalls) {
  const int n = 2;
  testing::run_ranks(n, [&](Communicator& comm) {
    std::vector<float> a(300, 1.0f), b(200, 2.0f), c(100, 3.0f);
    auto wa = comm.allreduce_async(TensorView::of(a.data(), 300));
    auto wb = comm.allreduce_async(TensorView::of(b.data(), 200), ReduceOp::kSum, {"topk:ratio=0.1,warmup=1", "w"});
    auto wc = comm.allreduce_async(TensorView::of(c.data(), 100));
    wa->wait();
    wb->wait();
    wc->wait();
    EXPECT_EQ(a[299], 2.0f);
    EXPECT_EQ(b[199], 4.0f);
    EXPECT_EQ(c[99], 6.0f);
  });
}

// A wait closes the group at once: with a 20 s cycle, small blocking calls and a
// waited async call still return promptly.
TEST(Fusion, WaitingClosesAGroupWithoutWaitingForTheCycle) {
  testing::ScopedEnv cycle("GRADCOMM_CYCLE_MS", "20000");
  testing::run_ranks(3, [&](Communicator& comm) {
    const auto start = Clock::now();
    std::vector<float> x(10, 1.0f);
    comm.allreduce(TensorView::of(x.data(), 10));
    comm.allreduce_async(TensorView::of(x.data(), 10))->wait();
    EXPECT_TRUE(comm.allreduce_async(TensorView::of(x.data(), 10))->wait_for(std::chrono::seconds(10)));
    EXPECT_LT(seconds_since(start), 5.0);
    EXPECT_EQ(x[0], 27.0f);
  });
}

// Nobody waits: the cycle alone closes the group (Stats do not ask it to).
TEST(Fusion, TheCycleClosesAGroupNobodyWaitsOn) {
  testing::ScopedEnv cycle("GRADCOMM_CYCLE_MS", "20");
  testing::run_ranks(2, [&](Communicator& comm) {
    std::vector<float> x(10, 1.0f);
    auto work = comm.allreduce_async(TensorView::of(x.data(), 10));
    const auto start = Clock::now();
    while (comm.stats().ops == 0 && seconds_since(start) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(comm.stats().ops, 1u);
    work->wait();
  });
}

// Rank 0 issues everything at once, rank 1 one call at a time: rank 1 follows
// rank 0's plan, waiting for its own caller to issue the calls the plan names.
TEST(Fusion, RanksThatIssueLaterFollowRankZerosPlan) {
  const int n = 3;
  testing::run_ranks(n, [&](Communicator& comm) {
    std::vector<std::vector<float>> x(12, std::vector<float>(50, 1.0f));
    std::vector<std::shared_ptr<Work>> works;
    for (auto& v : x) {
      if (comm.rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
      works.push_back(comm.allreduce_async(TensorView::of(v.data(), 50)));
    }
    for (auto& w : works) w->wait();
    for (auto& v : x) ASSERT_EQ(v[49], 3.0f);
  });
}

// Rank 1's third call is a max where rank 0's is a sum: rank 0 plans them into one
// group, rank 1 cannot follow, and every rank raises MismatchError naming the call.
TEST(Fusion, CallsThatCannotFollowThePlanRaiseMismatchOnEveryRank) {
  const int n = 3;
  std::vector<std::string> messages(n);
  const auto errors = testing::run_ranks_collect(n, [&](Communicator& comm) {
    std::vector<std::vector<float>> x(6, std::vector<float>(40, 1.0f));
    std::vector<std::shared_ptr<Work>> works;
    for (int c = 0; c < 6; ++c) {
      const ReduceOp op = comm.rank() == 1 && c == 2 ? ReduceOp::kMax : ReduceOp::kSum;
      try {
        works.push_back(comm.allreduce_async(TensorView::of(x[c].data(), 40), op));
      } catch (const MismatchError& e) {  // a late thread: the others already failed the group
        messages[comm.rank()] = e.what();
        break;
      }
    }
    for (auto& w : works) {
      try {
        w->wait();
      } catch (const MismatchError& e) {
        messages[comm.rank()] = e.what();
      }
    }
  });
  for (int r = 0; r < n; ++r) {
    if (errors[r]) std::rethrow_exception(errors[r]);
    EXPECT_FALSE(messages[r].empty()) << "rank " << r << " raised no MismatchError";
  }
  EXPECT_NE(messages[1].find("max"), std::string::npos) << messages[1];
}

}  // namespace
}  // namespace gradcomm
