// The fault model on the node's shared segment (issue 46, docs/shared-memory.md): ranks of
// one host meet in a shared segment, not the transport, so nothing in UCX sees a peer die
// or stop while the others wait on the segment. A victim killed (SIGKILL) or stopped
// (SIGSTOP) at a random moment during a 64 MiB allreduce loop or a loop of small calls, at
// every rank position, N = 2 and 4 (and the 64 MiB loop on alloc_shared buffers, read in
// place, at N = 2): every other rank raises PeerFailure (killed) or
// TimeoutError (stopped; the call's deadline is kTimeoutMs) naming the victim within the
// bound, and nothing is left in /dev/shm once every rank is gone. The test is its own
// launcher (it must SIGKILL a stopped victim afterwards). GRADCOMM_SHM_FAULT_RUNS runs per
// position (default 1; the figure is 20).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "free_port.h"
#include "multiproc/job.h"
#include "multiproc/own_launcher.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kTimeoutMs = 3000;
// Killed: the segment's process check runs every 200 ms. Stopped: the deadline, then the
// 2 s liveness check that names the stalled rank, on oversubscribed cores.
constexpr double kKillBound = 5.0;
constexpr double kStopBound = kTimeoutMs / 1000.0 + 2.0 + 4.0;
constexpr auto kJobLimit = std::chrono::seconds(60);

pid_t start_rank(int rank, int ranks, const std::string& store, const std::string& token, const std::string& numel,
                 bool shared, const std::vector<std::string>& args, const std::string& log) {
  return gradcomm::testing::start_rank(WORKER_PATH, rank, ranks,
                                       {{"GRADCOMM_STORE", store},
                                        {"GRADCOMM_JOB_TOKEN", token},
                                        {"GRADCOMM_FAULT_NUMEL", numel},
                                        {"GRADCOMM_FAULT_SHARED", shared ? "1" : ""},
                                        {"GRADCOMM_LOG", "info"},
                                        {"GRADCOMM_SHM", ""}},
                                       args, log);
}

struct Case {
  const char* name;
  int ranks;
  const char* kind;   // sigkill | sigstop
  const char* numel;  // floats per call
  bool shared = false;  // the buffer from alloc_shared: read in place by the node's ranks
};

class MultiprocShmFaults : public ::testing::TestWithParam<Case> {};

TEST_P(MultiprocShmFaults, EveryOtherRankRaisesNamingTheVictimAndDevShmIsClean) {
  const Case c = GetParam();
  const char* env_runs = std::getenv("GRADCOMM_SHM_FAULT_RUNS");
  const int runs = env_runs != nullptr ? std::atoi(env_runs) : 1;
  const bool stop = std::string(c.kind) == "sigstop";
  const std::set<std::string> shm_before = gradcomm::testing::dev_shm_names();
  for (int run = 0; run < runs; ++run) {
    for (int victim = 0; victim < c.ranks; ++victim) {
      const uint32_t seed = std::random_device{}();
      SCOPED_TRACE(fmt::format("{} run {} victim {} seed {}", c.name, run, victim, seed));
      const int port = gradcomm::detail::free_loopback_ports(1);
      const std::string store = fmt::format("tcp://127.0.0.1:{}", port);
      const std::string token = fmt::format("{:016x}", (uint64_t{std::random_device{}()} << 32) | seed);
      char dir_template[] = "/tmp/gradcomm-shm-fault-XXXXXX";
      const std::string dir = ::mkdtemp(dir_template);
      std::vector<pid_t> pids;
      for (int r = 0; r < c.ranks; ++r) {
        pids.push_back(start_rank(r, c.ranks, store, token, c.numel, c.shared,
                                  {"fault", c.kind, std::to_string(victim), std::to_string(kTimeoutMs), "none",
                                   std::to_string(seed)},
                                  fmt::format("{}/rank{}.log", dir, r)));
      }
      const auto start = Clock::now();
      std::vector<int> exit_codes(static_cast<size_t>(c.ranks), -1);
      int survivors_left = c.ranks - 1;
      while (survivors_left > 0 && Clock::now() - start < kJobLimit) {
        for (int r = 0; r < c.ranks; ++r) {
          int status = 0;
          if (exit_codes[r] != -1 || ::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
          exit_codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          if (r != victim) --survivors_left;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      for (pid_t pid : pids) ::kill(pid, SIGKILL);  // the stopped victim, or what the limit left
      for (int r = 0; r < c.ranks; ++r) {
        int status = 0;
        if (exit_codes[r] == -1) ::waitpid(pids[r], &status, 0);
      }
      std::string output;
      for (int r = 0; r < c.ranks; ++r) output += gradcomm::testing::slurp(fmt::format("{}/rank{}.log", dir, r));
      std::filesystem::remove_all(dir);
      ASSERT_EQ(survivors_left, 0) << "survivors still running after " << kJobLimit.count() << " s\n" << output;
      EXPECT_NE(output.find(fmt::format("node segment: shared by {} ranks", c.ranks)), std::string::npos)
          << "not on the node's segment\n"
          << output;
      int64_t died_at = -1;
      const auto results = gradcomm::testing::parse_results(output);
      for (const auto& r : results) {
        if (r.count("kind")) died_at = std::stoll(r.at("at_ms"));
      }
      ASSERT_GT(died_at, 0) << output;
      int errors = 0;
      for (const auto& r : results) {
        if (!r.count("error")) continue;
        ++errors;
        EXPECT_EQ(r.at("error"), stop ? "TimeoutError" : "PeerFailure") << r.at("message");
        EXPECT_NE(r.at("message").find(fmt::format("rank {}", victim)), std::string::npos) << r.at("message");
        const double latency_s = (std::stoll(r.at("at_ms")) - died_at) / 1000.0;
        EXPECT_LT(latency_s, stop ? kStopBound : kKillBound) << "rank " << r.at("rank") << ": " << r.at("message");
        RecordProperty(fmt::format("run{}_victim{}_rank{}_ms", run, victim, r.at("rank")),
                       std::to_string(std::stoll(r.at("at_ms")) - died_at));
      }
      EXPECT_EQ(errors, c.ranks - 1) << output;
      for (int r = 0; r < c.ranks; ++r) {
        if (r != victim) EXPECT_EQ(exit_codes[r], 10) << "rank " << r << "\n" << output;
      }
    }
  }
  for (const std::string& name : gradcomm::testing::dev_shm_names()) {
    EXPECT_TRUE(shm_before.count(name)) << "left in /dev/shm: " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shm, MultiprocShmFaults,
    ::testing::Values(Case{"kill2Large", 2, "sigkill", "16777216"}, Case{"kill2Small", 2, "sigkill", "256"},
                      Case{"stop2Large", 2, "sigstop", "16777216"}, Case{"stop2Small", 2, "sigstop", "256"},
                      Case{"kill4Large", 4, "sigkill", "16777216"}, Case{"kill4Small", 4, "sigkill", "256"},
                      Case{"stop4Large", 4, "sigstop", "16777216"}, Case{"stop4Small", 4, "sigstop", "256"},
                      Case{"kill2Shared", 2, "sigkill", "16777216", true},
                      Case{"stop2Shared", 2, "sigstop", "16777216", true}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
