// gradcomm-run's messages and the line relay that prefixes each rank's output (unless
// the rank opts out with kUnprefixedLine, launcher.h).
#include <poll.h>      // poll, for a non-blocking target fd
#include <sys/wait.h>  // WIFEXITED and friends
#include <unistd.h>    // read, write, close

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>  // strerror, sigabbrev_np

#include "launcher.h"

namespace gradcomm::launcher {

// ---- messages -------------------------------------------------------------------------

void write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::write(fd, s.data(), s.size());
    if (n > 0) {
      s.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else if (!(n < 0 && errno == EINTR)) {
      return;
    }
  }
}

void note(const std::string& message) { write_all(STDERR_FILENO, "gradcomm-run: " + message + "\n"); }

void die(const std::string& message, int code) {
  note(message);
  std::exit(code);
}

std::string errno_text(int err) { return std::strerror(err); }

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "unknown signal";
}

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  int sig = WTERMSIG(status);
  std::string text = "killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
  if (WCOREDUMP(status)) text += ", core dumped";
  return text;
}

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// ---- output relay -----------------------------------------------------------------------

void LineRelay::attach(int fd, int target_fd, std::string prefix) {
  fd_ = fd;
  target_fd_ = target_fd;
  prefix_ = std::move(prefix);
}

void LineRelay::pump(int max_reads) {
  char buf[kReadChunk];
  for (int k = 0; k < max_reads && is_open(); ++k) {
    ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n > 0) {
      consume(std::string_view(buf, static_cast<size_t>(n)));
    } else if (n < 0 && errno == EINTR) {
      --k;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      close();
    }
  }
}

void LineRelay::close() {
  if (!pending_.empty()) write_all(target_fd_, prefix_ + pending_ + "\n");
  pending_.clear();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool LineRelay::is_unprefixed_line(std::string_view line) const {
  if (prefix_.empty() || pending_.size() + line.size() != kUnprefixedLine.size() + 1) return false;
  return kUnprefixedLine.starts_with(pending_) &&
         kUnprefixedLine.substr(pending_.size()) == line.substr(0, line.size() - 1);
}

// Everything up to the last newline in pending_ + data goes out in one write.
void LineRelay::consume(std::string_view data) {
  std::string out;
  size_t start = 0;
  for (size_t nl; (nl = data.find('\n', start)) != std::string_view::npos; start = nl + 1) {
    std::string_view line = data.substr(start, nl + 1 - start);
    if (is_unprefixed_line(line)) {
      prefix_.clear();  // the directive itself is not relayed
    } else {
      out += prefix_;
      out += pending_;
      out.append(line);
    }
    pending_.clear();
  }
  pending_.append(data.substr(start));
  // An over-long line goes out in prefixed pieces: memory stays bounded and every
  // output line still starts with its rank.
  while (pending_.size() >= kMaxLineBytes) {
    out += prefix_;
    out.append(pending_, 0, kMaxLineBytes);
    out += '\n';
    pending_.erase(0, kMaxLineBytes);
  }
  write_all(target_fd_, out);
}

}  // namespace gradcomm::launcher
