// Hand-driven store clients for the TCP store tests (test_store_abuse.cc,
// test_store_storm.cc): a blocking raw connection that speaks as much or as little
// of the protocol as a test wants, frame builders, and a wait for the server's
// stats, which trail what a client sees by one loop turn.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/time_scale.h"
#include "store/auth.h"
#include "store/store.h"
#include "store/tcp_store_protocol.h"

namespace gradcomm::detail::store_test {

inline std::vector<uint8_t> bytes(std::string_view s) { return {s.begin(), s.end()}; }

// A blocking loopback connection driven by hand.
class RawClient {
 public:
  explicit RawClient(uint16_t port, const char* ip = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    ::inet_pton(AF_INET, ip, &addr.sin_addr);
    connect_errno_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 ? 0 : errno;
  }
  ~RawClient() { ::close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;
  int connect_errno() const { return connect_errno_; }

  void send_bytes(const std::vector<uint8_t>& data) {
    // MSG_NOSIGNAL: the server may already have closed on us.
    ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
  }

  // Reads exactly n bytes within `timeout`; false on EOF, reset or timeout.
  bool read_exact(uint8_t* out, size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    size_t got = 0;
    while (got < n) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      ssize_t r = ::recv(fd_, out + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  }

  // Completes the handshake with `token`; returns the welcome verdict byte, or -1
  // when the server closed (or stayed silent) before sending one.
  int authenticate(const std::string& token) {
    uint8_t greeting[store_wire::kGreetingBytes];
    if (!read_exact(greeting, sizeof(greeting))) return -1;
    if (greeting[5] & store_wire::kFlagAuthRequired) {
      AuthProof proof = make_auth_proof(token, std::span<const uint8_t>(greeting + 8, store_wire::kNonceBytes));
      send_bytes(std::vector<uint8_t>(proof.begin(), proof.end()));
    }
    uint8_t welcome[store_wire::kWelcomeBytes];
    if (!read_exact(welcome, sizeof(welcome))) return -1;
    return welcome[4];
  }

  struct Outcome {
    bool closed = false;  // EOF or reset seen
    size_t bytes = 0;     // bytes received before that
  };
  // Drains the socket until the server closes it or `timeout` passes.
  Outcome wait_closed(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    Outcome outcome;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    uint8_t buffer[4096];
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return outcome;
      ssize_t r = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (r == 0 || (r < 0 && errno == ECONNRESET)) {
        outcome.closed = true;
        return outcome;
      }
      if (r > 0) outcome.bytes += static_cast<size_t>(r);
    }
  }

 private:
  int fd_ = -1;
  int connect_errno_ = 0;
};

using gradcomm::testing::time_scale;  // common/time_scale.h

// The server publishes its stats at the end of each loop turn, a moment after the
// effect a client sees: wait a little (or `limit`) for them.
template <class Predicate>
bool eventually(Predicate predicate, std::chrono::milliseconds limit = std::chrono::seconds(2)) {
  auto deadline = std::chrono::steady_clock::now() + limit * time_scale();
  while (!predicate()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

inline std::vector<uint8_t> request_header(uint8_t op, uint32_t key_len, uint64_t value_len) {
  std::vector<uint8_t> h(store_wire::kRequestHeaderBytes, 0);
  h[0] = op;
  store_wire::put_u32(h.data() + 4, key_len);
  store_wire::put_u64(h.data() + 8, value_len);
  return h;
}

// A rank's client (rank >= 1, so create_store starts no server) on 127.0.0.1:port.
inline std::unique_ptr<Store> client(uint16_t port, const std::string& token,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(10), int rank = 1,
                                     int world_size = 1) {
  StoreOptions options;
  options.url = "tcp://127.0.0.1:" + std::to_string(port);
  options.rank = rank;
  options.world_size = world_size;
  options.job_token = token;
  options.timeout = timeout;
  return create_store(options);
}

}  // namespace gradcomm::detail::store_test
