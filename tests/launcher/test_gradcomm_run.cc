// gradcomm-run, end to end: the launcher is started as a real process with small
// `sh -c` programs as ranks, and its exit code, stdout, stderr and timing are checked.
// Timing bounds are loose (the test machine is shared); they separate "waited for the
// grace period / was killed" from "ran to the end of a 100 s sleep".
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gradcomm/version.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  int code = -1;  // exit code, or 128 + signal
  std::string out, err;
  double seconds = 0;
};

// One child process with its stdout and stderr captured. The test kills it (and, by
// the launcher's parent-death signal, its ranks) if it outlives the test's deadline.
class Process {
 public:
  explicit Process(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {}) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    std::vector<char*> argv_c, env_c;
    for (const auto& a : argv) argv_c.push_back(const_cast<char*>(a.c_str()));
    argv_c.push_back(nullptr);
    for (const auto& e : env) env_c.push_back(const_cast<char*>(e.c_str()));
    env_c.push_back(nullptr);
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) std::abort();
    start_ = Clock::now();
    pid_ = ::fork();
    if (pid_ == 0) {
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      int devnull = ::open("/dev/null", O_RDONLY);
      ::dup2(devnull, 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execve(argv_c[0], argv_c.data(), env_c.data());
      ::_exit(250);
    }
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }

  ~Process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }

  void signal(int sig) { ::kill(pid_, sig); }

  // Reads output until stdout contains `text` (true) or `timeout_s` passes (false).
  bool wait_for_stdout(const std::string& text, double timeout_s) {
    auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (out_.find(text) == std::string::npos) {
      if (Clock::now() >= deadline || !pump(50)) return out_.find(text) != std::string::npos;
    }
    return true;
  }

  // Reads until both pipes close, then reaps. Past `timeout_s`, kills and fails.
  Result finish(double timeout_s = 60) {
    auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (pump(100)) {
      if (Clock::now() >= deadline) {
        ADD_FAILURE() << "process still running after " << timeout_s << " s; killing it";
        ::kill(pid_, SIGKILL);
        break;
      }
    }
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    Result r;
    r.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = out_;
    r.err = err_;
    return r;
  }

 private:
  // One poll round; false once both pipes are at EOF.
  bool pump(int timeout_ms) {
    pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    if (out_fd_ < 0 && err_fd_ < 0) return false;
    ::poll(fds, 2, timeout_ms);
    read_into(fds[0], out_fd_, out_);
    read_into(fds[1], err_fd_, err_);
    return out_fd_ >= 0 || err_fd_ >= 0;
  }

  static void read_into(const pollfd& p, int& fd, std::string& sink) {
    if (fd < 0 || !p.revents) return;
    char buf[65536];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      sink.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      ::close(fd);
      fd = -1;
    }
  }

  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  std::string out_, err_;
  Clock::time_point start_;
};

std::vector<std::string> launcher_argv(std::vector<std::string> args) {
  args.insert(args.begin(), GRADCOMM_RUN_PATH);
  return args;
}

Result run_launcher(std::vector<std::string> args, const std::vector<std::string>& extra_env = {}) {
  return Process(launcher_argv(std::move(args)), extra_env).finish();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- environment ----------------------------------------------------------------------

struct RankEnv {
  std::string rank, world, local_rank, local_world, addr, port, store, token;
};

// Runs a job that prints its rendezvous variables; one entry per output line, by prefix.
std::map<int, RankEnv> rank_environments(int n, const std::vector<std::string>& extra_env = {}) {
  Result r = run_launcher({"-n", std::to_string(n), "sh", "-c",
                           "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR "
                           "$MASTER_PORT $GRADCOMM_STORE $GRADCOMM_JOB_TOKEN\""},
                          extra_env);
  EXPECT_EQ(r.code, 0) << r.err;
  std::map<int, RankEnv> envs;
  std::regex line_re(R"(^\[(\d+)\] (.*)$)");
  for (const std::string& line : lines_of(r.out)) {
    std::smatch m;
    EXPECT_TRUE(std::regex_match(line, m, line_re)) << line;
    RankEnv e;
    std::istringstream fields(m[2].str());
    fields >> e.rank >> e.world >> e.local_rank >> e.local_world >> e.addr >> e.port >> e.store >> e.token;
    envs[std::stoi(m[1].str())] = e;
  }
  return envs;
}

TEST(GradcommRunEnv, EveryRankSeesItsRankAndTheSharedRendezvous) {
  // Values the caller set for variables the launcher owns are replaced.
  auto envs = rank_environments(4, {"RANK=99", "WORLD_SIZE=99", "GRADCOMM_STORE=tcp://elsewhere:1"});
  ASSERT_EQ(envs.size(), 4u);
  const RankEnv& first = envs.at(0);
  for (const auto& [prefix, e] : envs) {
    EXPECT_EQ(e.rank, std::to_string(prefix));
    EXPECT_EQ(e.local_rank, std::to_string(prefix));
    EXPECT_EQ(e.world, "4");
    EXPECT_EQ(e.local_world, "4");
    EXPECT_EQ(e.addr, "127.0.0.1");
    EXPECT_EQ(e.port, first.port);
    EXPECT_EQ(e.store, first.store);
    EXPECT_EQ(e.token, first.token);
  }
  int master_port = std::stoi(first.port);
  EXPECT_GT(master_port, 0);
  EXPECT_LT(master_port, 65536);
  std::smatch m;
  std::regex store_re(R"(^tcp://127\.0\.0\.1:(\d+)$)");
  ASSERT_TRUE(std::regex_match(first.store, m, store_re)) << first.store;
  int store_port = std::stoi(m[1].str());
  EXPECT_GT(store_port, 0);
  EXPECT_LT(store_port, 65536);
  // gradcomm.init() with only MASTER_ADDR/MASTER_PORT serves its store on MASTER_PORT + 1:
  // the launcher hands out that very port, so a program that drops GRADCOMM_STORE still
  // finds it free.
  EXPECT_EQ(store_port, master_port + 1);
  EXPECT_TRUE(std::regex_match(first.token, std::regex("^[0-9a-f]{64}$"))) << first.token;
}

TEST(GradcommRunEnv, JobTokenIsFreshForEachLaunch) {
  auto a = rank_environments(1);
  auto b = rank_environments(1);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a.at(0).token.size(), 64u);
  EXPECT_NE(a.at(0).token, b.at(0).token);
}

TEST(GradcommRunEnv, CallersJobTokenIsKept) {
  auto envs = rank_environments(2, {"GRADCOMM_JOB_TOKEN=caller-secret"});
  ASSERT_EQ(envs.size(), 2u);
  EXPECT_EQ(envs.at(0).token, "caller-secret");
  EXPECT_EQ(envs.at(1).token, "caller-secret");
}

// ---- output -----------------------------------------------------------------------------

TEST(GradcommRunOutput, LinesArePrefixedAndStreamsKeptApart) {
  Result r = run_launcher({"-n", "2", "sh", "-c", "echo out$RANK; echo err$RANK >&2; printf tail$RANK"});
  EXPECT_EQ(r.code, 0) << r.err;
  auto out = lines_of(r.out);
  auto err = lines_of(r.err);
  std::sort(out.begin(), out.end());
  std::sort(err.begin(), err.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[0] out0", "[0] tail0", "[1] out1", "[1] tail1"}));
  EXPECT_EQ(err, (std::vector<std::string>{"[0] err0", "[1] err1"}));
  // A rank's lines keep their order; the partial last line comes last, with a newline.
  EXPECT_LT(r.out.find("[0] out0"), r.out.find("[0] tail0"));
  EXPECT_EQ(r.out.back(), '\n');
}

// A rank that prints $GRADCOMM_RUN_UNPREFIXED (a table for nccl-tests parsers) gets the
// rest of that stream through as written; the line itself is swallowed, the other
// stream and the other ranks stay prefixed, and what came before it keeps its prefix.
TEST(GradcommRunOutput, UnprefixedLineTurnsThePrefixOffForThatStream) {
  Result r = run_launcher({"-n", "2", "sh", "-c",
                           "echo before$RANK; if [ $RANK = 0 ]; then echo \"$GRADCOMM_RUN_UNPREFIXED\"; fi; "
                           "echo table$RANK; echo err$RANK >&2; printf tail$RANK"});
  EXPECT_EQ(r.code, 0) << r.err;
  auto out = lines_of(r.out);
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[0] before0", "[1] before1", "[1] table1", "[1] tail1", "table0",
                                           "tail0"}));
  auto err = lines_of(r.err);
  std::sort(err.begin(), err.end());
  EXPECT_EQ(err, (std::vector<std::string>{"[0] err0", "[1] err1"}));
}

// Only the exact line counts: with anything before or after it, it is ordinary output.
TEST(GradcommRunOutput, LineThatOnlyContainsTheDirectiveStaysPrefixed) {
  Result r = run_launcher({"-n", "1", "sh", "-c",
                           "echo \"x$GRADCOMM_RUN_UNPREFIXED\"; echo \"${GRADCOMM_RUN_UNPREFIXED} \"; echo after"});
  EXPECT_EQ(r.code, 0) << r.err;
  auto out = lines_of(r.out);
  ASSERT_EQ(out.size(), 3u) << r.out;
  EXPECT_EQ(out[0].rfind("[0] x#", 0), 0u) << out[0];
  EXPECT_EQ(out[1].rfind("[0] #", 0), 0u) << out[1];
  EXPECT_EQ(out[2], "[0] after");
}

TEST(GradcommRunOutput, LinesOfManyRanksNeverInterleave) {
  constexpr int kRanks = 4, kLines = 2000;
  Result r = run_launcher({"-n", std::to_string(kRanks), "sh", "-c",
                           "i=0; while [ $i -lt " + std::to_string(kLines) +
                               " ]; do echo \"$RANK-$i-" + std::string(100, 'x') + "\"; i=$((i+1)); done"});
  EXPECT_EQ(r.code, 0) << r.err;
  std::regex line_re("^\\[(\\d)\\] (\\d)-(\\d+)-x{100}$");
  std::vector<int> next(kRanks, 0);
  for (const std::string& line : lines_of(r.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << "mangled line: " << line.substr(0, 200);
    int prefix = std::stoi(m[1].str());
    ASSERT_EQ(prefix, std::stoi(m[2].str()));
    ASSERT_EQ(std::stoi(m[3].str()), next[prefix]++) << "rank " << prefix << " lines out of order";
  }
  EXPECT_EQ(next, std::vector<int>(kRanks, kLines));
}

TEST(GradcommRunOutput, LongLineArrivesWhole) {
  Result r = run_launcher({"-n", "1", "sh", "-c", "head -c 300000 /dev/zero | tr '\\0' a; echo"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[0] " + std::string(300000, 'a') + "\n");
}

TEST(GradcommRunOutput, LineOverOneMebibyteIsSplitIntoPrefixedPieces) {
  constexpr size_t kMiB = 1 << 20;
  Result r = run_launcher({"-n", "1", "sh", "-c", "head -c 2621440 /dev/zero | tr '\\0' a; echo"});
  EXPECT_EQ(r.code, 0) << r.err;
  auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "[0] " + std::string(kMiB, 'a'));
  EXPECT_EQ(lines[1], "[0] " + std::string(kMiB, 'a'));
  EXPECT_EQ(lines[2], "[0] " + std::string(kMiB / 2, 'a'));
}

TEST(GradcommRunOutput, LeftoverChildDoesNotHoldTheJobOpen) {
  // The rank leaves a `sleep 3` behind, holding its stdout. The launcher drains for a
  // moment after the last rank ends, then exits; the job ended before --timeout, so
  // the timeout must not fire during that drain.
  Result r = run_launcher({"--timeout", "1", "-n", "1", "sh", "-c", "sleep 3 & sleep 0.5; echo bye"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[0] bye\n");
  EXPECT_EQ(r.err, "");
  EXPECT_LT(r.seconds, 2.9);
}

// ---- failures ---------------------------------------------------------------------------

TEST(GradcommRunFailure, FirstFailureStopsTheOthersAfterTheGracePeriod) {
  Result r = run_launcher(
      {"--grace", "1", "-n", "3", "sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 100"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "gradcomm-run: rank 1 exited with code 3\n")) << r.err;
  EXPECT_TRUE(contains(r.err, "grace period")) << r.err;
  EXPECT_GE(r.seconds, 0.9);   // the sleepers were given the grace period...
  EXPECT_LT(r.seconds, 20.0);  // ...and then killed, long before their sleep ended
}

TEST(GradcommRunFailure, SurvivorsGetSigtermBeforeSigkill) {
  // The sleep loop is explained under "signals to the launcher".
  Result r = run_launcher({"--grace", "0.5", "-n", "2", "sh", "-c",
                           "if [ \"$RANK\" = 0 ]; then sleep 0.3; exit 3; fi; "
                           "trap 'echo rank $RANK got TERM; exit 9' TERM; while :; do sleep 0.1; done"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.out, "[1] rank 1 got TERM\n")) << r.out;
  EXPECT_FALSE(contains(r.err, "SIGKILL")) << r.err;
  EXPECT_LT(r.seconds, 3.5);  // TERM was enough: no wait for the SIGKILL escalation
}

// A stopped rank cannot act on SIGTERM; the launcher continues it, so it ends on the
// stop request instead of waiting out the SIGKILL escalation.
TEST(GradcommRunFailure, StoppedRankIsContinuedAndEndsOnSigterm) {
  Result r = run_launcher({"--grace", "0.5", "-n", "2", "sh", "-c",
                           "if [ \"$RANK\" = 0 ]; then sleep 0.5; exit 3; fi; "
                           "trap 'echo rank $RANK got TERM; exit 9' TERM; kill -STOP $$; while :; do sleep 0.1; done"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.out, "[1] rank 1 got TERM\n")) << r.out;
  EXPECT_FALSE(contains(r.err, "SIGKILL")) << r.err;
  EXPECT_LT(r.seconds, 3.5);
}

TEST(GradcommRunFailure, OthersReportTheirOwnErrorsDuringGrace) {
  Result r = run_launcher({"--grace", "20", "-n", "2", "sh", "-c",
                           "if [ \"$RANK\" = 0 ]; then exit 3; fi; "
                           "sleep 0.5; echo 'rank 1: peer 0 is gone' >&2; exit 5"});
  EXPECT_EQ(r.code, 3) << r.err;  // the first failure's code, not the later one's
  auto first = r.err.find("gradcomm-run: rank 0 exited with code 3");
  auto own = r.err.find("[1] rank 1: peer 0 is gone");
  auto second = r.err.find("gradcomm-run: rank 1 exited with code 5");
  ASSERT_NE(first, std::string::npos) << r.err;
  ASSERT_NE(own, std::string::npos) << r.err;
  ASSERT_NE(second, std::string::npos) << r.err;
  EXPECT_LT(first, own);
  EXPECT_LT(own, second);      // a rank's last words come before the note on its exit
  EXPECT_LT(r.seconds, 10.0);  // everyone ended: no need to sit out the 20 s grace
}

TEST(GradcommRunFailure, EarlyCleanExitIsNotAFailure) {
  Result r = run_launcher(
      {"--grace", "0.1", "-n", "2", "sh", "-c", "if [ \"$RANK\" = 0 ]; then exit 0; fi; sleep 1; echo done"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[1] done\n");
  EXPECT_EQ(r.err, "");
}

TEST(GradcommRunFailure, RankKilledBySignalExits128PlusSignal) {
  Result r = run_launcher({"-n", "2", "--grace", "0", "sh", "-c",
                           "if [ \"$RANK\" = 1 ]; then kill -KILL $$; fi; sleep 100"});
  EXPECT_EQ(r.code, 137);
  EXPECT_TRUE(contains(r.err, "gradcomm-run: rank 1 killed by signal 9 (SIGKILL)\n")) << r.err;
  EXPECT_LT(r.seconds, 20.0);
}

TEST(GradcommRunFailure, ProgramNotFoundExits127) {
  Result r = run_launcher({"-n", "2", "gradcomm-no-such-program", "--flag"});
  EXPECT_EQ(r.code, 127);
  EXPECT_TRUE(contains(r.err, "cannot run 'gradcomm-no-such-program': No such file or directory")) << r.err;
}

TEST(GradcommRunFailure, ProgramNotExecutableExits126) {
  Result r = run_launcher({"-n", "1", "/dev/null"});
  EXPECT_EQ(r.code, 126);
  EXPECT_TRUE(contains(r.err, "cannot run '/dev/null'")) << r.err;
}

TEST(GradcommRunTimeout, TimeoutStopsEveryRankAndExits124) {
  Result r = run_launcher({"--timeout", "1", "-n", "2", "sleep", "100"});
  EXPECT_EQ(r.code, 124);
  EXPECT_TRUE(contains(r.err, "timed out")) << r.err;
  EXPECT_GE(r.seconds, 0.9);
  EXPECT_LT(r.seconds, 20.0);
}

// ---- signals to the launcher --------------------------------------------------------------

// Ranks that trap a signal loop over short sleeps rather than one long one: a signal
// that lands while the shell forks `sleep` can be swallowed by the child before its
// exec (it still has the shell's handler), and the shell runs its trap only once the
// sleep ends. With 0.1 s sleeps that costs 0.1 s, not the test's deadline.

TEST(GradcommRunSignals, SigintIsForwardedToEveryRank) {
  Process p(launcher_argv({"-n", "2", "sh", "-c",
                           "trap 'echo rank $RANK got INT; exit 0' INT; echo ready$RANK; while :; do sleep 0.1; done"}));
  ASSERT_TRUE(p.wait_for_stdout("[0] ready0", 20));
  ASSERT_TRUE(p.wait_for_stdout("[1] ready1", 20));
  p.signal(SIGINT);
  Result r = p.finish();
  EXPECT_EQ(r.code, 128 + SIGINT) << r.err;
  EXPECT_TRUE(contains(r.out, "[0] rank 0 got INT\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "[1] rank 1 got INT\n")) << r.out;
  EXPECT_LT(r.seconds, 20.0);
}

TEST(GradcommRunSignals, SigtermIsForwardedToEveryRank) {
  Process p(launcher_argv({"-n", "2", "sh", "-c",
                           "trap 'echo rank $RANK got TERM; exit 0' TERM; echo ready$RANK; while :; do sleep 0.1; done"}));
  ASSERT_TRUE(p.wait_for_stdout("[0] ready0", 20));
  ASSERT_TRUE(p.wait_for_stdout("[1] ready1", 20));
  p.signal(SIGTERM);
  Result r = p.finish();
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.err;
  EXPECT_TRUE(contains(r.out, "[0] rank 0 got TERM\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "[1] rank 1 got TERM\n")) << r.out;
}

TEST(GradcommRunSignals, SecondSigintKillsRanksThatIgnoreTheFirst) {
  // `trap '' INT` makes the shell and its sleep ignore SIGINT.
  Process p(launcher_argv({"-n", "2", "sh", "-c", "trap '' INT; echo ready$RANK; sleep 100"}));
  ASSERT_TRUE(p.wait_for_stdout("[0] ready0", 20));
  ASSERT_TRUE(p.wait_for_stdout("[1] ready1", 20));
  p.signal(SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  p.signal(SIGINT);
  Result r = p.finish();
  EXPECT_EQ(r.code, 128 + SIGINT) << r.err;
  EXPECT_TRUE(contains(r.err, "again; killing all ranks")) << r.err;
  EXPECT_LT(r.seconds, 9.0);  // well before the 10 s default grace would have run out
}

// ---- arguments and spawning ----------------------------------------------------------------

TEST(GradcommRunArgs, FlagLikeArgumentsAfterTheProgramPassThrough) {
  const std::vector<std::string> script = {"sh", "-c", "printf '<%s>' \"$@\"; echo", "argv0",
                                           "-b", "1K", "--check", "-n", "7", "--timeout=1", "--", "x"};
  const std::string expected = "[0] <-b><1K><--check><-n><7><--timeout=1><--><x>\n";
  std::vector<std::string> plain = {"-n", "1"};
  plain.insert(plain.end(), script.begin(), script.end());
  Result r = run_launcher(plain);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, expected);

  std::vector<std::string> separated = {"--nproc=1", "--grace=2", "--"};
  separated.insert(separated.end(), script.begin(), script.end());
  r = run_launcher(separated);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, expected);
}

// mpirun's spelling: "-np 2" once read as "-n" with the value "p".
TEST(GradcommRunArgs, MpirunStyleNpIsTheRankCount) {
  Result r = run_launcher({"-np", "2", "sh", "-c", "echo rank$RANK of $WORLD_SIZE"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "rank0 of 2")) << r.out;
  EXPECT_TRUE(contains(r.out, "rank1 of 2")) << r.out;
  r = run_launcher({"-np", "p", "true"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "-n needs an integer")) << r.err;
}

TEST(GradcommRunArgs, VersionPrintsTheLibrarysVersion) {
  Result r = run_launcher({"--version"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, std::string("gradcomm-run ") + GRADCOMM_VERSION_STRING + "\n");
}

TEST(GradcommRunArgs, BadUsageExits2WithUsage) {
  const std::vector<std::vector<std::string>> bad = {
      {},
      {"true"},
      {"-n", "0", "true"},
      {"-n", "x", "true"},
      {"-n", "2x", "true"},
      {"-n"},
      {"-n", "1"},
      {"-n", "1", "--"},
      {"--bogus", "-n", "1", "true"},
      {"-n", "1", "--timeout", "0", "true"},
      {"-n", "1", "--grace", "-1", "true"},
      {"-n", "1", "--grace", "soon", "true"},
  };
  for (const auto& args : bad) {
    Result r = run_launcher(args);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_EQ(r.code, 2) << "args: " << joined;
    EXPECT_TRUE(contains(r.err, "usage: gradcomm-run")) << "args: " << joined << "\n" << r.err;
    EXPECT_EQ(r.out, "") << "args: " << joined;
  }
}

TEST(GradcommRunArgs, HelpPrintsUsageAndExits0) {
  Result r = run_launcher({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "usage: gradcomm-run")) << r.out;
  EXPECT_EQ(r.err, "");
}

TEST(GradcommRunSpawn, RanksDoNotInheritEachOthersPipes) {
  // A shell's open fds, as it sees them. Run directly, it shows what this test process
  // passes down; a rank must see exactly that: nothing of the launcher's pipes or of
  // other ranks'.
  const std::string script = "cd /proc/self/fd && echo *";
  Result direct = Process({"/bin/sh", "-c", script}).finish();
  ASSERT_EQ(direct.code, 0) << direct.err;
  Result r = run_launcher({"-n", "4", "sh", "-c", script});
  ASSERT_EQ(r.code, 0) << r.err;
  auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 4u);
  for (const std::string& line : lines) EXPECT_EQ(line.substr(4), lines_of(direct.out).at(0)) << line;
}

}  // namespace
