// The host logic of the CUDA paths, tested without a GPU: the NCCL-or-staging
// decision from the ranks' device records, the staging
// chunks, and the deadline loop every GPU wait goes through (with fakes).
#include <gtest/gtest.h>

#include <algorithm>
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
