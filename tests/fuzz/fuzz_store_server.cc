// A live TcpStoreServer (store/tcp_store_server.cc) on 127.0.0.1, fed each
// input over a fresh connection: the whole server path (frame assembly, header
// checks, SET/GET/ADD/ERASE_PREFIX/WILL, parked GETs, auth, drops), not just the parsers that
// fuzz_store_protocol calls directly.
//
// Input: mode u8 | bytes sent to the server.
//   mode bit0: connect to the server that requires a job token (else the open one);
//   mode bit1: with a token, the harness answers the challenge correctly before
//              sending the bytes, so mutations reach the request parser.
// Per input: connect, read the greeting, send the bytes, half-close, read until the
// server closes. The server must close within 10 s (a half-closed client is gone:
// a partial frame is dropped, a parked GET noticed), and everything it sent must
// parse as the protocol says: greeting, then a welcome (when one is due), then
// complete responses, no more than the requests sent. Every 64 inputs a real
// client (connect_tcp_store) checks that the server still serves: set, get, add.
// The servers live across inputs (their keys too); they are replaced when they
// hold many keys, so the probe never meets a full store.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "gradcomm/errors.h"
#include "store/auth.h"
#include "store/store_backends.h"
#include "store/tcp_store_protocol.h"

namespace wire = gradcomm::detail::store_wire;
using gradcomm::detail::TcpStoreServer;

namespace {

constexpr const char* kToken = "fuzz-job-token";

struct Served {
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<gradcomm::detail::Store> client;  // the probe
  std::string token;
};

gradcomm::detail::StoreLimits limits() {
  gradcomm::detail::StoreLimits l;
  l.max_key_bytes = 256;
  l.max_value_bytes = 8192;
  l.max_keys = 1 << 14;
  l.max_total_bytes = size_t{16} << 20;
  l.idle_timeout = std::chrono::milliseconds(10'000);
  l.auth_timeout = std::chrono::milliseconds(2'000);
  return l;
}

void start(Served& s, const std::string& token) {
  s.client.reset();
  s.server = std::make_unique<TcpStoreServer>("127.0.0.1", 0, token, limits());
  s.token = token;
  s.client = gradcomm::detail::connect_tcp_store("127.0.0.1", s.server->port(), token, std::chrono::seconds(10));
}

Served& served(bool auth) {
  static Served open, locked;
  Served& s = auth ? locked : open;
  if (!s.server) start(s, auth ? kToken : "");
  return s;
}

// Blocking socket with 10 s send/receive timeouts (generous: CI machines are loaded).
int connect_to(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  GRADCOMM_FUZZ_CHECK(fd >= 0, "socket: %s", std::strerror(errno));
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  if (rc != 0 && errno == EINTR) {
    // libFuzzer's timers interrupt a connect that waits (a full listen backlog on a
    // busy machine); the handshake goes on: wait for it and take its outcome.
    pollfd p{fd, POLLOUT, 0};
    int ready;
    do {
      ready = ::poll(&p, 1, 10'000);
    } while (ready < 0 && errno == EINTR);
    int error = ready == 1 ? 0 : ETIMEDOUT;
    socklen_t len = sizeof error;
    if (ready == 1) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
    errno = error;
    rc = error == 0 ? 0 : -1;
  }
  GRADCOMM_FUZZ_CHECK(rc == 0, "connect to the store server: %s", std::strerror(errno));
  return fd;
}

bool read_exact(int fd, uint8_t* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, out + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    GRADCOMM_FUZZ_CHECK(!(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)), "the server sent nothing for 10 s");
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

// Everything until the server closes.
std::vector<uint8_t> read_to_end(int fd) {
  std::vector<uint8_t> out;
  uint8_t chunk[16384];
  while (true) {
    const ssize_t r = ::recv(fd, chunk, sizeof chunk, 0);
    if (r < 0 && errno == EINTR) continue;
    GRADCOMM_FUZZ_CHECK(!(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)),
                        "the server kept a half-closed connection open for 10 s");
    if (r <= 0) break;  // closed (or reset after a drop)
    out.insert(out.end(), chunk, chunk + r);
  }
  return out;
}

void send_all(int fd, const uint8_t* data, size_t size) {
  size_t sent = 0;
  while (sent < size) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the server dropped us mid-input: fine, it may
    sent += static_cast<size_t>(n);
  }
}

// Upper bound on the requests the server can have read from `bytes`.
size_t max_requests(size_t size) { return size / wire::kRequestHeaderBytes; }

void probe(Served& s, uint64_t n) {
  const std::string key = "gradcomm-fuzz-probe/" + std::to_string(n);
  const std::vector<uint8_t> value{1, 2, 3, static_cast<uint8_t>(n)};
  try {
    s.client->set(key, value);
    const auto got = s.client->get(key, std::chrono::seconds(10));
    GRADCOMM_FUZZ_CHECK(got == value, "probe: get returned %zu other bytes", got.size());
    const int64_t a = s.client->add("gradcomm-fuzz-probe-counter", 1);
    const int64_t b = s.client->add("gradcomm-fuzz-probe-counter", 2);
    GRADCOMM_FUZZ_CHECK(b == a + 2, "probe: add gave %lld then %lld", static_cast<long long>(a),
                        static_cast<long long>(b));
  } catch (const std::exception& e) {
    GRADCOMM_FUZZ_CHECK(false, "probe: the server no longer serves a proper client: %s", e.what());
  }
  const auto stats = s.server->stats();
  if (stats.keys > limits().max_keys / 2 || stats.stored_bytes > limits().max_total_bytes / 2) {
    start(s, s.token);  // fresh server: the probe must never meet a full store
  }
}

void check_replies(const std::vector<uint8_t>& in, bool auth, bool proved, size_t requests, uint64_t max_value) {
  size_t at = 0;
  GRADCOMM_FUZZ_CHECK(in.size() >= wire::kGreetingBytes, "%zu bytes, no greeting", in.size());
  at += wire::kGreetingBytes;  // read and checked by the harness already
  if (auth && !proved) {
    // A welcome only if the server got all 32 proof bytes, and then a refusal.
    if (at == in.size()) return;
    const auto welcome = wire::parse_welcome(std::span(in).subspan(at, std::min(in.size() - at, wire::kWelcomeBytes)));
    GRADCOMM_FUZZ_CHECK(welcome && welcome->verdict == wire::Verdict::kRefused, "a wrong proof was not refused");
    GRADCOMM_FUZZ_CHECK(in.size() == at + wire::kWelcomeBytes, "bytes after a refusal");
    return;
  }
  size_t responses = 0;
  while (at < in.size()) {
    std::string error;
    GRADCOMM_FUZZ_CHECK(in.size() - at >= wire::kResponseHeaderBytes, "a cut response header");
    const auto h =
        wire::parse_response_header(std::span(in).subspan(at, wire::kResponseHeaderBytes), max_value, error);
    GRADCOMM_FUZZ_CHECK(h.has_value(), "the server sent a malformed response: %s", error.c_str());
    at += wire::kResponseHeaderBytes;
    GRADCOMM_FUZZ_CHECK(in.size() - at >= h->value_len, "a cut response value");
    at += h->value_len;
    ++responses;
  }
  GRADCOMM_FUZZ_CHECK(responses <= requests, "%zu responses to at most %zu requests", responses, requests);
}

}  // namespace

void write_seeds(gradcomm::fuzz::SeedWriter& seeds) {
  auto request = [](uint8_t op, const std::string& key, const std::vector<uint8_t>& value) {
    std::vector<uint8_t> out(wire::kRequestHeaderBytes, 0);
    out[0] = op;
    wire::put_u32(out.data() + 4, static_cast<uint32_t>(key.size()));
    wire::put_u64(out.data() + 8, value.size());
    out.insert(out.end(), key.begin(), key.end());
    out.insert(out.end(), value.begin(), value.end());
    return out;
  };
  auto u64 = [](uint64_t v) {
    std::vector<uint8_t> out(8);
    wire::put_u64(out.data(), v);
    return out;
  };
  auto with_mode = [](uint8_t mode, std::vector<std::vector<uint8_t>> frames) {
    std::vector<uint8_t> out{mode};
    for (const auto& f : frames) out.insert(out.end(), f.begin(), f.end());
    return out;
  };
  const std::vector<uint8_t> value{'v', 'a', 'l', 'u', 'e'};
  seeds.add("set_get", with_mode(0, {request(1, "k", value), request(2, "k", u64(100))}));
  seeds.add("add_add_get", with_mode(0, {request(3, "n", u64(5)), request(3, "n", u64(~uint64_t{0})),
                                         request(2, "n", u64(0))}));
  seeds.add("add_on_text", with_mode(0, {request(1, "t", value), request(3, "t", u64(1))}));
  seeds.add("add_overflow", with_mode(0, {request(3, "o", u64(INT64_MAX)), request(3, "o", u64(1))}));
  seeds.add("get_parked", with_mode(0, {request(2, "missing", u64(60'000))}));
  seeds.add("get_zero_wait", with_mode(0, {request(2, "missing", u64(0)), request(1, "x", {})}));
  auto partial = request(1, "partial", value);
  partial.resize(partial.size() - 2);
  seeds.add("partial_frame", with_mode(0, {partial}));
  seeds.add("key_too_long", with_mode(0, {request(1, std::string(300, 'k'), value)}));
  seeds.add("auth_proved_set", with_mode(3, {request(1, "a", value), request(2, "a", u64(10))}));
  seeds.add("auth_wrong_proof", with_mode(1, {std::vector<uint8_t>(32, 0x5A), request(1, "a", value)}));
  seeds.add("auth_short_proof", with_mode(1, {std::vector<uint8_t>(10, 0x5A)}));
  seeds.add("erase_prefix", with_mode(0, {request(1, "g1/a", value), request(4, "g1/", {}), request(2, "g1/a", u64(0))}));
  seeds.add("will_then_close", with_mode(0, {request(5, "w", value), request(2, "w", u64(0))}));
  seeds.add("will_withdrawn", with_mode(0, {request(5, "w2", value), request(5, "", {})}));
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static uint64_t runs = 0;
  if (size == 0) return 0;
  const bool auth = (data[0] & 1) != 0;
  const bool prove = auth && (data[0] & 2) != 0;
  Served& s = served(auth);
  const int fd = connect_to(s.server->port());
  uint8_t greeting[wire::kGreetingBytes];
  GRADCOMM_FUZZ_CHECK(read_exact(fd, greeting, sizeof greeting), "no greeting");
  const auto g = wire::parse_greeting(greeting);
  GRADCOMM_FUZZ_CHECK(g && g->auth_required == auth, "bad greeting");
  std::vector<uint8_t> received(greeting, greeting + sizeof greeting);
  if (prove) {
    const auto proof = gradcomm::detail::make_auth_proof(kToken, g->nonce);
    send_all(fd, proof.data(), proof.size());
    uint8_t welcome[wire::kWelcomeBytes];
    GRADCOMM_FUZZ_CHECK(read_exact(fd, welcome, sizeof welcome), "no welcome after a right proof");
    const auto w = wire::parse_welcome(welcome);
    GRADCOMM_FUZZ_CHECK(w && w->verdict == wire::Verdict::kAccepted, "a right proof was refused");
  } else if (!auth) {
    uint8_t welcome[wire::kWelcomeBytes];
    GRADCOMM_FUZZ_CHECK(read_exact(fd, welcome, sizeof welcome), "no welcome");
    const auto w = wire::parse_welcome(welcome);
    GRADCOMM_FUZZ_CHECK(w && w->verdict == wire::Verdict::kAccepted, "an open server refused");
  }
  send_all(fd, data + 1, size - 1);
  ::shutdown(fd, SHUT_WR);
  const std::vector<uint8_t> rest = read_to_end(fd);
  ::close(fd);
  received.insert(received.end(), rest.begin(), rest.end());
  check_replies(received, auth, !auth || prove, max_requests(size - 1), limits().max_value_bytes);
  if (++runs % 64 == 0) probe(s, runs);
  return 0;
}
