// Small POSIX socket helpers for the TCP store: an owning fd, name resolution,
// and deadline-bounded full reads/writes on nonblocking sockets. Every helper
// retries EINTR and waits on EAGAIN with poll(), so callers see only whole
// transfers, a closed peer, a timeout, or an errno.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "env.h"

namespace gradcomm::detail {

// Owns one file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_UNSPEC;
};

// "127.0.0.1:29500" or "[::1]:29500".
std::string format_address(const SocketAddress& address);
// Host as written in a URL: IPv6 literals in brackets.
std::string format_host_port(const std::string& host, uint16_t port);

// Resolves host:port for TCP (numeric service). Returns an empty vector and sets
// `error` on failure; `retriable` says whether trying again later could help
// (EAI_AGAIN: the resolver was busy).
std::vector<SocketAddress> resolve_tcp(const std::string& host, uint16_t port, std::string& error, bool& retriable);

void set_nonblocking(int fd);

enum class IoStatus { kOk, kClosed, kTimeout, kError };
struct IoResult {
  IoStatus status = IoStatus::kOk;
  size_t transferred = 0;  // bytes moved before the status was reached
  int error = 0;           // errno for kError
};

// Writes all of `size` bytes with MSG_NOSIGNAL (a closed peer is EPIPE, not SIGPIPE).
IoResult write_full(int fd, const uint8_t* data, size_t size, const Deadline& deadline);
// Reads exactly `size` bytes; kClosed when the peer shut down first.
IoResult read_full(int fd, uint8_t* data, size_t size, const Deadline& deadline);
// Wait for the socket to become readable / writable (or closed, or failed);
// false at the deadline.
bool wait_readable(int fd, const Deadline& deadline);
bool wait_writable(int fd, const Deadline& deadline);

// "Connection refused" etc., for messages.
std::string errno_text(int error);

}  // namespace gradcomm::detail
