// Non-blocking calls across real processes over UCX (async_worker.cc under
// gradcomm-run): with ten calls in flight, a killed, stopped or mismatched peer
// makes every wait() raise the right error within seconds; destroying a
// communicator with work outstanding returns promptly and fails the peers' calls;
// and a rank that returns from a call and blocks elsewhere never starves its
// peers, with small socket buffers too (UCX_TCP_SNDBUF=16K).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "multiproc/job.h"

namespace {

using gradcomm::testing::Job;

Job run_job(int n, const std::string& args, const std::string& env = "", int limit_s = 150) {
  return gradcomm::testing::run_command(fmt::format("{} timeout -k 5 {} {} -n {} --grace 5 -- {} {} 2>&1", env, limit_s,
                                                    GRADCOMM_RUN_PATH, n, ASYNC_WORKER_PATH, args));
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Every survivor: ten outcomes, each ok (completed before the failure) or the
// expected error class, at least one of them the error, all within `bound_s`.
void expect_survivors(const Job& job, int survivors, const std::string& error, double bound_s) {
  int reported = 0;
  for (const auto& r : job.results) {
    if (!r.count("outcomes")) continue;
    ++reported;
    const auto outcomes = split(r.at("outcomes"));
    ASSERT_EQ(outcomes.size(), 10u) << job.output;
    int failed = 0;
    for (const auto& o : outcomes) {
      EXPECT_TRUE(o == "ok" || o == error) << "rank " << r.at("rank") << ": " << o << "\n" << job.output;
      failed += o == error;
    }
    EXPECT_GT(failed, 0) << "rank " << r.at("rank") << "\n" << job.output;
    EXPECT_LT(std::stod(r.at("waits_s")), bound_s) << "rank " << r.at("rank") << "\n" << job.output;
  }
  EXPECT_EQ(reported, survivors) << job.output;
  for (const auto& r : job.results) {
    if (r.count("destroy_s")) EXPECT_LT(std::stod(r.at("destroy_s")), 2.0) << job.output;
  }
}

TEST(MultiprocAsync, KilledPeerWithTenCallsOutstandingFailsEveryWaitWithPeerFailure) {
  const Job job = run_job(3, "fault10 sigkill 1 60000");
  expect_survivors(job, 2, "PeerFailure", 10.0);
}

TEST(MultiprocAsync, StoppedPeerWithTenCallsOutstandingTimesOutEveryWait) {
  // A 2 s deadline: every survivor's waits end in TimeoutError well within 10 s.
  const Job job = run_job(3, "fault10 sigstop 2 2000");
  expect_survivors(job, 2, "TimeoutError", 10.0);
}

TEST(MultiprocAsync, MismatchWithTenCallsOutstandingFailsEveryRanksWaits) {
  const Job job = run_job(3, "fault10 mismatch 1 60000");
  expect_survivors(job, 3, "MismatchError", 10.0);
}

TEST(MultiprocAsync, DestroyWithWorkOutstandingReturnsPromptlyAndFailsThePeers) {
  const Job job = run_job(3, "destroy10");
  int peers = 0;
  for (const auto& r : job.results) {
    if (!r.count("outcomes")) continue;
    const auto outcomes = split(r.at("outcomes"));
    ASSERT_EQ(outcomes.size(), 10u) << job.output;
    if (r.at("rank") == "0") {
      EXPECT_LT(std::stod(r.at("destroy_s")), 2.0) << job.output;
      for (const auto& o : outcomes) EXPECT_TRUE(o == "ok" || o == "InvalidArgument") << o << "\n" << job.output;
    } else {
      ++peers;
      for (const auto& o : outcomes) EXPECT_TRUE(o == "ok" || o == "PeerFailure") << o << "\n" << job.output;
      EXPECT_LT(std::stod(r.at("waits_s")), 10.0) << job.output;
    }
  }
  EXPECT_EQ(peers, 2) << job.output;
}

// Issue [H]/[K]: rank 0 returns from each call and blocks outside gradcomm until
// the others confirm theirs; with 16K socket buffers a call's last bytes can still
// sit in rank 0's UCX send queue when it returns. The engine keeps driving the
// transport, so the others finish. Cells where this starved the blocking library.
struct StarveCase {
  int n;
  std::string spec;
  int64_t bytes;
  int reps;
};

void PrintTo(const StarveCase& c, std::ostream* os) { *os << "N=" << c.n << " " << c.spec << " " << c.bytes; }

class MultiprocStarve : public ::testing::TestWithParam<StarveCase> {};

TEST_P(MultiprocStarve, ARankBlockedElsewhereNeverStarvesItsPeers) {
  const StarveCase& c = GetParam();
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("gradcomm-starve-{}-{}", getpid(), rand());
  std::filesystem::create_directories(dir);
  // TCP: on one host the ranks would otherwise talk over shared memory, where socket
  // buffers play no part.
  const Job job = run_job(c.n, fmt::format("starve {} {} {} {}", c.spec, c.bytes, c.reps, dir.string()),
                          "UCX_TLS=tcp,self UCX_TCP_SNDBUF=16K");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(job.exit_code, 0) << job.output;
  int done = 0;
  for (const auto& r : job.results) {
    if (!r.count("reps")) continue;
    ++done;
    EXPECT_EQ(r.at("reps"), std::to_string(c.reps));
    EXPECT_LT(std::stod(r.at("slowest_call_s")), 10.0) << job.output;
  }
  EXPECT_EQ(done, c.n) << job.output;
}

std::vector<StarveCase> starve_cases() {
  std::vector<StarveCase> cases;
  for (int n : {2, 3, 4}) {
    cases.push_back({n, "none", 64 << 10, 100});
    cases.push_back({n, "fp16", 1 << 20, 100});
    cases.push_back({n, "quant:bits=4", 1 << 20, 100});
    cases.push_back({n, "topk:ratio=0.01", 16 << 20, 20});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Ucx, MultiprocStarve, ::testing::ValuesIn(starve_cases()),
                         [](const auto& info) { return std::to_string(info.index); });

// Issue [N], item 5: N = 4, a 64 MB dense allreduce, UCX_TCP_SNDBUF=16K, and rank 0
// sleeping outside gradcomm after each call. Ranks 2 and 3 stayed in the call for
// 3.9-4.0 s. The cause was not rank 0's sleep: every rank's call took 2.9-4.1 s,
// because a 64K receive buffer (4x the send buffer, the transport's old rule) let
// TCP stall on delayed ACKs; with 2x each call takes 0.2-0.5 s. The bound leaves
// room for a loaded machine and the sanitizer builds, and stays below the sleep, so
// a call that waits on the sleeping rank fails it as well as a collapsed one.
TEST(MultiprocLinger, SixtyFourMegabytesOverFourRanksWithSmallSocketBuffersNeverStall) {
  constexpr int kSleepMs = 3000;
  const Job job = run_job(4, fmt::format("linger none {} 3 {}", int64_t{64} << 20, kSleepMs),
                          "UCX_TLS=tcp,self UCX_TCP_SNDBUF=16K");
  ASSERT_EQ(job.exit_code, 0) << job.output;
  int done = 0;
  for (const auto& r : job.results) {
    if (!r.count("reps")) continue;
    ++done;
    EXPECT_LT(std::stod(r.at("slowest_call_s")), 2.5) << "rank " << r.at("rank") << "\n" << job.output;
  }
  EXPECT_EQ(done, 4) << job.output;
}

}  // namespace
