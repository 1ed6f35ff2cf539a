// Real processes on one GPU, started by gradcomm-run: CUDA tensors through the
// staging path (NCCL refuses two ranks on one device, so transport=auto stages),
// N = 2 and 3, dense and every compressor, bitwise identical across ranks. Skips
// on machines without a GPU (the workers report it).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Job {
  int exit_code = -1;
  std::string output;
  std::vector<std::map<std::string, std::string>> results;
};

Job run_job(int n, const std::string& args) {
  const std::string command =
      fmt::format("timeout -k 5 600 {} -n {} -- {} {} 2>&1", GRADCOMM_RUN_PATH, n, CUDA_WORKER_PATH, args);
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
    const std::string rest = m[1];
    for (std::sregex_iterator it(rest.begin(), rest.end(), kPair), end; it != end; ++it) fields[(*it)[1]] = (*it)[2];
    job.results.push_back(fields);
  }
  return job;
}

class MultiprocCudaStaging : public ::testing::TestWithParam<int> {};

TEST_P(MultiprocCudaStaging, DenseAndEveryCompressorBitwiseIdentical) {
  const int n = GetParam();
  const Job job = run_job(n, "staging");
  for (const auto& r : job.results) {
    if (r.count("skip")) GTEST_SKIP() << "no CUDA device: " << r.at("skip");
  }
  ASSERT_EQ(job.exit_code, 0) << job.output;
  ASSERT_EQ(job.results.size(), static_cast<size_t>(n)) << job.output;
  for (const auto& r : job.results) {
    EXPECT_EQ(r.at("path"), "staging") << job.output;
    EXPECT_EQ(r.at("wrong"), "0") << job.output;
    EXPECT_NE(r.at("checks"), "0") << job.output;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MultiprocCudaStaging, ::testing::Values(2, 3));

}  // namespace
