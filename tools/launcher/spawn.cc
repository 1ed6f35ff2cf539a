// gradcomm-run: the job's environment (free ports, token) and starting one rank.
#include <arpa/inet.h>   // inet_pton, ntohs
#include <fcntl.h>       // open, fcntl, O_CLOEXEC
#include <netinet/in.h>  // sockaddr_in
#include <sys/prctl.h>   // PR_SET_PDEATHSIG
#include <sys/socket.h>  // socket, bind, getsockname
#include <unistd.h>      // fork, pipe2, execvpe

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "launcher.h"

extern char** environ;

namespace gradcomm::launcher {

// ---- environment -----------------------------------------------------------------------

namespace {

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Binds a TCP socket on 127.0.0.1:port (0: any free port); returns the fd and the port,
// or {-1, 0} when that port is taken.
std::pair<int, int> bind_loopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) die("socket: " + errno_text(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return {-1, 0};
  }
  return {fd, ntohs(addr.sin_port)};
}

// The lowest port of the kernel's ephemeral range (ip_local_port_range), where bind(0)
// and every outgoing connection take their local ports; 32768 when it cannot be read.
int ephemeral_low() {
  int lo = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "re")) {
    int a = 0, b = 0;
    if (std::fscanf(f, "%d %d", &a, &b) == 2 && a > 0 && a <= b && b <= 65535) lo = a;
    std::fclose(f);
  }
  return lo;
}

// Two consecutive free TCP ports on 127.0.0.1: MASTER_PORT and MASTER_PORT + 1, the
// port that gradcomm.init() serves its store on when it has only MASTER_ADDR and
// MASTER_PORT to go by (a program that drops GRADCOMM_STORE). They are closed before
// any rank starts, and another process could take one in between, which no launcher
// that passes ports (not sockets) can rule out. So they are drawn at random from
// below the ephemeral range (from 10000 up): there only another listener can take
// them, not the local end of some process's outgoing connection, which is what a
// busy machine (parallel tests, UCX, stores) opens many of a second. Only when no
// such pair is free does bind(0) choose, inside the range. Every socket stays bound
// until a pair is found, so a rejected port is not offered again.
std::pair<int, int> pick_free_ports() {
  std::vector<int> held;
  int first = 0;
  constexpr int kLowest = 10000;
  const int span = ephemeral_low() - 1 - kLowest;  // p in [kLowest, low - 2], so p + 1 is below the range too
  uint64_t seed = (static_cast<uint64_t>(::getpid()) << 32) ^ static_cast<uint64_t>(::time(nullptr));
  for (int attempt = 0; attempt < 128 && first == 0; ++attempt) {
    int port = 0;  // bind(0): the kernel's pick, inside the ephemeral range
    if (attempt < 64 && span > 0) {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;  // an LCG step: any spread will do
      port = kLowest + static_cast<int>((seed >> 33) % static_cast<uint64_t>(span));
    }
    auto [fd, got] = bind_loopback(port);
    if (fd < 0) {
      if (port == 0) break;
      continue;
    }
    held.push_back(fd);
    if (got >= 65535) continue;
    auto [next_fd, next_port] = bind_loopback(got + 1);
    if (next_fd < 0) continue;
    held.push_back(next_fd);
    first = got;
  }
  int err = errno;
  for (int fd : held) ::close(fd);
  if (first == 0) die("cannot find two consecutive free ports on 127.0.0.1: " + errno_text(err));
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
