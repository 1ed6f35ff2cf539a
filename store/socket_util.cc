#include "store/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "gradcomm/errors.h"

namespace gradcomm::detail {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) {
    // close() is not retried on EINTR: on Linux the descriptor is released anyway,
    // and a retry could close a descriptor another thread just received.
    ::close(fd_);
  }
  fd_ = fd;
}

std::string errno_text(int error) {
  char buffer[256];
  // GNU strerror_r returns the message pointer (possibly not `buffer`).
  return strerror_r(error, buffer, sizeof(buffer));
}

std::string format_host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

std::string format_address(const SocketAddress& address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address.storage);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return format_host_port(text, ntohs(in->sin_port));
  }
  if (address.family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address.storage);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    return format_host_port(text, ntohs(in6->sin6_port));
  }
  return "<unknown address family>";
}

std::vector<SocketAddress> resolve_tcp(const std::string& host, uint16_t port, std::string& error, bool& retriable) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  std::vector<SocketAddress> out;
  if (rc != 0) {
    error = rc == EAI_SYSTEM ? errno_text(errno) : gai_strerror(rc);
    retriable = rc == EAI_AGAIN;
    return out;
  }
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
    SocketAddress address;
    std::memcpy(&address.storage, ai->ai_addr, ai->ai_addrlen);
    address.length = ai->ai_addrlen;
    address.family = ai->ai_family;
    out.push_back(address);
  }
  freeaddrinfo(list);
  if (out.empty()) {
    error = "no IPv4/IPv6 address";
    retriable = false;
  }
  return out;
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw TransportError(fmt::format("store: cannot make socket {} nonblocking: {}", fd, errno_text(errno)));
  }
}

namespace {

// Polls one fd for `events` until the deadline. Returns false at the deadline.
// A hang-up or error counts as ready: the next recv/send reports it precisely.
bool wait_for(int fd, short events, const Deadline& deadline) {
  for (;;) {
    auto remaining = deadline.remaining().count();
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(remaining, INT_MAX)));
    if (rc > 0) return true;
    if (rc == 0) {
      if (deadline.expired()) return false;
      continue;  // poll's millisecond rounding woke us a little early
    }
    if (errno != EINTR) return true;  // let the caller's syscall surface the error
  }
}

}  // namespace

bool wait_readable(int fd, const Deadline& deadline) { return wait_for(fd, POLLIN, deadline); }
bool wait_writable(int fd, const Deadline& deadline) { return wait_for(fd, POLLOUT, deadline); }

IoResult write_full(int fd, const uint8_t* data, size_t size, const Deadline& deadline) {
  IoResult result;
  while (result.transferred < size) {
    ssize_t n = ::send(fd, data + result.transferred, size - result.transferred, MSG_NOSIGNAL);
    if (n > 0) {
      result.transferred += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_for(fd, POLLOUT, deadline)) {
        result.status = IoStatus::kTimeout;
        return result;
      }
      continue;
    }
    int error = n < 0 ? errno : EPIPE;
    result.status = (error == EPIPE || error == ECONNRESET) ? IoStatus::kClosed : IoStatus::kError;
    result.error = error;
    return result;
  }
  return result;
}

IoResult read_full(int fd, uint8_t* data, size_t size, const Deadline& deadline) {
  IoResult result;
  while (result.transferred < size) {
    ssize_t n = ::recv(fd, data + result.transferred, size - result.transferred, 0);
    if (n > 0) {
      result.transferred += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      result.status = IoStatus::kClosed;
      return result;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(fd, POLLIN, deadline)) {
        result.status = IoStatus::kTimeout;
        return result;
      }
      continue;
    }
    result.error = errno;
    result.status = errno == ECONNRESET ? IoStatus::kClosed : IoStatus::kError;
    return result;
  }
  return result;
}

}  // namespace gradcomm::detail
