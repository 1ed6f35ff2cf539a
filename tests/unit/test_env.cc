// Launch configuration: where rank, size, store, timeout and token come from.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "env.h"
#include "launch_config.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) ::unsetenv(v);
  }
  void TearDown() override { SetUp(); }
  static constexpr const char* kVars[] = {
      "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
      "SLURM_PROCID", "SLURM_NTASKS", "GRADCOMM_STORE", "MASTER_ADDR", "MASTER_PORT", "GRADCOMM_TIMEOUT_S",
      "GRADCOMM_TRANSPORT", "GRADCOMM_JOB_TOKEN"};
};

TEST_F(EnvTest, InitOptionsWinOverTheEnvironment) {
  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  InitOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.store = "tcp://127.0.0.1:1234";
  auto c = resolve_launch_config(o);
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.world_size, 2);
  EXPECT_EQ(c.store, "tcp://127.0.0.1:1234");
}

TEST_F(EnvTest, LauncherVariablesInDesignOrder) {
  ::setenv("SLURM_PROCID", "5", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  ::setenv("MASTER_ADDR", "10.0.0.1", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  auto c = resolve_launch_config({});
  EXPECT_EQ(c.rank, 5);
  EXPECT_EQ(c.world_size, 8);
  EXPECT_EQ(c.store, "tcp://10.0.0.1:29500");
  ::setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  ::setenv("GRADCOMM_STORE", "file:///tmp/x", 1);
  c = resolve_launch_config({});
  EXPECT_EQ(c.rank, 2);
  EXPECT_EQ(c.world_size, 3);
  EXPECT_EQ(c.store, "file:///tmp/x");
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  EXPECT_EQ(resolve_launch_config({}).world_size, 2);
}

TEST_F(EnvTest, MissingOrBadValuesAreClearErrors) {
  EXPECT_THROW(resolve_launch_config({}), InvalidArgument);
  ::setenv("RANK", "4", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("GRADCOMM_STORE", "tcp://h:1", 1);
  EXPECT_THROW(resolve_launch_config({}), InvalidArgument);  // rank out of range
  ::setenv("RANK", "x1", 1);
  try {
    resolve_launch_config({});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK='x1'"), std::string::npos) << e.what();
  }
  ::setenv("RANK", "1", 1);
  ::unsetenv("GRADCOMM_STORE");
  EXPECT_THROW(resolve_launch_config({}), InvalidArgument);  // no store for 4 ranks
  ::setenv("GRADCOMM_STORE", "tcp://h:1", 1);
  ::setenv("GRADCOMM_TRANSPORT", "carrier-pigeon", 1);
  EXPECT_THROW(resolve_launch_config({}), InvalidArgument);
}

TEST_F(EnvTest, TimeoutAndTokenFromTheEnvironment) {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  ::setenv("GRADCOMM_TIMEOUT_S", "7", 1);
  ::setenv("GRADCOMM_JOB_TOKEN", "secret", 1);
  auto c = resolve_launch_config({});
  EXPECT_EQ(c.timeout, std::chrono::seconds(7));
  EXPECT_EQ(c.job_token, "secret");
  InitOptions o;
  o.timeout = std::chrono::milliseconds(1500);
  EXPECT_EQ(resolve_launch_config(o).timeout, std::chrono::milliseconds(1500));  // caller's choice wins
}

// setenv may move the environment array while getenv walks it: a read racing a write of a
// new variable read freed memory (a CI crash: env_string("UCX_TLS") on one rank's thread while
// another's transport set its UCX defaults). Every gradcomm read and write holds
// environment_mutex(): three threads read while one adds 3000 new variables, and nothing
// breaks (the same loop with bare getenv/setenv: 5 runs of 5 ended in SIGSEGV here).
TEST(Environment, ReadsAndWritesFromManyThreadsAreSerialized) {
  std::atomic<bool> done{false};
  std::atomic<int64_t> reads{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&] {
      while (!done.load()) {
        if (env_string("GRADCOMM_ENV_RACE_NEVER_SET")) ADD_FAILURE() << "read a variable nobody set";
        reads.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 3000; ++i) set_env_default(("GRADCOMM_ENV_RACE_" + std::to_string(i)).c_str(), "1");
  done = true;
  for (auto& r : readers) r.join();
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(env_string("GRADCOMM_ENV_RACE_2999"), "1");
  set_env_default("GRADCOMM_ENV_RACE_2999", "2");  // the value set first wins
  EXPECT_EQ(env_string("GRADCOMM_ENV_RACE_2999"), "1");
  for (int i = 0; i < 3000; ++i) ::unsetenv(("GRADCOMM_ENV_RACE_" + std::to_string(i)).c_str());
}

TEST(ParseBytes, SuffixesAndGarbage) {
  EXPECT_EQ(parse_bytes("8"), 8);
  EXPECT_EQ(parse_bytes("1K"), 1024);
  EXPECT_EQ(parse_bytes("256M"), int64_t{256} << 20);
  EXPECT_EQ(parse_bytes("2G"), int64_t{2} << 30);
  EXPECT_FALSE(parse_bytes(""));
  EXPECT_FALSE(parse_bytes("M"));
  EXPECT_FALSE(parse_bytes("-1"));
  EXPECT_FALSE(parse_bytes("9999999999999G"));
}

}  // namespace
}  // namespace gradcomm::detail
