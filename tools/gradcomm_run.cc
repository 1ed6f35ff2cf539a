// gradcomm-run: start N local ranks of a program and supervise them.
//
//   gradcomm-run -n N [--timeout S] [--grace S] [--] PROGRAM [ARGS...]
//
// Every rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/MASTER_PORT
// (for torch.distributed and friends), GRADCOMM_STORE on MASTER_PORT + 1 (gradcomm's
// own store, so both can run in one job) and a shared GRADCOMM_JOB_TOKEN. Each rank's
// stdout and stderr come back through pipes and are re-emitted one whole line at a
// time, prefixed "[R] ".
//
// Supervision, in one poll loop over the pipes, a signalfd and the deadlines:
//   - a rank exiting non-zero (or killed) is noted; the others get --grace seconds to
//     end on their own and print their own errors; then SIGTERM, then SIGKILL after
//     kKillAfter. The launcher exits with the first failing rank's code (128+signo for
//     a signal). A rank exiting 0 early is normal.
//   - --timeout: the whole job's wall-clock limit; on expiry SIGTERM/SIGKILL, exit 124.
//   - SIGINT/SIGTERM/SIGHUP to the launcher are forwarded to every rank; a second one
//     kills them. The launcher then exits 128+signo.
// Whichever of these happens first decides the exit code.
//
// Each rank runs in its own process group, so signals reach its children too (a shell
// rank's `sleep`), and a terminal's Ctrl-C reaches the ranks once, through the
// launcher, not twice. Ranks read /dev/null on stdin: they are not in the terminal's
// foreground group, so reading the terminal would stop them.
//
// This file: supervision and main. launcher/: options, output relay, spawning.

#include <fcntl.h>         // fcntl, open
#include <poll.h>          // poll
#include <signal.h>        // sigaction, sigprocmask, kill
#include <sys/signalfd.h>  // signalfd
#include <sys/wait.h>      // waitpid
#include <unistd.h>        // read

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "gradcomm/version.h"  // GRADCOMM_VERSION_STRING (a header only: nothing to link)
#include "launcher/launcher.h"

namespace gradcomm::launcher {
namespace {

using Seconds = std::chrono::duration<double>;

constexpr auto kKillAfter = std::chrono::seconds(3);       // SIGTERM → SIGKILL
constexpr auto kDrainAfterExit = std::chrono::seconds(1);  // output of leftover grandchildren

// ---- supervision -----------------------------------------------------------------------

class Supervisor {
 public:
  Supervisor(const Options& opts, int signal_fd) : opts_(opts), signal_fd_(signal_fd), ranks_(opts.nprocs) {
    for (int r = 0; r < opts.nprocs; ++r) ranks_[r].index = r;
    if (opts.timeout_s) job_deadline_ = Clock::now() + deadline_from(*opts.timeout_s);
  }

  // Starts the ranks in order; on the first that cannot start, stops those already
  // running and starts no more.
  void start(const sigset_t& child_mask) {
    std::vector<std::string> env = job_environment(opts_.nprocs);
    for (Rank& rank : ranks_) {
      int err = spawn(rank, opts_.command, env, child_mask);
      if (err == 0) continue;
      // A failed exec leaves a child (already _exit'ed) to reap; a failed fork or pipe
      // leaves none. Either way the stop below makes its exit unremarkable.
      if (rank.pid > 0) {
        note("cannot run '" + opts_.command[0] + "': " + errno_text(err));
        record_outcome(err == ENOENT ? kExitNotFound : kExitCannotExecute);
      } else {
        note("cannot start rank " + std::to_string(rank.index) + ": " + errno_text(err));
        record_outcome(1);
      }
      stop_all(SIGTERM);
      return;
    }
  }

  // The poll loop; returns the launcher's exit code.
  int run() {
    std::optional<Clock::time_point> drain_deadline;
    for (;;) {
      bool any_running = std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; });
      if (!any_running && !drain_deadline) {
        // Every rank has ended: what is left is output from processes they left behind
        // (still holding the pipes), which gets kDrainAfterExit and no more. The job's
        // outcome is settled, so no timeout or escalation may fire now.
        drain_deadline = Clock::now() + kDrainAfterExit;
        job_deadline_.reset();
        grace_deadline_.reset();
        kill_deadline_.reset();
      }
      std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
      std::vector<LineRelay*> relays;
      for (Rank& rank : ranks_) {
        for (LineRelay* relay : {&rank.out, &rank.err}) {
          if (!relay->is_open()) continue;
          fds.push_back({relay->fd(), POLLIN, 0});
          relays.push_back(relay);
        }
      }
      if (!any_running && (relays.empty() || Clock::now() >= *drain_deadline)) break;

      int n = ::poll(fds.data(), fds.size(), poll_timeout_ms(drain_deadline));
      if (n < 0 && errno != EINTR) die("poll: " + errno_text(errno));
      if (n > 0) {
        for (size_t k = 1; k < fds.size(); ++k) {
          if (fds[k].revents) relays[k - 1]->pump(1);
        }
        if (fds[0].revents) handle_signals();
      }
      handle_deadlines();
    }
    for (Rank& rank : ranks_) {
      rank.out.close();
      rank.err.close();
    }
    return outcome_.value_or(0);
  }

 private:
  static Clock::duration deadline_from(double seconds) {
    return std::chrono::duration_cast<Clock::duration>(Seconds(seconds));
  }

  // The first failure, timeout or interrupt decides the exit code; later ones don't.
  void record_outcome(int code) {
    if (!outcome_) outcome_ = code;
  }

  void handle_signals() {
    signalfd_siginfo info;
    while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) {
        reap();
      } else if (++interrupts_ == 1) {
        note("received " + signal_name(sig) + "; forwarding it to all ranks (send it again to kill them)");
        record_outcome(128 + sig);
        // Ranks may be saving a checkpoint: unless a stop is already under way, they
        // get the grace period, not kKillAfter, before SIGKILL.
        bool was_stopping = stop_sent_;
        stop_all(sig);
        if (!was_stopping) kill_deadline_ = Clock::now() + deadline_from(opts_.grace_s);
      } else {
        note("received " + signal_name(sig) + " again; killing all ranks");
        signal_all(SIGKILL);
      }
    }
  }

  // SIGCHLDs coalesce, so one signal may stand for several exits: reap all there are.
  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      auto it = std::find_if(ranks_.begin(), ranks_.end(), [pid](const Rank& r) { return r.pid == pid; });
      if (it == ranks_.end()) continue;
      on_exit(*it, status);
    }
  }

  void on_exit(Rank& rank, int status) {
    rank.running = false;
    // What the rank wrote before exiting is already in its pipes: print it before the
    // note, so a rank's own last words come first.
    rank.out.pump(64);
    rank.err.pump(64);
    // Once the launcher has asked ranks to stop, their deaths are its doing, not news.
    if (exit_code_of(status) == 0 || stop_sent_) return;
    note("rank " + std::to_string(rank.index) + " " + describe_status(status));
    if (!outcome_) {
      record_outcome(exit_code_of(status));
      grace_deadline_ = Clock::now() + deadline_from(opts_.grace_s);
    }
  }

  void handle_deadlines() {
    auto now = Clock::now();
    if (job_deadline_ && now >= *job_deadline_) {
      job_deadline_.reset();
      note("job timed out after " + format_seconds(*opts_.timeout_s) + "; stopping all ranks");
      record_outcome(kExitTimeout);
      stop_all(SIGTERM);
    }
    if (grace_deadline_ && now >= *grace_deadline_) {
      grace_deadline_.reset();
      std::string left = running_list();
      if (!left.empty()) {
        note("grace period of " + format_seconds(opts_.grace_s) + " over; sending SIGTERM to rank(s) " + left);
      }
      stop_all(SIGTERM);
    }
    if (kill_deadline_ && now >= *kill_deadline_) {
      kill_deadline_.reset();
      std::string left = running_list();
      if (!left.empty()) note("rank(s) " + left + " still running; sending SIGKILL");
      signal_all(SIGKILL);
    }
  }

  // Sends `sig` to every running rank and arms the SIGKILL escalation. Idempotent
  // apart from the signal itself.
  void stop_all(int sig) {
    stop_sent_ = true;
    grace_deadline_.reset();
    signal_all(sig);
    // A stopped rank (SIGSTOP, a debugger's Ctrl-Z) would hold its signal pending until
    // SIGKILL: continue it, so it acts on the stop request now, as a shell's kill does.
    signal_all(SIGCONT);
    if (!kill_deadline_) kill_deadline_ = Clock::now() + kKillAfter;
  }

  // To the whole process group, so a rank's own children (a shell's `sleep`) get it too.
  void signal_all(int sig) {
    for (const Rank& rank : ranks_) {
      if (rank.running) ::kill(-rank.pid, sig);
    }
  }

  std::string running_list() const {
    std::string list;
    for (const Rank& rank : ranks_) {
      if (!rank.running) continue;
      if (!list.empty()) list += ", ";
      list += std::to_string(rank.index);
    }
    return list;
  }

  int poll_timeout_ms(const std::optional<Clock::time_point>& drain_deadline) const {
    std::optional<Clock::time_point> next;
    for (const auto& d : {job_deadline_, grace_deadline_, kill_deadline_, drain_deadline}) {
      if (d && (!next || *d < *next)) next = d;
    }
    if (!next) return -1;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(ms, 0, 60'000));
  }

  const Options& opts_;
  int signal_fd_;
  std::vector<Rank> ranks_;  // sized once; never reallocated (relays hold their fds)
  std::optional<int> outcome_;
  std::optional<Clock::time_point> job_deadline_, grace_deadline_, kill_deadline_;
  bool stop_sent_ = false;
  int interrupts_ = 0;
};

// ---- main ------------------------------------------------------------------------------

// Makes sure fds 0-2 are open, so no pipe the launcher creates lands on them (dup2 onto
// an fd equal to its source would keep O_CLOEXEC and the child would lose its stdout).
void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      int null_fd = ::open("/dev/null", O_RDWR);
      if (null_fd >= 0 && null_fd != fd) ::close(null_fd);
    }
  }
}

}  // namespace
}  // namespace gradcomm::launcher

int main(int argc, char** argv) {
  using namespace gradcomm::launcher;
  ensure_standard_fds();
  Options opts;
  try {
    opts = parse_options(argc, argv);
  } catch (const UsageError& e) {
    write_all(STDERR_FILENO, "gradcomm-run: " + e.message + "\n" + kUsage);
    return kExitUsage;
  }
  if (opts.action == Options::Action::kHelp) {
    write_all(STDOUT_FILENO, kUsage);
    return 0;
  }
  if (opts.action == Options::Action::kVersion) {
    write_all(STDOUT_FILENO, std::string("gradcomm-run ") + GRADCOMM_VERSION_STRING + "\n");
    return 0;
  }

  // Signals arrive through a signalfd, read in the poll loop. They must be at their
  // default disposition first: an ignored signal (a shell's background job has SIGINT
  // ignored) is discarded, not queued, and could then never be forwarded.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::sigaction(sig, &dfl, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t handled, original;
  sigemptyset(&handled);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&handled, sig);
  ::sigprocmask(SIG_BLOCK, &handled, &original);
  int signal_fd = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd < 0) die("signalfd: " + errno_text(errno));

  Supervisor supervisor(opts, signal_fd);
  supervisor.start(original);
  return supervisor.run();
}
