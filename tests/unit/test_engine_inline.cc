// Calls on the caller's thread (src/engine.h): ranks as threads over the in-process
// transport, sharing one node segment as a one-host job's ranks do. A small dense
// blocking call issued with nothing queued runs on the issuing thread (Stats::inline_ops),
// an async one queues and returns at once; the engine and a second thread's local calls
// interleave with such calls without a race (this file runs under TSan:
// scripts/test-sanitizers.sh).
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm_impl.h"
#include "engine.h"
#include "segment_ranks.h"
#include "test_util.h"

namespace gradcomm::detail {
namespace {

using gradcomm::testing::ScopedEnv;

// 100 rounds: a small allreduce (inline where `expect_inline`: counted), a broadcast from a
// rotating root (likewise), a small async allreduce (queued: not counted), and every 25th
// round a 256 KiB allreduce (past the inline limit: the engine's). Results exact.
void small_calls(int r, int n, Communicator& comm, bool expect_inline) {
  for (int i = 0; i < 100; ++i) {
    std::vector<float> x(static_cast<size_t>(1 + i % 64), static_cast<float>(r + i));
    const uint64_t before = comm.stats().inline_ops;
    comm.allreduce(TensorView::of(x.data(), static_cast<int64_t>(x.size())));
    if (expect_inline) EXPECT_EQ(comm.stats().inline_ops, before + 1) << "call " << i;
    std::vector<float> y(static_cast<size_t>(1 + i % 8), 1.0f);
    comm.allreduce_async(TensorView::of(y.data(), static_cast<int64_t>(y.size())))->wait();
    for (float v : y) ASSERT_EQ(v, static_cast<float>(n)) << "async round " << i;
    const float want = static_cast<float>(n * i + n * (n - 1) / 2);
    for (float v : x) ASSERT_EQ(v, want) << "round " << i;
    std::vector<int32_t> b(8, r == i % n ? i : -1);
    comm.broadcast(TensorView::of(b.data(), 8), i % n);
    for (int32_t v : b) ASSERT_EQ(v, i);
    if (i % 25 == 0) {
      std::vector<int32_t> big(int64_t{1} << 16, 1);
      comm.allreduce(TensorView::of(big.data(), static_cast<int64_t>(big.size())));
      for (int32_t v : big) ASSERT_EQ(v, n);
    }
  }
}

TEST(EngineInline, SmallBlockingCallsRunOnTheCallersThreadExactly) {
  for (int n : {2, 3}) {
    run_on_segment(n, [&](int r, Communicator& comm) {
      small_calls(r, n, comm, true);
      const Stats stats = comm.stats();
      EXPECT_EQ(stats.inline_ops, 200u);  // the allreduces and broadcasts; not the async or 256 KiB calls
      EXPECT_GE(stats.node_shm_ops, 304u);
    });
  }
}

// A second thread of each rank keeps issuing local calls (synchronize: queued on the
// engine, run there in issue order) while the first issues small collectives, which then
// sometimes queue behind them and sometimes run inline: results stay exact.
TEST(EngineInline, LocalCallsOfAnotherThreadInterleave) {
  run_on_segment(2, [&](int r, Communicator& comm) {
    std::atomic<bool> stop{false};
    std::thread local([&] {
      while (!stop.load()) comm.synchronize();
    });
    small_calls(r, 2, comm, false);
    stop = true;
    local.join();
  });
}

// GRADCOMM_SHM_INLINE_BYTES=0: every call goes through the engine; the same results.
TEST(EngineInline, DisabledByTheLimitSameResults) {
  ScopedEnv limit("GRADCOMM_SHM_INLINE_BYTES", "0");
  if (Engine::inline_bytes() != 0) GTEST_SKIP() << "the limit was read before this test (once per process)";
  run_on_segment(2, [&](int r, Communicator& comm) {
    small_calls(r, 2, comm, false);
    EXPECT_EQ(comm.stats().inline_ops, 0u);
  });
}

}  // namespace
}  // namespace gradcomm::detail
