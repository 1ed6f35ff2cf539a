// gradcomm-train end to end: the real binary under gradcomm-run on a small slice
// of Fashion-MNIST (2 ranks, a few hundred examples). Pins: a run killed with
// SIGKILL mid-epoch and resumed ends with checkpoints byte-identical to an
// uninterrupted run's; same seed -> same bytes; --nan skip/abort; clear errors for
// missing data, corrupt checkpoints, an unusable --checkpoint-dir (before training)
// and (without a GPU) --device cuda.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "trainer/checkpoint.h"

namespace {

namespace fs = std::filesystem;
constexpr const char* kData = "/usr/share/datasets/fashion-mnist";

struct Result {
  int status = -1;  // exit code
  std::string output;
};

// Runs `command` through sh with stderr merged, returns exit code and output.
Result sh(const std::string& command) {
  Result r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) r.output.append(buffer, n);
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> log_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The raw text of "name":value in a flat JSON line (enough for comparisons).
std::string field(const std::string& line, const std::string& name) {
  const size_t at = line.find("\"" + name + "\":");
  if (at == std::string::npos) return "<missing " + name + ">";
  const size_t start = at + name.size() + 3;
  return line.substr(start, line.find_first_of(",}", start) - start);
}

class TrainerProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fs::path(kData) / "train-images-idx3-ubyte.gz")) GTEST_SKIP() << "dataset-fashion-mnist missing";
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    // One directory level: a parameterized test's names hold '/', and TearDown
    // removes only the leaf.
    std::string leaf = fmt::format("gradcomm_trainer_{}_{}_{}", info->test_suite_name(), info->name(), getpid());
    std::replace(leaf.begin(), leaf.end(), '/', '_');
    root_ = fs::temp_directory_path() / leaf;
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(root_);
  }

  // 2 ranks, 640 examples: 20 steps of 16 per epoch.
  Result train(const std::string& args, int epochs = 3, int ranks = 2) {
    return sh(fmt::format("OPENBLAS_NUM_THREADS=1 {} -n {} --grace 5 -- {} --limit-train 640 --limit-test 200 "
                          "--epochs {} --batch-size 16 --hidden 32,16 --lr 0.05 {}",
                          GRADCOMM_RUN_PATH, ranks, TRAIN_PATH, epochs, args));
  }
  fs::path dir(const std::string& name) {
    const fs::path d = root_ / name;
    fs::create_directories(d);
    return d;
  }

  fs::path root_;
};

// The main promise: kill mid-epoch (e.g. global step 27 = epoch 2, step 7;
// the last checkpoint is at step 24), resume, and end bit-for-bit where an
// uninterrupted run ends, for dense, top-k with error feedback, and top-k with
// DGC momentum correction (whose masks come from the residual).
// The kill at step 22 lands after epoch 1's log line but before the next
// checkpoint (step 24): the resumed run repeats epoch 1's end and must not log it twice.
//
// The crash-resume matrix adds a random kill: for none, topk, qsgd and sketch, a
// step in [9, 59] (after the first checkpoint, anywhere in the 3 epochs, epoch
// boundaries included) on a random rank. The draw is printed; GRADCOMM_KILL_SEED=S
// replays one.
struct KillCase {
  const char* args;
  int kill_step;  // 0: random
};
class KillAndResume : public TrainerProcess, public ::testing::WithParamInterface<KillCase> {};

TEST_P(KillAndResume, FinalCheckpointsAreByteIdentical) {
  const std::string common = fmt::format("--checkpoint-every 8 {}", GetParam().args);
  const char* fixed_seed = std::getenv("GRADCOMM_KILL_SEED");
  const uint32_t seed = fixed_seed != nullptr ? static_cast<uint32_t>(std::stoul(fixed_seed)) : std::random_device{}();
  const bool random = GetParam().kill_step == 0;
  const int kill = random ? 9 + static_cast<int>(seed % 51) : GetParam().kill_step;
  const int victim = random ? static_cast<int>((seed / 51) % 2) : 0;
  const int last_checkpoint = kill / 8 * 8;  // checkpoints after steps 8, 16, ...; the hook fires before step `kill`
  RecordProperty("kill_step", std::to_string(kill));
  SCOPED_TRACE(fmt::format("SIGKILL at step {} on rank {} (replay: GRADCOMM_KILL_SEED={})", kill, victim, seed));
  const fs::path a = dir("a"), b = dir("b");
  const Result full = train(fmt::format("{} --checkpoint-dir {} --log {}/log.jsonl", common, a.string(), a.string()));
  ASSERT_EQ(full.status, 0) << full.output;

  const Result killed = train(fmt::format("{} --checkpoint-dir {} --log {}/log.jsonl --debug-kill-at-step {} "
                                          "--debug-rank {}",
                                          common, b.string(), b.string(), kill, victim));
  ASSERT_NE(killed.status, 0) << killed.output;
  ASSERT_TRUE(fs::exists(b / "rank0.ckpt"));
  // What the kill left: the last checkpoint before the kill, not the final one.
  const auto left = gradcomm::train::read_file_if_exists((b / "rank0.ckpt").string());
  ASSERT_TRUE(left);
  const auto state = gradcomm::train::parse_checkpoint(*left, "rank0.ckpt", 0, 2);
  EXPECT_EQ(state.global_step, last_checkpoint);
  EXPECT_EQ(state.epoch, last_checkpoint / 20);  // mid-epoch (20 steps per epoch)
  EXPECT_EQ(state.step_in_epoch, last_checkpoint % 20);
  if (!random) EXPECT_NE(state.step_in_epoch, 0);

  const Result resumed =
      train(fmt::format("{} --checkpoint-dir {} --log {}/log.jsonl --resume", common, b.string(), b.string()));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  for (const char* name : {"rank0.ckpt", "rank1.ckpt", "rank0.ckpt.prev", "rank1.ckpt.prev"}) {
    const std::string x = bytes_of(a / name), y = bytes_of(b / name);
    ASSERT_FALSE(x.empty()) << name;
    EXPECT_TRUE(x == y) << name << " differs between the uninterrupted and the resumed run";
  }
  // The log: each epoch once, with the same accuracy and byte counts (the
  // interrupted epoch's counters came back from the checkpoint).
  std::vector<std::string> la = log_lines(a / "log.jsonl"), lb = log_lines(b / "log.jsonl");
  ASSERT_EQ(la.size(), 3u);
  ASSERT_EQ(lb.size(), 3u);
  for (size_t e = 0; e < 3; ++e) {
    EXPECT_EQ(field(lb[e], "epoch"), std::to_string(e + 1));
    for (const char* f : {"test_accuracy", "train_loss", "wire_bytes", "dense_bytes"}) {
      EXPECT_EQ(field(la[e], f), field(lb[e], f)) << f << " of epoch " << e + 1;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Compressors, KillAndResume,
                         ::testing::Values(KillCase{"--compressor none", 27},
                                           KillCase{"--compressor topk:ratio=0.05,min_numel=64", 27},
                                           KillCase{"--compressor topk:ratio=0.05 --momentum-correction --nesterov", 27},
                                           KillCase{"--compressor topk:ratio=0.05,min_numel=64", 22},
                                           KillCase{"--compressor none", 0},
                                           KillCase{"--compressor topk:ratio=0.05,min_numel=64", 0},
                                           KillCase{"--compressor qsgd:levels=16,min_numel=64", 0},
                                           KillCase{"--compressor sketch:rows=3,cols=256,ratio=0.05,min_numel=64", 0}),
                         [](const auto& info) { return std::to_string(info.index); });

TEST_F(TrainerProcess, SameSeedSameBytesOtherSeedOtherBytes) {
  const fs::path a = dir("a"), b = dir("b"), c = dir("c");
  const std::string args = "--compressor quant:bits=4 --checkpoint-dir ";
  ASSERT_EQ(train(args + a.string(), 1).status, 0);
  ASSERT_EQ(train(args + b.string(), 1).status, 0);
  ASSERT_EQ(train(args + c.string() + " --seed 2", 1).status, 0);
  for (const char* name : {"rank0.ckpt", "rank1.ckpt"}) {
    EXPECT_TRUE(bytes_of(a / name) == bytes_of(b / name)) << name;
    EXPECT_FALSE(bytes_of(a / name) == bytes_of(c / name)) << name;
  }
}

// Overlap changes when each layer's allreduce starts, not what it computes: the same
// calls with the same keys (fusion is off in the trainer), so the same bytes.
TEST_F(TrainerProcess, OverlapAndNoOverlapWriteTheSameBytes) {
  for (const char* compressor : {"topk:ratio=0.05", "quant:bits=4"}) {
    SCOPED_TRACE(compressor);
    const fs::path a = dir(fmt::format("overlap-{}", compressor)), b = dir(fmt::format("serial-{}", compressor));
    const std::string args = fmt::format("--compressor {} --checkpoint-dir ", compressor);
    ASSERT_EQ(train(args + a.string(), 1).status, 0);
    ASSERT_EQ(train(args + b.string() + " --no-overlap", 1).status, 0);
    for (const char* name : {"rank0.ckpt", "rank1.ckpt"}) EXPECT_TRUE(bytes_of(a / name) == bytes_of(b / name)) << name;
  }
}

// With overlap the log splits each step: compute, compression, exposed communication,
// and the step time's median and p90.
TEST_F(TrainerProcess, LogSplitsTheStepAndSaysWhichSchedule) {
  const fs::path log = dir("log") / "run.jsonl";
  for (const char* schedule : {"", " --no-overlap"}) {
    const Result r = train(fmt::format("--compressor topk:ratio=0.05 --log {}{}", log.string(), schedule), 1);
    ASSERT_EQ(r.status, 0) << r.output;
    std::ifstream in(log);
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(field(line, "overlap"), *schedule ? "false" : "true") << line;
    const double median = std::stod(field(line, "step_s_median")), p90 = std::stod(field(line, "step_s_p90"));
    EXPECT_GT(median, 0.0) << line;
    EXPECT_GE(p90, median) << line;
    EXPECT_GE(std::stod(field(line, "comm_s")), 0.0) << line;
    EXPECT_GT(std::stod(field(line, "compute_s")), 0.0) << line;
    // The parts add up to the epoch's wall time: compression counts in it only when
    // blocking (overlapped, it ran on the engine thread during compute).
    const double parts = std::stod(field(line, "compute_s")) + std::stod(field(line, "comm_s")) +
                         std::stod(field(line, "data_s")) + std::stod(field(line, "eval_s")) +
                         std::stod(field(line, "other_s")) + (*schedule ? std::stod(field(line, "compress_s")) : 0.0);
    const double time_s = std::stod(field(line, "time_s"));
    EXPECT_NEAR(parts, time_s, 1e-6 + 1e-9 * time_s) << line;
    // other_s is clamped at 0, so parts counted twice (compression in both compute
    // and compress, say) would show here as a sum above the wall time.
    EXPECT_NE(r.output.find(" = compute "), std::string::npos) << r.output;
  }
}

// One rank sends nothing: the banner and the epoch line say so, without a ratio of
// zeros ("0.0x fewer") or "cpu on cpu".
TEST_F(TrainerProcess, OneRankSaysItSendsNothing) {
  const Result r = train("", 1, /*ranks=*/1);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("1 rank, MLP"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("on cpu,"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("cpu on cpu"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("one rank: nothing to send"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("x fewer"), std::string::npos) << r.output;
}

TEST_F(TrainerProcess, CorruptCheckpointIsRefused) {
  const fs::path d = dir("ckpt");
  ASSERT_EQ(train("--checkpoint-dir " + d.string(), 1).status, 0);
  {
    std::fstream f(d / "rank1.ckpt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  const Result r = train("--resume --checkpoint-dir " + d.string(), 1);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("rank1.ckpt: corrupt"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checksum mismatch"), std::string::npos) << r.output;
}

TEST_F(TrainerProcess, ResumeWithOtherSettingsIsRefused) {
  const fs::path d = dir("ckpt");
  ASSERT_EQ(train("--checkpoint-dir " + d.string(), 1).status, 0);
  const Result r = train("--momentum 0.8 --resume --checkpoint-dir " + d.string(), 1);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("different settings"), std::string::npos) << r.output;
}

TEST_F(TrainerProcess, NanSkipDropsTheStepOnEveryRank) {
  const fs::path d = dir("nan");
  const std::string log = (d / "log{rank}.jsonl").string();
  const Result r = train(fmt::format("--nan skip --debug-nan-at-step 5 --debug-rank 1 --log {} --checkpoint-dir {}",
                                     log, d.string()));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("skipping global step 5: non-finite loss or gradient on rank(s) 1"), std::string::npos)
      << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(d / fmt::format("log{}.jsonl", rank));
    std::string first;
    std::getline(in, first);
    EXPECT_NE(first.find("\"skipped_steps\":1"), std::string::npos) << first;  // on both ranks
    const auto bytes = gradcomm::train::read_file_if_exists((d / fmt::format("rank{}.ckpt", rank)).string());
    ASSERT_TRUE(bytes);
    const auto state = gradcomm::train::parse_checkpoint(*bytes, "ckpt", rank, 2);
    EXPECT_EQ(state.skipped_steps, 1);
    for (float w : state.params) ASSERT_TRUE(std::isfinite(w));  // the NaN never reached the weights
  }
}

TEST_F(TrainerProcess, NanAbortNamesStepAndRank) {
  const Result r = train("--nan abort --debug-nan-at-step 3 --debug-rank 1");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("non-finite loss or gradient at epoch 1 step 3 (global step 3) on rank(s) 1"),
            std::string::npos)
      << r.output;
}

TEST_F(TrainerProcess, MissingDataNamesThePackage) {
  const Result r = train("--data " + dir("empty").string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("train-images-idx3-ubyte.gz: cannot open"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dataset-fashion-mnist"), std::string::npos) << r.output;
}

// An unusable --checkpoint-dir is refused at start-up by every rank, before the data
// is read, not when the first checkpoint is due after training. The full data set and
// the default model and epochs (the checkpoint is due at the end), so a run that trains
// cannot pass the time bound. A directory under a file: no rank can create it. With
// --resume, a missing one that cannot be created (/proc takes no new directory, even
// from root): reading finds no checkpoint there, and the run used to start fresh.
TEST_F(TrainerProcess, UnusableCheckpointDirIsRefusedBeforeTraining) {
  std::ofstream(root_ / "file") << "x";
  const std::string under_file = (root_ / "file" / "ckpt").string();
  const std::string in_proc = fmt::format("/proc/gradcomm-no-such-dir-{}/ckpt", getpid());
  const std::pair<std::string, std::string> runs[] = {
      {fmt::format("{} -n 2 --grace 5 -- {} --checkpoint-dir {}", GRADCOMM_RUN_PATH, TRAIN_PATH, under_file),
       under_file},
      {fmt::format("{} --resume --checkpoint-dir {}", TRAIN_PATH, in_proc), in_proc},  // one rank, no launcher
  };
  for (const auto& [command, dir] : runs) {
    SCOPED_TRACE(command);
    const auto start = std::chrono::steady_clock::now();
    const Result r = sh(fmt::format("OPENBLAS_NUM_THREADS=1 timeout 60 {} --data {}", command, kData));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("--checkpoint-dir " + dir + ": cannot create directory: "), std::string::npos) << r.output;
    // Neither the banner ("... steps/epoch ...") nor a progress or epoch line: nothing trained.
    EXPECT_EQ(r.output.find("epoch "), std::string::npos) << r.output;
    EXPECT_LT(seconds, 5.0) << r.output;
  }
}

TEST_F(TrainerProcess, LogHasOneLinePerEpochWithTheRequiredFields) {
  const fs::path log = dir("log") / "run.jsonl";
  const Result r = train("--compressor topk:ratio=0.01 --log " + log.string());
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(log);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    for (const char* field : {"\"epoch\":", "\"train_loss\":", "\"test_accuracy\":", "\"wire_bytes\":",
                              "\"dense_bytes\":", "\"time_s\":", "\"compute_s\":", "\"compress_s\":", "\"comm_s\":"}) {
      EXPECT_NE(line.find(field), std::string::npos) << field << " missing in " << line;
    }
  }
  EXPECT_EQ(lines, 3);
}

// Without a GPU, --device cuda must fail cleanly; with one, it must train.
TEST_F(TrainerProcess, CudaDeviceRunsOrFailsCleanly) {
  const Result r = train("--device cuda", 1, 1);
  if (r.status == 0) {
    EXPECT_NE(r.output.find("test_accuracy"), std::string::npos) << r.output;
  } else {
    // No GPU here, or a build without CUDA: either way an Unsupported error saying which.
    EXPECT_TRUE(r.output.find("no CUDA device") != std::string::npos ||
                r.output.find("built without CUDA") != std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("Segmentation"), std::string::npos) << r.output;
  }
}

}  // namespace
