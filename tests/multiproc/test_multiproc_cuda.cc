// Real processes on one GPU, started by gradcomm-run: CUDA tensors through the
// staging path (NCCL refuses two ranks on one device, so transport=auto stages),
// N = 2 and 3, dense and every compressor, bitwise identical across ranks. Skips
// on machines without a GPU (the workers report it).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "multiproc/job.h"

namespace {

using gradcomm::testing::Job;

Job run_job(int n, const std::string& args) {
  return gradcomm::testing::run_command(
      fmt::format("timeout -k 5 600 {} -n {} -- {} {} 2>&1", GRADCOMM_RUN_PATH, n, CUDA_WORKER_PATH, args));
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
