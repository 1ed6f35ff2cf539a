// How the communicator fails: mismatched calls, timeouts, bad arguments, and
// the state it is left in afterwards.
#include <fmt/format.h>

#include <cstring>
#include <regex>

#include "state.h"
#include "test_util.h"

namespace gradcomm {
namespace {

using namespace std::chrono_literals;

// Runs per-rank bodies; returns each rank's error message and code (kInvalidArgument
// stands for "no error" nowhere: ok = empty message).
struct Outcome {
  bool threw = false;
  ErrorCode code{};
  std::string message;
};

std::vector<Outcome> run_outcomes(int n, const std::function<void(Communicator&)>& fn,
                                  std::chrono::milliseconds timeout = 20s) {
  std::vector<Outcome> outcomes(n);
  auto errors = testing::run_ranks_collect(n, fn, timeout);
  for (int r = 0; r < n; ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      outcomes[r] = {true, e.code(), e.what()};
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " threw a non-gradcomm exception: " << e.what();
    }
  }
  return outcomes;
}

void expect_all(const std::vector<Outcome>& outcomes, ErrorCode code, const std::vector<std::string>& must_contain) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    ASSERT_TRUE(outcomes[r].threw) << "rank " << r << " did not raise";
    EXPECT_EQ(outcomes[r].code, code) << "rank " << r << ": " << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find(fmt::format("rank {}:", r)), std::string::npos)
        << "message must name its own rank: " << outcomes[r].message;
    for (const auto& text : must_contain) {
      EXPECT_NE(outcomes[r].message.find(text), std::string::npos)
          << "rank " << r << " message lacks '" << text << "': " << outcomes[r].message;
    }
  }
}

TEST(Mismatch, DifferentNumelRaisesOnEveryRankNamingBothCalls) {
  auto outcomes = run_outcomes(4, [](Communicator& comm) {
    std::vector<float> x(1000);
    comm.allreduce(TensorView::of(x.data(), comm.rank() == 2 ? 999 : 1000));
  });
  expect_all(outcomes, ErrorCode::kMismatch,
             {"allreduce(numel=999, float32, sum, none) #1", "allreduce(numel=1000, float32, sum, none) #1"});
}

TEST(Mismatch, DifferentDtype) {
  auto outcomes = run_outcomes(3, [](Communicator& comm) {
    std::vector<double> x(64);
    TensorView t = TensorView::of(x.data(), 64);
    if (comm.rank() == 0) t.dtype = DType::kInt64;
    comm.allreduce(t);
  });
  expect_all(outcomes, ErrorCode::kMismatch, {"int64", "float64"});
}

TEST(Mismatch, AllreduceVersusAllgather) {
  auto outcomes = run_outcomes(3, [](Communicator& comm) {
    std::vector<float> x(30), out(90);
    if (comm.rank() == 1) {
      comm.allgather(TensorView::of(x.data(), 30), TensorView::of(out.data(), 90));
    } else {
      comm.allreduce(TensorView::of(x.data(), 30));
    }
  });
  expect_all(outcomes, ErrorCode::kMismatch, {"allgather(numel=30, float32) #1", "allreduce(numel=30"});
}

TEST(Mismatch, ReduceScatterVersusAllreduceAndDifferentOps) {
  auto outcomes = run_outcomes(3, [](Communicator& comm) {
    std::vector<float> x(90), out(30);
    if (comm.rank() == 2) {
      comm.reduce_scatter(TensorView::of(x.data(), 90), TensorView::of(out.data(), 30));
    } else {
      comm.allreduce(TensorView::of(x.data(), 90));
    }
  });
  expect_all(outcomes, ErrorCode::kMismatch, {"reduce_scatter(numel=90, float32, sum) #1", "allreduce(numel=90"});
  auto ops = run_outcomes(2, [](Communicator& comm) {
    float x[8] = {}, out[4];
    comm.reduce_scatter(TensorView::of(x, 8), TensorView::of(out, 4), comm.rank() == 0 ? ReduceOp::kMax : ReduceOp::kSum);
  });
  expect_all(ops, ErrorCode::kMismatch, {"reduce_scatter(numel=8, float32, max)", "reduce_scatter(numel=8, float32, sum)"});
}

TEST(Mismatch, DifferentReduceOpAndBroadcastRoot) {
  auto ops = run_outcomes(2, [](Communicator& comm) {
    float x[4] = {};
    comm.allreduce(TensorView::of(x, 4), comm.rank() == 0 ? ReduceOp::kMax : ReduceOp::kSum);
  });
  expect_all(ops, ErrorCode::kMismatch, {"max", "sum"});
  auto roots = run_outcomes(3, [](Communicator& comm) {
    float x[4] = {};
    comm.broadcast(TensorView::of(x, 4), comm.rank() == 2 ? 1 : 0);
  });
  expect_all(roots, ErrorCode::kMismatch, {"root=1", "root=0"});
}

// A rank that skips a call shifts its later calls by one: the first call whose
// signature differs is a mismatch naming both sequence numbers' calls...
TEST(Mismatch, SkippedCallSurfacesAtTheFirstDifferingCall) {
  auto outcomes = run_outcomes(3, [](Communicator& comm) {
    float x[16] = {};
    if (comm.rank() != 1) comm.allreduce(TensorView::of(x, 8));  // rank 1 skips this call
    comm.allreduce(TensorView::of(x, 16));
  });
  expect_all(outcomes, ErrorCode::kMismatch, {"allreduce(numel=16, float32, sum, none) #1",
                                             "allreduce(numel=8, float32, sum, none) #1"});
}

// ...and when the calls look alike, the call left without a partner times out,
// naming its sequence number.
TEST(Timeout, SkippedIdenticalCallTimesOutNamingTheSequenceNumber) {
  auto outcomes = run_outcomes(
      3,
      [](Communicator& comm) {
        float x[8] = {};
        if (comm.rank() != 1) comm.allreduce(TensorView::of(x, 8));
        comm.allreduce(TensorView::of(x, 8));
      },
      700ms);
  for (int r : {0, 2}) {
    ASSERT_TRUE(outcomes[r].threw) << r;
    EXPECT_EQ(outcomes[r].code, ErrorCode::kTimeout) << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find("allreduce(numel=8, float32, sum, none) #2"), std::string::npos)
        << outcomes[r].message;
  }
}

// reduce_scatter's waits have the same deadline: a rank that skips one leaves the others
// with a TimeoutError naming the call, not a hang (dense and compressed).
TEST(Timeout, SkippedReduceScatterTimesOutNamingTheCall) {
  for (const char* spec : {"none", "quant:bits=8"}) {
    auto outcomes = run_outcomes(
        3,
        [spec](Communicator& comm) {
          std::vector<float> x(3 * 4096, 1.0f), out(4096);
          if (comm.rank() != 1) {
            comm.reduce_scatter(TensorView::of(x.data(), 3 * 4096), TensorView::of(out.data(), 4096), ReduceOp::kSum,
                                CompressOptions{spec, "rs", nullptr});
          }
        },
        700ms);
    for (int r : {0, 2}) {
      ASSERT_TRUE(outcomes[r].threw) << spec << " rank " << r;
      EXPECT_EQ(outcomes[r].code, ErrorCode::kTimeout) << outcomes[r].message;
      EXPECT_NE(outcomes[r].message.find("reduce_scatter(numel=12288, float32, sum) #1"), std::string::npos)
          << outcomes[r].message;
    }
  }
}

TEST(Timeout, MissingRankIsATimeoutNamingThePeer) {
  const auto start = detail::Clock::now();
  auto outcomes = run_outcomes(
      3,
      [](Communicator& comm) {
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(2500ms);  // never calls
          return;
        }
        float x[16] = {};
        comm.allreduce(TensorView::of(x, 16));
      },
      800ms);
  const double elapsed = std::chrono::duration<double>(detail::Clock::now() - start).count();
  for (int r : {0, 1}) {
    ASSERT_TRUE(outcomes[r].threw);
    EXPECT_EQ(outcomes[r].code, ErrorCode::kTimeout) << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find("allreduce(numel=16"), std::string::npos) << outcomes[r].message;
    EXPECT_TRUE(std::regex_search(outcomes[r].message, std::regex("timed out|aborted"))) << outcomes[r].message;
  }
  EXPECT_FALSE(outcomes[2].threw);
  EXPECT_LT(elapsed, 10.0);
}

TEST(AfterFailure, EveryCallRaisesTheOriginalError) {
  std::vector<std::string> later(2);
  auto outcomes = run_outcomes(2, [&](Communicator& comm) {
    float x[4] = {};
    try {
      comm.allreduce(TensorView::of(x, comm.rank() == 0 ? 3 : 4));
    } catch (const MismatchError&) {
      try {
        comm.barrier();
      } catch (const MismatchError& e) {
        later[comm.rank()] = e.what();
      }
      throw;
    }
  });
  expect_all(outcomes, ErrorCode::kMismatch, {});
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(later[r].find("unusable after an earlier failure"), std::string::npos) << later[r];
    EXPECT_NE(later[r].find("numel=3"), std::string::npos) << later[r];
  }
}

TEST(InvalidArguments, AreRejectedLocallyAndLeaveTheCommunicatorUsable) {
  testing::run_ranks(2, [](Communicator& comm) {
    float x[4] = {1, 2, 3, 4};
    float out[7];
    EXPECT_THROW(comm.allreduce(TensorView{nullptr, 4, DType::kFloat32, {}}), InvalidArgument);
    EXPECT_THROW(comm.allreduce(TensorView{x, -1, DType::kFloat32, {}}), InvalidArgument);
    EXPECT_THROW(comm.allreduce(TensorView{x, 4, static_cast<DType>(42), {}}), InvalidArgument);
    EXPECT_THROW(comm.allreduce(TensorView::of(x, 4), static_cast<ReduceOp>(9)), InvalidArgument);
    EXPECT_THROW(comm.allgather(TensorView::of(x, 4), TensorView::of(out, 7)), InvalidArgument);
    EXPECT_THROW(comm.reduce_scatter(TensorView::of(out, 7), TensorView::of(x, 4)), InvalidArgument);  // 7 != 2 x 4
    EXPECT_THROW(comm.reduce_scatter(TensorView::of(x, 4), TensorView{out, 2, DType::kInt32, {}}), InvalidArgument);
    EXPECT_THROW(comm.reduce_scatter(TensorView::of(x, 4), TensorView::of(x, 2), static_cast<ReduceOp>(9)),
                 InvalidArgument);
    // The output overlapping the input other than as this rank's segment of it.
    EXPECT_THROW(comm.reduce_scatter(TensorView::of(x, 4), TensorView::of(x + 1 - comm.rank(), 2)), InvalidArgument);
    EXPECT_THROW(comm.broadcast(TensorView::of(x, 4), 2), InvalidArgument);
    EXPECT_THROW(comm.broadcast(TensorView::of(x, 4), -1), InvalidArgument);
    // Unsupported without a GPU; InvalidArgument (host memory labelled CUDA) with one.
    EXPECT_THROW(comm.allreduce(TensorView::of(x, 4, Device{DeviceType::kCuda, 0})), Error);
    try {
      comm.allreduce(TensorView::of(x, 4), ReduceOp::kSum, CompressOptions{"topkk:ratio=0.1", "k", nullptr});
      ADD_FAILURE() << "unknown compressor accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("accepted: none"), std::string::npos) << e.what();
    }
    comm.allreduce(TensorView::of(x, 4));  // still usable, and ranks still agree on the sequence
    EXPECT_EQ(x[3], 8.0f);
  });
}

TEST(State, SaveLoadRoundTripAndValidation) {
  testing::run_ranks(2, [](Communicator& comm) {
    const auto saved = comm.save_state();
    comm.load_state(saved);
    EXPECT_EQ(comm.save_state(), saved);
    auto flipped = saved;
    flipped[flipped.size() / 2] ^= 0x10;
    EXPECT_THROW(comm.load_state(flipped), CorruptPayload);
    EXPECT_THROW(comm.load_state(std::span(saved).first(saved.size() - 1)), CorruptPayload);
    EXPECT_THROW(comm.load_state({}), CorruptPayload);
  });
}

TEST(State, EntriesRoundTripAndRejectCorruption) {
  detail::CompressionState state;
  detail::KeyState a;
  a.step = 17;
  a.numel = 3;
  a.residual.resize(12, 0x42);
  state.keys["fc1.weight"] = a;
  state.keys["bias"] = detail::KeyState{5, DType::kFloat16, 9, {}};
  // A bfloat16 key's residual is float32 (compression_16bit.cc): 4 values, 16 bytes.
  state.keys["bf16"] = detail::KeyState{2, DType::kBFloat16, 4, std::vector<uint8_t>(16, 0x3f)};
  const auto bytes = detail::serialize_state(state, 1, 4);
  const auto back = detail::parse_state(bytes, 1, 4);
  ASSERT_EQ(back.keys.size(), 3u);
  EXPECT_EQ(back.keys.at("bf16").residual, state.keys["bf16"].residual);
  EXPECT_EQ(back.keys.at("fc1.weight").step, 17u);
  EXPECT_EQ(back.keys.at("fc1.weight").residual, a.residual);
  EXPECT_EQ(back.keys.at("bias").dtype, DType::kFloat16);
  EXPECT_THROW(detail::parse_state(bytes, 0, 4), InvalidArgument);  // another rank's state
  // Every truncation and every single-bit flip is caught.
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_THROW(detail::parse_state(std::span(bytes).first(cut), 1, 4), CorruptPayload) << cut;
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    auto copy = bytes;
    copy[i] ^= 0x01;
    EXPECT_ANY_THROW(detail::parse_state(copy, 1, 4)) << i;
  }
}

}  // namespace
}  // namespace gradcomm
