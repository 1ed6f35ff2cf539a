#include "store_attacks.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

namespace gradcomm::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kGreetingBytes = 40;  // store/tcp_store_protocol.h: magic, version, flags, nonce[32]
constexpr size_t kWelcomeBytes = 24;
constexpr const char* kAuthContext = "gradcomm-store-auth-v1";

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  bool send_all(const void* data, size_t bytes) const {
    const auto* p = static_cast<const uint8_t*>(data);
    while (bytes > 0) {
      const ssize_t n = ::send(fd_, p, bytes, MSG_NOSIGNAL);
      if (n <= 0) return false;
      p += n;
      bytes -= static_cast<size_t>(n);
    }
    return true;
  }
  // Reads exactly `bytes` within 5 s.
  bool recv_exact(void* data, size_t bytes) const {
    auto* p = static_cast<uint8_t*>(data);
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (bytes > 0) {
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, 100) < 0 || Clock::now() > deadline) return false;
      if (!(pfd.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = ::recv(fd_, p, bytes, 0);
      if (n <= 0) return false;
      p += n;
      bytes -= static_cast<size_t>(n);
    }
    return true;
  }
  // True when the peer closes (EOF or reset) within `seconds`, whatever it sends first.
  bool closed_within(int seconds) const {
    const auto deadline = Clock::now() + std::chrono::seconds(seconds);
    uint8_t sink[4096];
    while (Clock::now() < deadline) {
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, 100) <= 0) continue;
      const ssize_t n = ::recv(fd_, sink, sizeof sink, 0);
      if (n <= 0) return true;
    }
    return false;
  }

 private:
  int fd_;
};

Socket connect_with_retry(const std::string& host, int port) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (true) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return Socket(fd);
    ::close(fd);
    if (Clock::now() > deadline) return Socket(-1);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::vector<uint8_t> proof(const std::string& token, const uint8_t* nonce) {
  std::vector<uint8_t> message(nonce, nonce + 32);
  message.insert(message.end(), kAuthContext, kAuthContext + std::strlen(kAuthContext));
  std::vector<uint8_t> out(32);
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), message.data(), message.size(), out.data(), &len);
  return out;
}

}  // namespace

std::vector<AttackResult> attack_store(const std::string& url, const std::string& token) {
  const std::string rest = url.substr(url.find("://") + 3);
  const std::string host = rest.substr(0, rest.rfind(':'));
  const int port = std::stoi(rest.substr(rest.rfind(':') + 1));
  std::vector<AttackResult> results;

  {  // 1. Random bytes straight away.
    Socket s = connect_with_retry(host, port);
    std::mt19937 rng(static_cast<unsigned>(::getpid()));
    std::vector<uint8_t> junk(4096);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    s.send_all(junk.data(), junk.size());
    results.push_back({"random_bytes", s.fd() >= 0 && s.closed_within(10), ""});
  }
  {  // 2. An HTTP request.
    Socket s = connect_with_retry(host, port);
    const std::string http = "GET / HTTP/1.1\r\nHost: gradcomm\r\nUser-Agent: curl/8\r\n\r\n";
    s.send_all(http.data(), http.size());
    results.push_back({"http_request", s.fd() >= 0 && s.closed_within(10), ""});
  }
  {  // 3. A client with the wrong token.
    Socket s = connect_with_retry(host, port);
    uint8_t greeting[kGreetingBytes];
    bool ok = s.recv_exact(greeting, sizeof greeting);
    const auto wrong = proof(token + "-not-it", greeting + 8);
    ok = ok && s.send_all(wrong.data(), wrong.size());
    results.push_back({"wrong_token", ok && s.closed_within(10), ok ? "" : "no greeting"});
  }
  {  // 4. Authenticated, then a request claiming a 2^64-1 byte value.
    Socket s = connect_with_retry(host, port);
    uint8_t greeting[kGreetingBytes];
    uint8_t welcome[kWelcomeBytes];
    bool ok = s.recv_exact(greeting, sizeof greeting);
    const auto right = proof(token, greeting + 8);
    ok = ok && s.send_all(right.data(), right.size()) && s.recv_exact(welcome, sizeof welcome) && welcome[4] == 0;
    uint8_t header[16] = {1 /* SET */, 0, 0, 0, 4, 0, 0, 0};
    std::memset(header + 8, 0xFF, 8);  // value length 2^64-1
    ok = ok && s.send_all(header, sizeof header) && s.send_all("key!", 4);
    results.push_back({"length_2^64-1", ok && s.closed_within(10), ok ? "" : "authentication failed"});
  }
  return results;
}

}  // namespace gradcomm::testing
