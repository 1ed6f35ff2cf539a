// gradcomm-train's command line in-process (trainer/config.cc): what it refuses
// before any work is done, with one line naming the flag and the value. Pins:
// --hidden's empty elements are refused, not dropped; --checkpoint-dir is created
// and probed at start-up (by every rank at once), and an unusable one is refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "trainer/config.h"

namespace gradcomm::train {
namespace {

namespace fs = std::filesystem;

struct Parsed {
  bool go_on = false;
  int exit_code = 0;
  std::string err;  // what parse_command_line printed on stderr
  Config config;
};

Parsed parse(std::vector<std::string> args) {
  args.insert(args.begin(), "gradcomm-train");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  Parsed p;
  ::testing::internal::CaptureStderr();
  p.go_on = parse_command_line(static_cast<int>(argv.size()), argv.data(), p.config, &p.exit_code);
  p.err = ::testing::internal::GetCapturedStderr();
  return p;
}

// A directory of its own per test, removed at the end.
class TrainerCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() / ("gradcomm_trainer_cli_" + std::string(info->name()) + "_" +
                                         std::to_string(getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }
  fs::path root_;
};

// Refused: non-zero exit, one line, naming the flag and the text as typed.
void expect_refused(const Parsed& p, const std::string& names) {
  EXPECT_FALSE(p.go_on);
  EXPECT_NE(p.exit_code, 0);
  EXPECT_NE(p.err.find(names), std::string::npos) << p.err;
  EXPECT_EQ(p.err.find('\n'), p.err.size() - 1) << "not one line: " << p.err;
}

TEST_F(TrainerCli, HiddenTakesACommaSeparatedList) {
  EXPECT_EQ(parse({}).config.hidden, (std::vector<int64_t>{512, 256}));  // the default
  const Parsed p = parse({"--hidden", "32,16,8"});
  ASSERT_TRUE(p.go_on) << p.err;
  EXPECT_EQ(p.config.hidden, (std::vector<int64_t>{32, 16, 8}));
  EXPECT_EQ(parse({"--hidden", "64"}).config.hidden, (std::vector<int64_t>{64}));
}

// CLI11's delimiter dropped empty elements: "512,,256" trained a 512-256 MLP.
TEST_F(TrainerCli, HiddenEmptyElementIsRefusedNotDropped) {
  for (const char* text : {"512,,256", ",512", "512,", "", ","}) {
    SCOPED_TRACE(text);
    const Parsed p = parse({"--hidden", text});
    expect_refused(p, "--hidden '" + std::string(text) + "'");
    EXPECT_NE(p.err.find("is empty"), std::string::npos) << p.err;
  }
  expect_refused(parse({"--hidden=512,,256"}), "--hidden '512,,256': element 2 is empty");
  expect_refused(parse({"--hidden", "512,x"}), "--hidden '512,x': element 2 ('x') is not an integer");
}

TEST_F(TrainerCli, CheckpointDirIsCreatedAndTheProbeRemoved) {
  const fs::path dir = root_ / "a" / "b";
  const Parsed p = parse({"--checkpoint-dir", dir.string()});
  ASSERT_TRUE(p.go_on) << p.err;
  ASSERT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::is_empty(dir));
  // --resume with nothing to resume from goes on (train.cc then starts fresh).
  EXPECT_TRUE(parse({"--resume", "--checkpoint-dir", (root_ / "c").string()}).go_on);
}

// Every rank of a job checks the same directory at the same moment.
TEST_F(TrainerCli, RanksCheckingOneNewDirectoryAtOnceAllSucceed) {
  const fs::path dir = root_ / "shared" / "ckpt";
  std::vector<int> ok(8, 0);
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < ok.size(); ++r) {
    ranks.emplace_back([&, r] {
      Config c;
      int exit_code = 0;
      std::string arg0 = "gradcomm-train", flag = "--checkpoint-dir", value = dir.string();
      char* argv[] = {arg0.data(), flag.data(), value.data()};
      ok[r] = parse_command_line(3, argv, c, &exit_code);
    });
  }
  for (auto& t : ranks) t.join();
  for (size_t r = 0; r < ok.size(); ++r) EXPECT_TRUE(ok[r]) << "rank " << r;
  ASSERT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::is_empty(dir));  // every probe removed
}

TEST_F(TrainerCli, CheckpointDirThatCannotBeCreatedIsRefused) {
  std::ofstream(root_ / "file") << "x";
  for (const fs::path& dir : {root_ / "file", root_ / "file" / "ckpt"}) {
    for (bool resume : {false, true}) {
      SCOPED_TRACE(dir.string() + (resume ? " --resume" : ""));
      std::vector<std::string> args = {"--checkpoint-dir", dir.string()};
      if (resume) args.push_back("--resume");
      expect_refused(parse(args), "--checkpoint-dir " + dir.string() + ": cannot create directory: Not a directory");
    }
  }
}

TEST_F(TrainerCli, CheckpointDirWithoutWritePermissionIsRefused) {
  // root writes anywhere permissions say no; /proc takes no new file even from root.
  fs::path dir = "/proc";
  if (geteuid() != 0) {
    dir = root_ / "read-only";
    fs::create_directories(dir);
    fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
  }
  expect_refused(parse({"--checkpoint-dir", dir.string()}),
                 "--checkpoint-dir " + dir.string() + ": cannot create a file in it: ");
}

}  // namespace
}  // namespace gradcomm::train
