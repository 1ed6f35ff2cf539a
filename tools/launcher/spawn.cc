// gradcomm-run: the job's environment (free ports, token) and starting one rank.
#include <fcntl.h>       // open, fcntl, O_CLOEXEC
#include <sys/prctl.h>   // PR_SET_PDEATHSIG
#include <unistd.h>      // fork, pipe2, execvpe

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <vector>

#include "free_port.h"  // base/
#include "launcher.h"

extern char** environ;

namespace gradcomm::launcher {

// ---- environment -----------------------------------------------------------------------

namespace {

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Two consecutive free TCP ports on 127.0.0.1 (base/free_port.h says how they are
// drawn): MASTER_PORT and MASTER_PORT + 1, the port that gradcomm.init() serves its
// store on when it has only MASTER_ADDR and MASTER_PORT to go by (a program that drops
// GRADCOMM_STORE). They are closed before any rank starts; another listener could take
// one in between, which no launcher that passes ports (not sockets) can rule out.
std::pair<int, int> pick_free_ports() {
  const int first = detail::free_loopback_ports(2);
  if (first == 0) die("cannot find two consecutive free ports on 127.0.0.1: " + errno_text(errno));
  return {first, first + 1};
}

// 32 bytes from the kernel's CSPRNG, as 64 lowercase hex digits.
std::string random_token_hex() {
  unsigned char bytes[32];
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) die("cannot open /dev/urandom: " + errno_text(errno));
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::read(fd, bytes + got, sizeof bytes - got);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (!(n < 0 && errno == EINTR)) {
      die("cannot read /dev/urandom");
    }
  }
  ::close(fd);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : bytes) {
    hex += kHex[b >> 4];
    hex += kHex[b & 15];
  }
  return hex;
}

}  // namespace

std::vector<std::string> job_environment(int nprocs) {
  static constexpr std::string_view kOwned[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                "MASTER_ADDR", "MASTER_PORT", "GRADCOMM_STORE",
                                                "GRADCOMM_JOB_TOKEN", kUnprefixedEnv};
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string_view entry = *e;
    std::string_view name = entry.substr(0, entry.find('='));
    if (std::find(std::begin(kOwned), std::end(kOwned), name) == std::end(kOwned)) env.emplace_back(entry);
  }
  const char* caller_token = std::getenv("GRADCOMM_JOB_TOKEN");
  auto [master_port, store_port] = pick_free_ports();
  env.push_back("WORLD_SIZE=" + std::to_string(nprocs));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(nprocs));
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back("MASTER_PORT=" + std::to_string(master_port));
  env.push_back("GRADCOMM_STORE=tcp://127.0.0.1:" + std::to_string(store_port));
  env.push_back("GRADCOMM_JOB_TOKEN=" +
                (caller_token && *caller_token ? std::string(caller_token) : random_token_hex()));
  env.push_back(std::string(kUnprefixedEnv) + "=" + std::string(kUnprefixedLine));  // LineRelay
  return env;
}

// ---- spawning --------------------------------------------------------------------------

// All fds made here are O_CLOEXEC, so no rank inherits another's pipes; dup2 onto
// 0/1/2 clears the flag for the child's own three.
int spawn(Rank& rank, const std::vector<std::string>& command, const std::vector<std::string>& env,
          const sigset_t& child_mask) {
  int out[2], err[2], status[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 || ::pipe2(status, O_CLOEXEC) != 0) {
    return errno;
  }
  // argv and envp are built before fork: the child only makes async-signal-safe calls.
  std::vector<std::string> rank_env = env;
  rank_env.push_back("RANK=" + std::to_string(rank.index));
  rank_env.push_back("LOCAL_RANK=" + std::to_string(rank.index));
  std::vector<char*> argv, envp;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : rank_env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t launcher = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) return errno;
  if (pid == 0) {
    // Undo what the launcher changed: blocked signals (for its signalfd) and ignored
    // ones (an ignored disposition survives exec).
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD, SIGQUIT}) ::sigaction(sig, &dfl, nullptr);
    ::sigprocmask(SIG_SETMASK, &child_mask, nullptr);
    ::setpgid(0, 0);
    // Best effort against orphans if the launcher is SIGKILLed (reaches the rank, not
    // its children). The check catches a launcher that died before the prctl.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(1);
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::execvpe(argv[0], argv.data(), envp.data());
    int exec_errno = errno;
    ssize_t ignored = ::write(status[1], &exec_errno, sizeof exec_errno);
    (void)ignored;
    ::_exit(kExitNotFound);
  }

  // Also set here: whichever of parent and child runs first, the group exists before
  // the launcher might signal it.
  ::setpgid(pid, pid);
  ::close(out[1]);
  ::close(err[1]);
  ::close(status[1]);
  rank.pid = pid;
  rank.running = true;
  set_nonblocking(out[0]);
  set_nonblocking(err[0]);
  std::string prefix = "[" + std::to_string(rank.index) + "] ";
  rank.out.attach(out[0], STDOUT_FILENO, prefix);
  rank.err.attach(err[0], STDERR_FILENO, prefix);

  // EOF means exec succeeded (CLOEXEC closed the child's end); an int is its errno.
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(status[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  ::close(status[0]);
  return n == static_cast<ssize_t>(sizeof exec_errno) ? exec_errno : 0;
}

}  // namespace gradcomm::launcher
