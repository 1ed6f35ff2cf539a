// The host logic of the CUDA paths, tested without a GPU: the NCCL-or-staging
// decision from the ranks' device records, the NCCL ring allreduce's schedule
// (executed here on host arrays, with every reduce deferred as long as the
// schedule's event waits allow, as a slow side stream would), the staging
// chunks, and the deadline loop every GPU wait goes through (with fakes).
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <numeric>
#include <string>
#include <vector>

#include "gpu_plan.h"
#include "gradcomm/errors.h"
#include "transport/nccl/poll_wait.h"

namespace gradcomm::detail {
namespace {

GpuRankRecord record_on(uint8_t gpu, int device) {
  GpuRankRecord r;
  r.uuid.fill(0x11);
  r.uuid[15] = gpu;
  r.device = device;
  return r;
}

// ---- path choice --------------------------------------------------------------------------

TEST(GpuPathChoice, EveryRankOnItsOwnGpuTakesNccl) {
  const std::vector<GpuRankRecord> ranks{record_on(1, 0), record_on(2, 1), record_on(3, 2)};
  EXPECT_EQ(choose_gpu_path("auto", ranks).path, GpuPath::kNccl);
  EXPECT_EQ(choose_gpu_path("nccl", ranks).path, GpuPath::kNccl);
  EXPECT_EQ(choose_gpu_path("auto", {record_on(7, 0)}).path, GpuPath::kNccl);  // N = 1
}

TEST(GpuPathChoice, TwoRanksOnOneGpuStageUnderAuto) {
  const std::vector<GpuRankRecord> ranks{record_on(1, 0), record_on(2, 1), record_on(1, 0)};
  const GpuPathChoice choice = choose_gpu_path("auto", ranks);
  EXPECT_EQ(choice.path, GpuPath::kStaging);
  EXPECT_NE(choice.reason.find("ranks 0 and 2 share GPU"), std::string::npos) << choice.reason;
}

TEST(GpuPathChoice, SameUuidUnderDifferentIndicesIsStillOneGpu) {
  // CUDA_VISIBLE_DEVICES can give one physical GPU different indices in two processes.
  const std::vector<GpuRankRecord> ranks{record_on(4, 0), record_on(4, 1)};
  EXPECT_EQ(choose_gpu_path("auto", ranks).path, GpuPath::kStaging);
}

TEST(GpuPathChoice, NcclDemandedOnASharedGpuIsUnsupportedNamingTheRanks) {
  const std::vector<GpuRankRecord> ranks{record_on(1, 0), record_on(5, 0), record_on(5, 0)};
  try {
    choose_gpu_path("nccl", ranks);
    FAIL() << "expected Unsupported";
  } catch (const Unsupported& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("ranks 1 and 2 share GPU GPU-11111111-1111-1111-1111-111111111105"), std::string::npos)
        << what;
  }
}

TEST(GpuPathChoice, UcxAlwaysStagesAndUnknownPreferenceIsRejected) {
  EXPECT_EQ(choose_gpu_path("ucx", {record_on(1, 0), record_on(2, 1)}).path, GpuPath::kStaging);
  EXPECT_THROW(choose_gpu_path("gloo", {record_on(1, 0)}), InvalidArgument);
}

TEST(GpuRankRecord, RoundTripsAndRejectsWrongLength) {
  GpuRankRecord r = record_on(9, -3);
  r.flags = 0xA1B2C3D4u;
  for (size_t i = 0; i < r.unique_id.size(); ++i) r.unique_id[i] = static_cast<uint8_t>(i * 7);
  const auto bytes = r.serialize();
  const GpuRankRecord back = GpuRankRecord::parse(bytes);
  EXPECT_EQ(back.uuid, r.uuid);
  EXPECT_EQ(back.device, -3);
  EXPECT_EQ(back.flags, 0xA1B2C3D4u);
  EXPECT_EQ(back.unique_id, r.unique_id);
  EXPECT_THROW(GpuRankRecord::parse(std::span(bytes.data(), bytes.size() - 1)), CorruptPayload);
}

// ---- the NCCL ring schedule, executed on the host ---------------------------------------------

// One rank of the simulation: its data, scratch slots, and the reduces its side
// stream has been given but not yet run (a FIFO, like a stream).
struct SimRank {
  std::vector<int64_t> data, scratch;
  std::vector<int> folds_dividing;  // per element: how many "last step" folds touched it
  std::deque<int64_t> pending;
  std::vector<int64_t> event_latest;  // per event slot: the unit whose reduce last recorded it
};

// Runs the plan on N ranks in lockstep (group u on every rank at once, as NCCL
// pairs a send with the matching receive). A reduce runs only when a later group
// waits for it or at the very end, so a missing wait shows up as a wrong sum.
void simulate_ring(int n, int64_t numel, int64_t chunk_elems, int max_chunks, int slots) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " numel=" << numel << " chunk=" << chunk_elems
                                    << " max_chunks=" << max_chunks << " slots=" << slots);
  std::vector<GpuRingPlan> plans;
  std::vector<SimRank> ranks(n);
  for (int r = 0; r < n; ++r) {
    plans.emplace_back(n, r, numel, chunk_elems, max_chunks, slots);
    SimRank& s = ranks[r];
    s.data.resize(numel);
    for (int64_t i = 0; i < numel; ++i) s.data[i] = (3 * r + i) % 13 - 6;
    s.scratch.assign(static_cast<size_t>(plans[r].slot_elems() * plans[r].slots()), 0);
    s.folds_dividing.assign(numel, 0);
    s.event_latest.assign(plans[r].event_slots(), -1);
  }
  const GpuRingPlan& p0 = plans[0];
  if (n == 1) {
    EXPECT_EQ(p0.units(), 0);
    return;
  }
  EXPECT_LE(p0.chunks(), max_chunks);
  auto run_reduce = [&](int r, int64_t v) {
    const RingUnit x = plans[r].unit(v);
    SimRank& s = ranks[r];
    for (int64_t i = x.recv_begin; i < x.recv_end; ++i) {
      s.data[i] += s.scratch[x.slot * plans[r].slot_elems() + (i - x.recv_begin)];
      if (x.last_step) s.folds_dividing[i] += 1;
    }
  };
  auto run_until = [&](int r, int64_t v) {  // the side stream reaches v's "done" event
    SimRank& s = ranks[r];
    ASSERT_EQ(s.event_latest[v % plans[r].event_slots()], v) << "event slot of unit " << v << " was re-recorded";
    while (!s.pending.empty() && s.pending.front() <= v) {
      run_reduce(r, s.pending.front());
      s.pending.pop_front();
    }
  };

  for (int64_t u = 0; u < p0.units(); ++u) {
    std::vector<std::vector<int64_t>> messages(n);
    for (int r = 0; r < n; ++r) {
      const RingUnit x = plans[r].unit(u);
      if (x.send_waits_for >= 0) run_until(r, x.send_waits_for);
      if (x.slot_waits_for >= 0) run_until(r, x.slot_waits_for);
      messages[r].assign(ranks[r].data.begin() + x.send_begin, ranks[r].data.begin() + x.send_end);
    }
    for (int r = 0; r < n; ++r) {
      const RingUnit x = plans[r].unit(u);
      const std::vector<int64_t>& in = messages[(r + n - 1) % n];
      ASSERT_EQ(static_cast<int64_t>(in.size()), x.recv_end - x.recv_begin) << "unit " << u << " rank " << r;
      SimRank& s = ranks[r];
      if (x.reduce) {
        ASSERT_GE(x.slot, 0);
        ASSERT_LE(static_cast<int64_t>(in.size()), plans[r].slot_elems());
        std::copy(in.begin(), in.end(), s.scratch.begin() + x.slot * plans[r].slot_elems());
        s.pending.push_back(u);
        s.event_latest[x.event_slot] = u;
      } else {
        std::copy(in.begin(), in.end(), s.data.begin() + x.recv_begin);
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    while (!ranks[r].pending.empty()) {
      run_reduce(r, ranks[r].pending.front());
      ranks[r].pending.pop_front();
    }
  }
  for (int64_t i = 0; i < numel; ++i) {
    int64_t sum = 0;
    int dividing = 0;
    for (int r = 0; r < n; ++r) {
      sum += (3 * r + i) % 13 - 6;
      dividing += ranks[r].folds_dividing[i];
    }
    for (int r = 0; r < n; ++r) ASSERT_EQ(ranks[r].data[i], sum) << "rank " << r << " element " << i;
    // An average divides each element exactly once, on its owner.
    ASSERT_EQ(dividing, 1) << "element " << i;
  }
}

TEST(GpuRingPlan, SumsCorrectlyWithDeferredReducesForEveryShape) {
  for (int n = 1; n <= 8; ++n) {
    for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{n - 1}, int64_t{n}, int64_t{7}, int64_t{1000},
                          int64_t{4099}}) {
      for (int64_t chunk : {1, 3, 64, 1 << 20}) {
        for (int slots : {1, 2, 4}) simulate_ring(n, numel, chunk, 16, slots);
      }
    }
  }
}

TEST(GpuRingPlan, ChunkCountIsCappedSoTheEventPoolStaysSmall) {
  const GpuRingPlan plan(4, 1, int64_t{1} << 30, 1, 16, 4);
  EXPECT_EQ(plan.chunks(), 16);
  EXPECT_EQ(plan.event_slots(), 17);
  EXPECT_EQ(plan.units(), 2 * 3 * 16);
  simulate_ring(3, 100000, 1, 5, 2);  // cap binds: 5 chunks of ~6667 elements
}

TEST(GpuRingPlan, SendRangeOfEveryUnitIsTheNextRanksReceiveRange) {
  for (int n : {2, 3, 5}) {
    for (int64_t numel : {int64_t{2}, int64_t{13}, int64_t{999}}) {
      for (int r = 0; r < n; ++r) {
        const GpuRingPlan mine(n, r, numel, 4, 16, 4), next(n, (r + 1) % n, numel, 4, 16, 4);
        for (int64_t u = 0; u < mine.units(); ++u) {
          EXPECT_EQ(mine.unit(u).send_begin, next.unit(u).recv_begin);
          EXPECT_EQ(mine.unit(u).send_end, next.unit(u).recv_end);
        }
      }
    }
  }
}

// ---- staging chunks -----------------------------------------------------------------------------

TEST(StagingChunks, CoverTheTensorInOrderWithinTheChunkSize) {
  for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{1023}, int64_t{1024}, int64_t{1025}, int64_t{100000}}) {
    for (int64_t elem : {1, 2, 4, 8}) {
      const auto chunks = staging_chunks(numel, elem, 4096);
      int64_t next = 0;
      for (const auto& [b, e] : chunks) {
        EXPECT_EQ(b, next);
        EXPECT_GT(e, b);
        EXPECT_LE((e - b) * elem, 4096);
        next = e;
      }
      EXPECT_EQ(next, numel);
    }
  }
  EXPECT_EQ(staging_chunks(10, 8, 3).size(), 10u);  // a chunk smaller than an element still moves one
}

// ---- the deadline loop ---------------------------------------------------------------------------

TEST(PollWithDeadline, ReturnsWhenDoneAndChecksBeforeEveryPoll) {
  int polls = 0, checks = 0;
  const int used = poll_with_deadline([&] { return ++polls == 100; }, [&] { ++checks; },
                                      Deadline::after(std::chrono::seconds(30)), [] { FAIL() << "timed out"; });
  EXPECT_EQ(used, 100);
  EXPECT_EQ(polls, 100);
  EXPECT_EQ(checks, 100);
}

TEST(PollWithDeadline, AnErrorFromTheCheckEndsTheWait) {
  int polls = 0;
  EXPECT_THROW(poll_with_deadline([&] { return ++polls > 1000000; },
                                  [&] {
                                    if (polls == 5) throw PeerFailure("nccl: rank 1 died");
                                  },
                                  Deadline::after(std::chrono::seconds(30)), [] {}),
               PeerFailure);
  EXPECT_EQ(polls, 5);
}

TEST(PollWithDeadline, TimesOutNearTheDeadlineWithoutSpinningHard) {
  const auto start = Clock::now();
  int polls = 0;
  EXPECT_THROW(poll_with_deadline([&] { ++polls; return false; }, [] {},
                                  Deadline::after(std::chrono::milliseconds(200)),
                                  [] { throw TimeoutError("gpu work did not complete"); }),
               TimeoutError);
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 2.0);
  // 64 spins, then sleeps of 20 us doubling to 1 ms: a few hundred polls, not millions.
  EXPECT_LT(polls, 2000);
}

}  // namespace
}  // namespace gradcomm::detail
