// Pieces of gradcomm-run shared by its files: options (options.cc), messages and the
// per-pipe line relay (output.cc), the job's environment and starting one rank
// (spawn.cc). Supervision and main are in tools/gradcomm_run.cc, which explains the
// behaviour as a whole. Nothing here links gradcomm: the launcher starts any program.
#pragma once

#include <signal.h>     // sigset_t
#include <sys/types.h>  // pid_t

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gradcomm::launcher {

using Clock = std::chrono::steady_clock;

// Exit codes, shell conventions.
constexpr int kExitUsage = 2;
constexpr int kExitTimeout = 124;
constexpr int kExitCannotExecute = 126;
constexpr int kExitNotFound = 127;

// ---- messages (output.cc) -------------------------------------------------------------

// Writes all of `s` to `fd`. A reader that went away (EPIPE; SIGPIPE is ignored) drops
// the output: the ranks still need supervising.
void write_all(int fd, std::string_view s);
// "gradcomm-run: <message>" on stderr.
void note(const std::string& message);
[[noreturn]] void die(const std::string& message, int code = 1);
std::string errno_text(int err);
std::string signal_name(int sig);  // "SIGKILL"
std::string format_seconds(double s);
// "exited with code 1" / "killed by signal 9 (SIGKILL)", for a waitpid status.
std::string describe_status(int status);
// The exit code, or 128 + the signal number.
int exit_code_of(int status);

// ---- options (options.cc) -------------------------------------------------------------

extern const char kUsage[];

struct Options {
  enum class Action { kRun, kHelp, kVersion };
  Action action = Action::kRun;
  int nprocs = 0;
  std::optional<double> timeout_s;
  double grace_s = 10.0;
  std::vector<std::string> command;  // PROGRAM ARGS...
};

struct UsageError {
  std::string message;
};

// Launcher flags end at `--` or at the first argument that is not a flag (PROGRAM);
// nothing after that is looked at, so PROGRAM's own flags pass through. Returns
// action kHelp / kVersion for --help / --version (nothing else is then checked).
// Throws UsageError.
Options parse_options(int argc, char** argv);

// ---- output relay (output.cc) ---------------------------------------------------------

// A rank that prints a table for other programs to parse (gradcomm-bench's nccl-tests
// columns) can opt out of the "[R] " prefix: a line that is exactly kUnprefixedLine,
// written to stdout or stderr, is swallowed, and every later line of that stream goes
// out as written. gradcomm-run hands the line to every rank in kUnprefixedEnv, so a
// program prints it only under a launcher that understands it. It starts with '#' so
// that, should it leak (a nested launcher), nccl-tests-style parsers take it for a comment.
inline constexpr std::string_view kUnprefixedEnv = "GRADCOMM_RUN_UNPREFIXED";
inline constexpr std::string_view kUnprefixedLine = "#gradcomm-run: unprefixed from here";

// Relays one rank's pipe to one of the launcher's fds, a whole line at a time, each line
// prefixed "[R] " (until kUnprefixedLine). Invariant: pending_ holds only the bytes after the last newline read
// (fewer than kMaxLineBytes); everything before has been written. The launcher is the
// only writer and is single-threaded, so lines of different ranks never mix.
class LineRelay {
 public:
  static constexpr size_t kReadChunk = 64 * 1024;
  static constexpr size_t kMaxLineBytes = 1 << 20;  // longer lines go out in prefixed pieces

  // Takes ownership of `fd` (non-blocking, read end of the rank's pipe).
  void attach(int fd, int target_fd, std::string prefix);
  int fd() const { return fd_; }
  bool is_open() const { return fd_ >= 0; }
  // Reads at most `max_reads` chunks (one per poll wakeup keeps a chatty rank from
  // starving the others). Closes at EOF or on a read error.
  void pump(int max_reads);
  // Emits a partial last line (with a newline added) and closes the pipe.
  void close();

 private:
  void consume(std::string_view data);
  // Whether pending_ + `line` (which ends in its newline) is kUnprefixedLine.
  bool is_unprefixed_line(std::string_view line) const;

  int fd_ = -1;
  int target_fd_ = -1;
  std::string prefix_;
  std::string pending_;
};

// ---- spawning (spawn.cc) --------------------------------------------------------------

// The launcher's environment with the variables it owns (WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, GRADCOMM_STORE, ...) set for a job of `nprocs` ranks; RANK and
// LOCAL_RANK are added per rank by spawn(). A caller's GRADCOMM_JOB_TOKEN is kept.
std::vector<std::string> job_environment(int nprocs);

struct Rank {
  int index = 0;
  pid_t pid = -1;  // also its process group id
  bool running = false;
  LineRelay out, err;
};

// Starts `rank` in its own process group, stdin /dev/null, stdout/stderr into `rank.out`
// and `rank.err`, signal mask `child_mask`; waits until its exec succeeded or failed.
// Returns 0 on success or an errno: with rank.pid > 0 the exec failed (the child has
// _exit'ed and is reaped as usual), otherwise no child was made.
int spawn(Rank& rank, const std::vector<std::string>& command, const std::vector<std::string>& env,
          const sigset_t& child_mask);

}  // namespace gradcomm::launcher
