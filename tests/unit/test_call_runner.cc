// The call runner's bookkeeping (src/call_runner.h), seen from outside: a key takes
// exactly one step per call that ran, whatever path it took (compressed, dense in its
// warm-up, fused with others, a reduce-scatter, compressor=auto), and none for a call
// that failed; auto's review is a numbered call of its own, scheduled before the call.
// The expected steps are counted from the calls the test makes, and read back through
// save_state (the state every rank would restore), not from the runner.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "call_runner.h"
#include "state.h"
#include "test_util.h"

namespace gradcomm {
namespace {

using testing::run_ranks;
using testing::run_ranks_collect;
using testing::ScopedEnv;

uint64_t step_of(Communicator& comm, const std::string& key) {
  const detail::CompressionState state = detail::parse_state(comm.save_state(), comm.rank(), comm.size());
  const auto it = state.keys.find(key);
  return it == state.keys.end() ? 0 : it->second.step;
}

uint64_t next_seq(Communicator& comm) {
  uint64_t seq = 0;
  comm.impl().run_local([&] { seq = comm.impl().runner().next_seq(); });
  return seq;
}

CompressOptions keyed(const std::string& spec, const std::string& key) {
  CompressOptions o;
  o.compressor = spec;
  o.key = key;
  return o;
}

TEST(CallRunner, EveryPathTakesOneStepPerCall) {
  ScopedEnv fusion("GRADCOMM_FUSION_BYTES", "4M");
  ScopedEnv cycle("GRADCOMM_CYCLE_MS", "5000");  // rank 0 holds a group open until it is waited on
  run_ranks(2, [](Communicator& comm) {
    std::vector<float> a(1000, 1.0f), b(1000, 2.0f), big(300000, 1.0f), in(2000, 1.0f), out(1000);
    // Alone, compressed; then two steps of warm-up (dense) and one compressed.
    comm.allreduce(TensorView::of(big.data(), static_cast<int64_t>(big.size())), ReduceOp::kSum,
                   keyed("topk:ratio=0.01", "alone"));
    for (int i = 0; i < 3; ++i) {
      comm.allreduce(TensorView::of(a.data(), 1000), ReduceOp::kSum, keyed("quant:bits=4,warmup=2", "warm"));
    }
    // Fused: two keys issued back to back, waited on together, three times.
    const uint64_t fused_before = comm.stats().fused_calls;
    for (int i = 0; i < 3; ++i) {
      auto w1 = comm.allreduce_async(TensorView::of(a.data(), 1000), ReduceOp::kSum, keyed("quant:bits=8", "f1"));
      auto w2 = comm.allreduce_async(TensorView::of(b.data(), 1000), ReduceOp::kSum, keyed("quant:bits=8", "f2"));
      w2->wait();
      w1->wait();
    }
    // A compressed reduce-scatter, twice; a dense call binds no key.
    for (int i = 0; i < 2; ++i) {
      comm.reduce_scatter(TensorView::of(in.data(), 2000), TensorView::of(out.data(), 1000), ReduceOp::kSum, keyed("quant:bits=4", "rs"));
    }
    comm.allreduce(TensorView::of(a.data(), 1000), ReduceOp::kSum, keyed("none", "dense"));

    EXPECT_EQ(step_of(comm, "alone"), 1u);
    EXPECT_EQ(step_of(comm, "warm"), 3u);
    EXPECT_EQ(step_of(comm, "f1"), 3u);
    EXPECT_EQ(step_of(comm, "f2"), 3u);
    EXPECT_GT(comm.stats().fused_calls, fused_before) << "the f1/f2 calls never fused: the fused path went untested";
    EXPECT_EQ(step_of(comm, "rs"), 2u);
    EXPECT_EQ(step_of(comm, "dense"), 0u);
  });
}

TEST(CallRunner, AutoReviewIsANumberedCallOfItsOwnBeforeTheCall) {
  run_ranks(2, [](Communicator& comm) {
    std::vector<float> g(4096, 1.0f);
    const uint64_t seq0 = next_seq(comm);
    const uint64_t ops0 = comm.stats().ops;
    comm.allreduce(TensorView::of(g.data(), 4096), ReduceOp::kAvg, keyed("auto", "a"));  // first call: a review
    EXPECT_EQ(next_seq(comm), seq0 + 2) << "the review and the call, one number each";
    EXPECT_EQ(comm.stats().ops, ops0 + 1) << "the review is internal: Stats::ops counts the user's call";
    EXPECT_EQ(step_of(comm, "a"), 1u);
    comm.allreduce(TensorView::of(g.data(), 4096), ReduceOp::kAvg, keyed("auto", "a"));  // not due: no review
    EXPECT_EQ(next_seq(comm), seq0 + 3);
    EXPECT_EQ(step_of(comm, "a"), 2u);
  });
}

TEST(CallRunner, AFailedCallAdvancesNoKey) {
  const auto errors = run_ranks_collect(2, [](Communicator& comm) {
    std::vector<float> g(2000, 1.0f);
    comm.allreduce(TensorView::of(g.data(), 1000), ReduceOp::kSum, keyed("quant:bits=4", "k"));
    // The second call differs between the ranks (the key's other tensor sizes are refused
    // at issue, so another key): the header check fails it on both.
    const int64_t n = comm.rank() == 0 ? 1000 : 2000;
    const std::string key = comm.rank() == 0 ? "k" : "other";
    EXPECT_THROW(comm.allreduce(TensorView::of(g.data(), n), ReduceOp::kSum, keyed("quant:bits=4", key)),
                 MismatchError);
    EXPECT_EQ(step_of(comm, "k"), 1u) << "rank " << comm.rank();
    EXPECT_EQ(step_of(comm, "other"), 0u) << "rank " << comm.rank();
  });
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace
}  // namespace gradcomm
