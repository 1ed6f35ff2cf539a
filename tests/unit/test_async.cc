// Non-blocking collectives and the engine that runs them (src/engine.h): results
// against the blocking calls, issue order, Work's wait/wait_for/is_completed,
// errors raised from wait() on every rank, destruction with work outstanding.
// Fusion has its own file (test_fusion.cc).
#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <random>
#include <thread>

#include "test_util.h"

namespace gradcomm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One call of the mixed sequence: what it is and the bytes it ends with.
struct MixedCall {
  enum Kind { kDense, kDense64, kCompressed, kAllgather, kBroadcast } kind;
  int64_t numel;
  std::string spec;  // kCompressed
};

// 200 calls: dense of many sizes (latency-bound to ring-sized), float64, every
// compressor family, allgather and broadcast, in a fixed pseudo-random order.
std::vector<MixedCall> mixed_sequence() {
  static const int64_t kSizes[] = {1, 7, 1000, 4099, 65537, 300001};
  static const char* kSpecs[] = {"topk:ratio=0.05", "quant:bits=4", "fp16", "sign", "randomk:ratio=0.1", "qsgd"};
  std::mt19937 rng(1234);
  std::vector<MixedCall> calls;
  for (int i = 0; i < 200; ++i) {
    const auto kind = static_cast<MixedCall::Kind>(rng() % 5);
    const int64_t numel = kSizes[rng() % 6];
    calls.push_back({kind, numel, kind == MixedCall::kCompressed ? kSpecs[rng() % 6] : ""});
  }
  return calls;
}

// Rank r's input of call i: deterministic, not integer-valued (so reduction order shows).
std::vector<uint8_t> mixed_input(const MixedCall& c, int rank, int i) {
  std::mt19937 rng(static_cast<uint32_t>(i * 131 + rank));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const size_t elem = c.kind == MixedCall::kDense64 ? 8 : 4;
  std::vector<uint8_t> bytes(static_cast<size_t>(c.numel) * elem);
  for (int64_t j = 0; j < c.numel; ++j) {
    if (elem == 8) {
      reinterpret_cast<double*>(bytes.data())[j] = dist(rng);
    } else {
      reinterpret_cast<float*>(bytes.data())[j] = dist(rng);
    }
  }
  return bytes;
}

// Runs the mixed sequence, async (everything issued, then waited in reverse
// order) or blocking, and returns every call's output bytes on every rank.
std::vector<std::vector<std::vector<uint8_t>>> run_mixed(int n, bool async) {
  const auto calls = mixed_sequence();
  std::vector<std::vector<std::vector<uint8_t>>> out(n, std::vector<std::vector<uint8_t>>(calls.size()));
  testing::run_ranks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    auto& mine = out[r];
    std::vector<std::vector<uint8_t>> inputs(calls.size());
    std::vector<std::shared_ptr<Work>> works;
    for (size_t i = 0; i < calls.size(); ++i) {
      const MixedCall& c = calls[i];
      inputs[i] = mixed_input(c, r, static_cast<int>(i));
      std::shared_ptr<Work> work;
      auto issue = [&](auto&& fn) {
        if (async) {
          works.push_back(fn());
        } else {
          fn()->wait();
        }
      };
      switch (c.kind) {
        case MixedCall::kDense:
        case MixedCall::kDense64: {
          mine[i] = inputs[i];
          TensorView t{mine[i].data(), c.numel, c.kind == MixedCall::kDense ? DType::kFloat32 : DType::kFloat64, {}};
          issue([&] { return comm.allreduce_async(t, ReduceOp::kSum); });
          break;
        }
        case MixedCall::kCompressed: {
          mine[i] = inputs[i];
          TensorView t{mine[i].data(), c.numel, DType::kFloat32, {}};
          issue([&] { return comm.allreduce_async(t, ReduceOp::kAvg, {c.spec, fmt::format("key{}", i)}); });
          break;
        }
        case MixedCall::kAllgather: {
          mine[i].assign(inputs[i].size() * n, 0);
          TensorView in{inputs[i].data(), c.numel, DType::kFloat32, {}};
          TensorView o{mine[i].data(), c.numel * n, DType::kFloat32, {}};
          issue([&] { return comm.allgather_async(in, o); });
          break;
        }
        case MixedCall::kBroadcast: {
          mine[i] = inputs[i];
          TensorView t{mine[i].data(), c.numel, DType::kFloat32, {}};
          issue([&] { return comm.broadcast_async(t, static_cast<int>(i) % n); });
          break;
        }
      }
    }
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  });
  return out;
}

// The acceptance test of issue [H]: 200 calls of mixed sizes and compressors in
// flight at once give the same bytes on every rank, and the same bytes as the
// blocking calls (fusion off: the algorithm is then the same call by call).
TEST(Async, TwoHundredMixedCallsInFlightEqualTheBlockingCallsBitwise) {
  testing::ScopedEnv no_fusion("GRADCOMM_FUSION_BYTES", "0");
  const int n = 3;
  const auto async = run_mixed(n, true);
  const auto blocking = run_mixed(n, false);
  const auto calls = mixed_sequence();
  for (size_t i = 0; i < calls.size(); ++i) {
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(async[r][i], async[0][i]) << "call " << i << " differs between rank " << r << " and rank 0";
      ASSERT_EQ(async[r][i], blocking[r][i]) << "call " << i << " on rank " << r << ": async != blocking";
    }
  }
}

// With fusion on (the default), dense results match the exact sums within fp32
// reduction-order error and every rank still holds the same bytes.
TEST(Async, TwoHundredMixedCallsWithFusionAreBitwiseIdenticalAcrossRanks) {
  const int n = 4;
  const auto async = run_mixed(n, true);
  const auto calls = mixed_sequence();
  for (size_t i = 0; i < calls.size(); ++i) {
    for (int r = 1; r < n; ++r) ASSERT_EQ(async[r][i], async[0][i]) << "call " << i << " rank " << r;
    if (calls[i].kind != MixedCall::kDense) continue;
    const auto* got = reinterpret_cast<const float*>(async[0][i].data());
    std::vector<std::vector<uint8_t>> inputs;
    for (int r = 0; r < n; ++r) inputs.push_back(mixed_input(calls[i], r, static_cast<int>(i)));
    for (int64_t j = 0; j < calls[i].numel; ++j) {
      double exact = 0, magnitude = 0;
      for (int r = 0; r < n; ++r) {
        const float v = reinterpret_cast<const float*>(inputs[r].data())[j];
        exact += v;
        magnitude += std::abs(v);
      }
      ASSERT_NEAR(got[j], exact, n * magnitude * 1.2e-7 + 1e-30) << "call " << i << " element " << j;
    }
  }
}

TEST(Async, WorkReportsCompletionWithoutBlockingAndWaitForExpires) {
  testing::run_ranks(2, [](Communicator& comm) {
    std::vector<float> x(1000, 1.0f);
    if (comm.rank() == 1) std::this_thread::sleep_for(milliseconds(400));
    auto work = comm.allreduce_async(TensorView::of(x.data(), 1000));
    if (comm.rank() == 0) {
      EXPECT_FALSE(work->wait_for(milliseconds(20)));  // rank 1 has not called yet
      EXPECT_FALSE(work->is_completed());
      EXPECT_EQ(work->error(), nullptr);
    }
    EXPECT_TRUE(work->wait_for(std::chrono::seconds(30)));
    EXPECT_TRUE(work->is_completed());
    EXPECT_EQ(work->error(), nullptr);
    work->wait();  // again: returns at once
    for (float v : x) ASSERT_EQ(v, 2.0f);
  });
}

TEST(Async, BadArgumentsAreThrownAtIssueAndQueueNothing) {
  testing::run_ranks(2, [](Communicator& comm) {
    std::vector<float> x(10, 1.0f);
    EXPECT_THROW(comm.allreduce_async(TensorView::of(x.data(), -1)), InvalidArgument);
    EXPECT_THROW(comm.allreduce_async(TensorView::of(x.data(), 10), ReduceOp::kSum, {"nosuch", "k"}), InvalidArgument);
    EXPECT_THROW(comm.allreduce_async(TensorView::of(x.data(), 10), ReduceOp::kSum, {"topk:ratio=0.1", ""}),
                 InvalidArgument);
    EXPECT_THROW(comm.broadcast_async(TensorView::of(x.data(), 10), 5), InvalidArgument);
    EXPECT_THROW(comm.allgather_async(TensorView::of(x.data(), 10), TensorView::of(x.data(), 10)), InvalidArgument);
    // Nothing was numbered: the next call is #1 on both ranks and succeeds.
    comm.allreduce_async(TensorView::of(x.data(), 10))->wait();
    for (float v : x) ASSERT_EQ(v, 2.0f);
    EXPECT_EQ(comm.stats().ops, 1u);
  });
}

// Calls run in issue order whatever the order of the waits, blocking calls
// included: each allreduce reads the previous one's output.
TEST(Async, CallsRunInIssueOrderAcrossBlockingAndNonBlocking) {
  testing::run_ranks(3, [](Communicator& comm) {
    std::vector<int64_t> x(5000, 1);
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 6; ++i) {
      if (i == 3) {
        comm.allreduce(TensorView::of(x.data(), 5000));  // blocking, between async ones on the same tensor
      } else {
        works.push_back(comm.allreduce_async(TensorView::of(x.data(), 5000)));
      }
    }
    for (auto& w : works) w->wait();
    for (int64_t v : x) ASSERT_EQ(v, 729);  // 3^6: six sums in a row, each of the previous result
  });
}

// A mismatch with ten calls outstanding: every wait() raises MismatchError (or
// succeeds, for calls that completed before it), on every rank, in seconds. A
// rank whose engine ran its first calls before the rest were issued may learn
// of the failure while still issuing: the later issues then raise it at once
// (communicator.h), with the same class.
TEST(Async, MismatchWithTenCallsOutstandingRaisesFromEveryWait) {
  const auto errors = testing::run_ranks_owning(3, [](std::unique_ptr<Communicator>& comm) {
    const bool odd = comm->rank() == 1;
    std::vector<std::vector<float>> x(10, std::vector<float>(2000, 1.0f));
    std::vector<std::shared_ptr<Work>> works;
    int failed = 0;
    for (int i = 0; i < 10; ++i) {
      const int64_t numel = odd && i == 4 ? 1999 : 2000;
      try {
        works.push_back(comm->allreduce_async(TensorView::of(x[i].data(), numel)));
      } catch (const MismatchError&) {
        ++failed;  // poisoned already: this and every later issue raise
      }
    }
    EXPECT_EQ(works.size() + failed, 10u);
    const auto start = Clock::now();
    for (size_t i = 0; i < works.size(); ++i) {
      try {
        works[i]->wait();
        EXPECT_LT(i, 4) << "call " << i << " completed although it comes after the mismatched call";
      } catch (const MismatchError& e) {
        ++failed;
      }
    }
    EXPECT_GE(failed, 6);
    EXPECT_LT(seconds_since(start), 10.0);
    EXPECT_THROW(comm->barrier(), MismatchError);  // poisoned, with the original class
  });
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// A stalled peer (it issues three of the ten calls, then stops calling): every
// outstanding wait raises TimeoutError at the deadline, not later. (Rank 0 may
// fuse all ten; the stalled rank then times out waiting for its own calls.)
TEST(Async, StalledPeerTimesOutEveryOutstandingWait) {
  const auto errors = testing::run_ranks_owning(
      2,
      [](std::unique_ptr<Communicator>& comm) {
        std::vector<std::vector<float>> x(10, std::vector<float>(100, 1.0f));
        const int issued = comm->rank() == 1 ? 3 : 10;
        std::vector<std::shared_ptr<Work>> works;
        for (int i = 0; i < issued; ++i) works.push_back(comm->allreduce_async(TensorView::of(x[i].data(), 100)));
        const auto start = Clock::now();
        int timed_out = 0;
        for (int i = 0; i < issued; ++i) {
          try {
            works[i]->wait();
            EXPECT_LT(i, 3);
          } catch (const TimeoutError&) {
            ++timed_out;
          }
        }
        if (comm->rank() == 0) EXPECT_GE(timed_out, 7);
        EXPECT_LT(seconds_since(start), 10.0);
      },
      milliseconds(1000));
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// Destroying a communicator with work outstanding fails that work on this rank
// (InvalidArgument naming it) and returns promptly; the peer, which goes on
// calling, gets PeerFailure instead of waiting for its deadline. Work handles
// outlive the communicator.
TEST(Async, DestroyWithWorkOutstandingFailsItPromptlyEverywhere) {
  std::vector<std::shared_ptr<Work>> orphans;
  const auto errors = testing::run_ranks_owning(
      2,
      [&](std::unique_ptr<Communicator>& comm) {
        std::vector<std::vector<float>> x(10, std::vector<float>(50000, 1.0f));
        if (comm->rank() == 0) {
          for (int i = 0; i < 10; ++i) orphans.push_back(comm->allreduce_async(TensorView::of(x[i].data(), 50000)));
          const auto start = Clock::now();
          comm.reset();
          EXPECT_LT(seconds_since(start), 2.0);
          for (auto& w : orphans) {
            EXPECT_TRUE(w->is_completed());
            try {
              w->wait();
              ADD_FAILURE() << "a call completed although rank 1 never issued it";
            } catch (const InvalidArgument& e) {
              EXPECT_NE(std::string(e.what()).find("destroyed"), std::string::npos) << e.what();
            }
          }
          return;
        }
        std::this_thread::sleep_for(milliseconds(300));  // rank 0 is gone by now
        const auto start = Clock::now();
        EXPECT_THROW(comm->allreduce(TensorView::of(x[0].data(), 50000)), PeerFailure);
        EXPECT_LT(seconds_since(start), 10.0);
      },
      std::chrono::seconds(30));
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// save_state after async calls sees them all: the same bytes as after the same
// calls made blocking (fusion off, so that the compressor runs call by call).
TEST(Async, SaveStateWaitsForEveryCallIssuedBeforeIt) {
  testing::ScopedEnv no_fusion("GRADCOMM_FUSION_BYTES", "0");
  std::vector<std::vector<uint8_t>> saved(2 * 2);
  for (const bool async : {true, false}) {
    testing::run_ranks(2, [&](Communicator& comm) {
      std::vector<std::vector<float>> g(5, std::vector<float>(3000));
      std::vector<std::shared_ptr<Work>> works;
      for (int i = 0; i < 5; ++i) {
        for (int j = 0; j < 3000; ++j) g[i][j] = std::sin(static_cast<float>(i * 3000 + j + comm.rank()));
        auto t = TensorView::of(g[i].data(), 3000);
        if (async) {
          works.push_back(comm.allreduce_async(t, ReduceOp::kSum, {"topk:ratio=0.01", fmt::format("g{}", i % 2)}));
        } else {
          comm.allreduce(t, ReduceOp::kSum, {"topk:ratio=0.01", fmt::format("g{}", i % 2)});
        }
      }
      saved[(async ? 0 : 2) + comm.rank()] = comm.save_state();
      for (auto& w : works) w->wait();
    });
  }
  EXPECT_EQ(saved[0], saved[2]);
  EXPECT_EQ(saved[1], saved[3]);
}

// Several threads may issue on one communicator, one after another: a thread
// whose calls are all done (waited on) hands over to the next (engine.h,
// "Issuing threads").
TEST(Async, HandingOverBetweenThreadsAfterWaitingIsSafe) {
  testing::run_ranks(2, [](Communicator& comm) {
    std::vector<float> a(100, 1.0f), b(100, 2.0f), c(100, 3.0f);
    std::thread ta([&] { comm.allreduce_async(TensorView::of(a.data(), 100))->wait(); });
    ta.join();
    std::thread tb([&] {
      auto w = comm.allreduce_async(TensorView::of(b.data(), 100));
      w->wait();
    });
    tb.join();
    comm.allreduce(TensorView::of(c.data(), 100));  // and back to the main thread
    EXPECT_EQ(a[0], 2.0f);
    EXPECT_EQ(b[0], 4.0f);
    EXPECT_EQ(c[0], 6.0f);
  });
}

// A thread issuing while another thread's call is still outstanding is refused at
// once, naming both threads, and every rank's outstanding call fails with it: no
// call pairs with another thread's call on the other rank.
TEST(Async, AThreadIssuingWhileAnotherThreadsCallIsOutstandingIsRefusedOnEveryRank) {
  std::atomic<bool> refused{false};
  std::string rank0_error, rank1_error, refusal;
  const auto errors = testing::run_ranks_collect(2, [&](Communicator& comm) {
    std::vector<float> a(100, 1.0f), b(100, 2.0f);
    if (comm.rank() == 0) {
      // Issues only once rank 1 has refused, so its call cannot have completed.
      while (!refused.load()) std::this_thread::sleep_for(milliseconds(1));
      try {
        comm.allreduce(TensorView::of(a.data(), 100));
      } catch (const InvalidArgument& e) {
        rank0_error = e.what();
      }
      return;
    }
    auto wa = comm.allreduce_async(TensorView::of(a.data(), 100));  // outstanding: rank 0 has not issued
    std::thread tb([&] {
      try {
        comm.allreduce_async(TensorView::of(b.data(), 100));
      } catch (const InvalidArgument& e) {
        refusal = e.what();
      }
    });
    tb.join();
    refused.store(true);
    try {
      wa->wait();
    } catch (const InvalidArgument& e) {
      rank1_error = e.what();
    }
  });
  for (const auto& e : errors) EXPECT_FALSE(e);
  EXPECT_NE(refusal.find("allreduce issued on thread"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("1 call(s) that thread"), std::string::npos) << refusal;
  EXPECT_NE(rank1_error.find("issued on thread"), std::string::npos) << rank1_error;
  EXPECT_NE(rank0_error.find("rank 1 reported"), std::string::npos) << rank0_error;
  EXPECT_NE(rank0_error.find("issued on thread"), std::string::npos) << rank0_error;
}

// Local calls (save_state here) do not pair across ranks: any thread may make them.
TEST(Async, LocalCallsFromAnotherThreadAreNotRefused) {
  testing::run_ranks(2, [](Communicator& comm) {
    std::vector<float> a(1000, 1.0f);
    CompressOptions options;
    options.compressor = "topk:ratio=0.1";
    options.key = "w";
    auto w = comm.allreduce_async(TensorView::of(a.data(), 1000), ReduceOp::kSum, options);
    std::vector<uint8_t> state;
    std::thread saver([&] { state = comm.save_state(); });
    saver.join();
    w->wait();
    EXPECT_FALSE(state.empty());
  });
}

}  // namespace
}  // namespace gradcomm
