// Real processes over UCX, started by gradcomm-run: collectives, peer death,
// a stopped peer, and mismatched calls. Each test runs one job and reads the
// "RESULT" lines the workers print (see worker.cc).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace {

struct Job {
  int exit_code = -1;
  std::string output;
  std::vector<std::map<std::string, std::string>> results;  // key=value pairs of each RESULT line
};

// Runs gradcomm-run -n N -- worker ARGS with a hard wall-clock limit.
Job run_job(int n, const std::string& args, int grace_s = 5) {
  const std::string command = fmt::format("timeout -k 5 120 {} -n {} --grace {} -- {} {} 2>&1", GRADCOMM_RUN_PATH, n,
                                          grace_s, WORKER_PATH, args);
  Job job;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return job;
  char buffer[4096];
  while (fgets(buffer, sizeof buffer, pipe) != nullptr) job.output += buffer;
  const int status = pclose(pipe);
  job.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  static const std::regex kResult(R"(RESULT (.*))");
  static const std::regex kPair(R"((\w+)=(\S+))");
  std::istringstream lines(job.output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, kResult)) continue;
    std::map<std::string, std::string> fields;
    std::string rest = m[1];
    const auto message_at = rest.find("message=");
    if (message_at != std::string::npos) {
      fields["message"] = rest.substr(message_at + 8);
      rest = rest.substr(0, message_at);
    }
    for (std::sregex_iterator it(rest.begin(), rest.end(), kPair), end; it != end; ++it) fields[(*it)[1]] = (*it)[2];
    job.results.push_back(fields);
  }
  return job;
}

class MultiprocCollectives : public ::testing::TestWithParam<int> {};

TEST_P(MultiprocCollectives, ExactAndBitwiseIdenticalOnEveryRank) {
  const int n = GetParam();
  const Job job = run_job(n, "collectives");
  ASSERT_EQ(job.exit_code, 0) << job.output;
  ASSERT_EQ(job.results.size(), static_cast<size_t>(n)) << job.output;
  for (const auto& r : job.results) {
    EXPECT_EQ(r.at("wrong"), "0") << job.output;
    EXPECT_EQ(std::stoi(r.at("checks")), 3 * (5 * 4 * 2 + 1 + n)) << job.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Ucx, MultiprocCollectives, ::testing::Values(2, 3, 5));

class MultiprocCompressed : public ::testing::TestWithParam<int> {};

TEST_P(MultiprocCompressed, EverySpecFiniteBitwiseIdenticalAndExactWhereDefined) {
  const int n = GetParam();
  const Job job = run_job(n, "compressed");
  ASSERT_EQ(job.exit_code, 0) << job.output;
  ASSERT_EQ(job.results.size(), static_cast<size_t>(n)) << job.output;
  for (const auto& r : job.results) {
    EXPECT_EQ(r.at("wrong"), "0") << job.output;
    EXPECT_EQ(r.at("checks"), std::to_string(13 * 3 * 2 + 3 + 3)) << job.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Ucx, MultiprocCompressed, ::testing::Values(2, 3, 4));

TEST(MultiprocFaults, KilledPeerIsPeerFailureOnEveryOtherRankWithinTenSeconds) {
  const Job job = run_job(3, "kill 2");
  int64_t died_at = -1;
  int failures = 0;
  for (const auto& r : job.results) {
    if (r.count("at_ms") && !r.count("error")) died_at = std::stoll(r.at("at_ms"));
  }
  ASSERT_GT(died_at, 0) << job.output;
  for (const auto& r : job.results) {
    if (!r.count("error")) continue;
    ++failures;
    EXPECT_EQ(r.at("error"), "PeerFailure") << r.at("message");
    const double latency_s = (std::stoll(r.at("at_ms")) - died_at) / 1000.0;
    EXPECT_LT(latency_s, 10.0) << "rank " << r.at("rank") << " took " << latency_s << " s";
    RecordProperty("rank" + r.at("rank") + "_detect_ms", std::to_string(std::stoll(r.at("at_ms")) - died_at));
  }
  EXPECT_EQ(failures, 2) << job.output;
  // The launcher exits with the first failure it reaps: the victim's SIGKILL (137),
  // or a survivor's exit 10 when that one is reaped first (they end milliseconds apart).
  EXPECT_TRUE(job.exit_code == 137 || job.exit_code == 10) << job.exit_code << "\n" << job.output;
}

TEST(MultiprocFaults, StoppedPeerIsATimeoutAfterTheDeadlineNotBefore) {
  const Job job = run_job(3, "stop 2 3000", 2);
  int timeouts = 0;
  for (const auto& r : job.results) {
    if (!r.count("error")) continue;
    ++timeouts;
    EXPECT_EQ(r.at("error"), "TimeoutError") << r.at("message");
    const double in_call = std::stod(r.at("in_call_s"));
    EXPECT_GE(in_call, 1.5) << r.at("message");
    EXPECT_LT(in_call, 10.0) << r.at("message");
  }
  EXPECT_EQ(timeouts, 2) << job.output;
}

// Garbage, an HTTP request, a wrong token and a 2^64-1 length prefix sent to the
// job's own store while the real ranks rendezvous: each attack is dropped, the
// store keeps serving, and the job computes the right allreduce.
TEST(MultiprocStore, AttacksAreDroppedWhileRealRanksRendezvous) {
  const Job job = run_job(4, "abuse");
  ASSERT_EQ(job.exit_code, 0) << job.output;
  ASSERT_EQ(job.results.size(), 4u) << job.output;
  for (const auto& r : job.results) {
    EXPECT_EQ(r.at("allreduce_ok"), "1") << job.output;
    EXPECT_EQ(r.at("dropped"), r.at("attacks")) << job.output;
    if (r.at("rank") != "0") EXPECT_EQ(r.at("attacks"), "4");
  }
}

class MultiprocMismatch : public ::testing::TestWithParam<std::string> {};

TEST_P(MultiprocMismatch, EveryRankRaisesMismatchError) {
  const Job job = run_job(3, "mismatch " + GetParam());
  ASSERT_EQ(job.results.size(), 3u) << job.output;
  for (const auto& r : job.results) {
    EXPECT_EQ(r.at("error"), "MismatchError") << job.output;
    EXPECT_NE(r.at("message").find("rank 1 called"), std::string::npos) << r.at("message");
  }
  EXPECT_EQ(job.exit_code, 10) << job.output;
}

INSTANTIATE_TEST_SUITE_P(Ucx, MultiprocMismatch, ::testing::Values("numel", "dtype", "op", "kind"));

}  // namespace
