// TCP store client. The protocol is described at the top of tcp_store_server.cc.
//
// Connections. A Store keeps a small pool of authenticated connections; each
// request takes one for its whole duration (a GET may be parked at the server for
// a long time), so threads sharing one Store never wait on each other's requests.
// The server may close a pooled connection that sat idle past its idle_timeout;
// a connection found closed is replaced before use, and a request whose connection
// breaks is retried once on a fresh one when that cannot apply it twice (see call()).
// A last will has a connection of its own, held by its handle: the server keeps
// the will as long as that connection is open.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <optional>
#include <thread>

#include "gradcomm/errors.h"
#include "logging.h"
#include "store/auth.h"
#include "store/socket_util.h"
#include "store/store_backends.h"

namespace gradcomm::detail {

namespace wire = store_wire;

namespace {

constexpr auto kFirstBackoff = std::chrono::milliseconds(10);
constexpr auto kMaxBackoff = std::chrono::milliseconds(500);
// A GET's reply may trail the server's own wait deadline by a little.
constexpr auto kGetReplyGrace = std::chrono::milliseconds(2000);
constexpr size_t kMaxPooledConnections = 4;

struct ClientConnection {
  UniqueFd fd;
  uint64_t max_key_bytes = 0;
  uint64_t max_value_bytes = 0;
};

struct Reply {
  wire::Status status = wire::Status::kOk;
  std::vector<uint8_t> value;
};

std::string preview(const std::string& key) {
  constexpr size_t kShown = 64;
  if (key.size() <= kShown) return key;
  return fmt::format("{}... ({} bytes)", key.substr(0, kShown), key.size());
}

std::vector<uint8_t> request_frame(wire::Op op, const std::string& key, std::span<const uint8_t> value) {
  std::vector<uint8_t> frame(wire::kRequestHeaderBytes + key.size() + value.size(), 0);
  frame[0] = static_cast<uint8_t>(op);
  wire::put_u32(frame.data() + 4, static_cast<uint32_t>(key.size()));
  wire::put_u64(frame.data() + 8, value.size());
  std::copy(key.begin(), key.end(), frame.begin() + wire::kRequestHeaderBytes);
  std::copy(value.begin(), value.end(), frame.begin() + wire::kRequestHeaderBytes + key.size());
  return frame;
}

// Holds the connection the server keeps a will for. Withdrawing it is one frame
// sent without waiting (the connection is idle, so its send buffer has room): the
// server reads it before the close that follows, and a server that is gone has
// nothing to withdraw.
class TcpLastWill final : public LastWill {
 public:
  explicit TcpLastWill(UniqueFd fd) : fd_(std::move(fd)) {}
  ~TcpLastWill() override {
    const std::vector<uint8_t> withdraw = request_frame(wire::Op::kWill, "", {});
    [[maybe_unused]] ssize_t n = ::send(fd_.get(), withdraw.data(), withdraw.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

 private:
  UniqueFd fd_;
};

class TcpStore final : public Store {
 public:
  TcpStore(std::string host, uint16_t port, std::string token, std::chrono::milliseconds timeout,
           std::shared_ptr<TcpStoreServer> server)
      : server_(std::move(server)),
        host_(std::move(host)),
        port_(port),
        token_(std::move(token)),
        timeout_(clamp_store_wait(timeout)),
        address_("tcp://" + format_host_port(host_, port_)) {
    // Connect now: a wrong token or an unreachable server fails create_store(), not
    // the first set().
    give_back(connect(Deadline::after(timeout_)));
  }

  void set(const std::string& key, std::span<const uint8_t> value) override {
    call(wire::Op::kSet, key, value, Deadline::after(timeout_), "set");
  }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    timeout = clamp_store_wait(timeout);
    uint8_t wait[8];
    wire::put_u64(wait, static_cast<uint64_t>(timeout.count()));
    Reply reply = call(wire::Op::kGet, key, wait, Deadline::after(timeout + kGetReplyGrace), "get", timeout);
    if (reply.status == wire::Status::kTimeout) {
      throw TimeoutError(fmt::format("store {}: get('{}') timed out after {} ms: no rank set the key", address_,
                                     preview(key), timeout.count()));
    }
    return std::move(reply.value);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    uint8_t body[8];
    wire::put_u64(body, static_cast<uint64_t>(delta));
    Reply reply = call(wire::Op::kAdd, key, body, Deadline::after(timeout_), "add");
    if (reply.value.size() != 8) {
      throw TransportError(fmt::format("store {}: add('{}') reply of {} bytes (expected 8)", address_, preview(key),
                                       reply.value.size()));
    }
    return static_cast<int64_t>(wire::get_u64(reply.value.data()));
  }

  std::string address() const override { return address_; }

  size_t erase_prefix(const std::string& prefix) override {
    Reply reply = call(wire::Op::kErasePrefix, prefix, {}, Deadline::after(timeout_), "erase_prefix");
    if (reply.value.size() != 8) {
      throw TransportError(fmt::format("store {}: erase_prefix('{}') reply of {} bytes (expected 8)", address_,
                                       preview(prefix), reply.value.size()));
    }
    return static_cast<size_t>(wire::get_u64(reply.value.data()));
  }

  std::unique_ptr<LastWill> set_last_will(const std::string& key, std::span<const uint8_t> value) override {
    const Deadline deadline = Deadline::after(timeout_);
    ClientConnection c = connect(deadline);  // not pooled: the will lasts as long as this connection
    check_limits(c, wire::Op::kWill, key, value, "set_last_will");
    std::optional<Reply> reply = exchange(c, wire::Op::kWill, key, value, deadline, "set_last_will", {}, false);
    throw_if_refused(*reply, key, "set_last_will");
    return std::make_unique<TcpLastWill>(std::move(c.fd));
  }

 private:
  // One request, start to end. `deadline` bounds the whole call (connect included);
  // `wait` is the server-side wait of a GET, for messages.
  Reply call(wire::Op op, const std::string& key, std::span<const uint8_t> value, const Deadline& deadline,
             std::string_view what, std::chrono::milliseconds wait = {});
  // Sends one request on `c` and reads its reply. nullopt when the connection broke
  // where a retry cannot apply the request twice and `may_retry` allows one.
  std::optional<Reply> exchange(ClientConnection& c, wire::Op op, const std::string& key,
                                std::span<const uint8_t> value, const Deadline& deadline, std::string_view what,
                                std::chrono::milliseconds wait, bool may_retry);
  // The server would drop the connection for a request past its limits; say why instead.
  void check_limits(const ClientConnection& c, wire::Op op, const std::string& key, std::span<const uint8_t> value,
                    std::string_view what) const;
  void throw_if_refused(const Reply& reply, const std::string& key, std::string_view what) const;
  ClientConnection take(const Deadline& deadline);
  void give_back(ClientConnection connection);
  // Retries until `deadline`; with `once`, a single attempt (after a connection
  // broke: the server was up a moment ago, so a refusal now means it is gone).
  ClientConnection connect(const Deadline& deadline, bool once = false);
  std::optional<ClientConnection> try_connect(const Deadline& deadline, std::string& last_error);
  bool handshake(ClientConnection& connection, const Deadline& deadline, std::string& last_error);

  std::shared_ptr<TcpStoreServer> server_;  // first member: released after every connection
  std::string host_;
  uint16_t port_;
  std::string token_;
  std::chrono::milliseconds timeout_;
  std::string address_;
  std::mutex mutex_;  // guards idle_
  std::vector<ClientConnection> idle_;
};

Reply TcpStore::call(wire::Op op, const std::string& key, std::span<const uint8_t> value, const Deadline& deadline,
                     std::string_view what, std::chrono::milliseconds wait) {
  for (int attempt = 0;; ++attempt) {
    ClientConnection c = attempt == 0 ? take(deadline) : connect(deadline, /*once=*/true);
    try {
      check_limits(c, op, key, value, what);
    } catch (const InvalidArgument&) {
      give_back(std::move(c));
      throw;
    }
    std::optional<Reply> reply = exchange(c, op, key, value, deadline, what, wait, /*may_retry=*/attempt == 0);
    if (!reply) continue;
    give_back(std::move(c));
    throw_if_refused(*reply, key, what);
    return std::move(*reply);
  }
}

void TcpStore::check_limits(const ClientConnection& c, wire::Op op, const std::string& key,
                            std::span<const uint8_t> value, std::string_view what) const {
  if (key.size() > c.max_key_bytes) {
    throw InvalidArgument(fmt::format("store {}: {}('{}'): key of {} bytes exceeds the server's max_key_bytes={}",
                                      address_, what, preview(key), key.size(), c.max_key_bytes));
  }
  if ((op == wire::Op::kSet || op == wire::Op::kWill) && value.size() > c.max_value_bytes) {
    throw InvalidArgument(fmt::format("store {}: {}('{}'): value of {} bytes exceeds the server's max_value_bytes={}",
                                      address_, what, preview(key), value.size(), c.max_value_bytes));
  }
}

void TcpStore::throw_if_refused(const Reply& reply, const std::string& key, std::string_view what) const {
  if (reply.status == wire::Status::kError) {
    throw InvalidArgument(fmt::format("store {}: {}('{}') refused: {}", address_, what, preview(key),
                                      std::string(reply.value.begin(), reply.value.end())));
  }
}

std::optional<Reply> TcpStore::exchange(ClientConnection& c, wire::Op op, const std::string& key,
                                        std::span<const uint8_t> value, const Deadline& deadline,
                                        std::string_view what, std::chrono::milliseconds wait, bool may_retry) {
  const std::vector<uint8_t> frame = request_frame(op, key, value);
  IoResult sent = write_full(c.fd.get(), frame.data(), frame.size(), deadline);
  if (sent.status == IoStatus::kTimeout) {
    throw TimeoutError(fmt::format("store {}: {}('{}'): could not send the request within the deadline", address_,
                                   what, preview(key)));
  }
  if (sent.status != IoStatus::kOk) {
    // Part of the frame never left: the server cannot have applied it, so any
    // request (ADD included) may be retried once.
    if (may_retry) return std::nullopt;
    throw PeerFailure(fmt::format("store {}: {}('{}'): connection lost while sending: {}", address_, what,
                                  preview(key), errno_text(sent.error)));
  }
  uint8_t header[wire::kResponseHeaderBytes];
  IoResult got = read_full(c.fd.get(), header, sizeof(header), deadline);
  if (got.status == IoStatus::kTimeout) {
    // The reply may still come; this connection is out of step, so it is dropped.
    throw TimeoutError(fmt::format("store {}: {}('{}') got no reply within {} ms", address_, what, preview(key),
                                   op == wire::Op::kGet ? wait.count() : timeout_.count()));
  }
  if (got.status != IoStatus::kOk) {
    // Closed before any reply byte. SET, GET and ERASE_PREFIX are idempotent; an
    // ADD may have been applied, so it is not repeated.
    if (may_retry && got.transferred == 0 && op != wire::Op::kAdd) return std::nullopt;
    throw PeerFailure(fmt::format("store {}: {}('{}'): connection lost while waiting for the reply ({}); "
                                  "did rank 0 exit?",
                                  address_, what, preview(key),
                                  got.status == IoStatus::kClosed ? "closed" : errno_text(got.error)));
  }
  std::string error;
  const auto response = wire::parse_response_header(header, c.max_value_bytes, error);
  if (!response) throw TransportError(fmt::format("store {}: {}('{}'): {}", address_, what, preview(key), error));
  Reply reply{response->status, std::vector<uint8_t>(response->value_len)};
  got = read_full(c.fd.get(), reply.value.data(), reply.value.size(), deadline);
  if (got.status != IoStatus::kOk) {
    throw PeerFailure(fmt::format("store {}: {}('{}'): reply cut short after {} of {} bytes", address_, what,
                                  preview(key), got.transferred, reply.value.size()));
  }
  return reply;
}

ClientConnection TcpStore::take(const Deadline& deadline) {
  for (;;) {
    std::optional<ClientConnection> c;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (idle_.empty()) break;
      c = std::move(idle_.back());
      idle_.pop_back();
    }
    // No request is in flight on an idle connection, so anything readable means
    // the server closed it (idle timeout) or broke protocol: replace it.
    pollfd p{c->fd.get(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) == 0) return std::move(*c);
  }
  return connect(deadline);
}

void TcpStore::give_back(ClientConnection connection) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (idle_.size() < kMaxPooledConnections) idle_.push_back(std::move(connection));
}

ClientConnection TcpStore::connect(const Deadline& deadline, bool once) {
  std::string last_error = "no attempt made";
  auto backoff = kFirstBackoff;
  const auto started = Clock::now();
  for (;;) {
    if (auto c = try_connect(deadline, last_error)) return std::move(*c);
    if (once) {
      throw PeerFailure(fmt::format("store {}: lost the connection and cannot reconnect ({}); did rank 0 exit?",
                                    address_, last_error));
    }
    if (deadline.expired()) {
      auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
      throw TimeoutError(fmt::format("store {}: could not connect within {} ms (is rank 0 up and serving this "
                                     "address?); last error: {}",
                                     address_, waited.count(), last_error));
    }
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(backoff, deadline.remaining()));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

std::optional<ClientConnection> TcpStore::try_connect(const Deadline& deadline, std::string& last_error) {
  bool retriable = false;
  auto addresses = resolve_tcp(host_, port_, last_error, retriable);
  if (addresses.empty()) {
    if (retriable) return std::nullopt;
    throw InvalidArgument(fmt::format("store {}: host '{}' does not resolve: {}", address_, host_, last_error));
  }
  for (const auto& address : addresses) {
    ClientConnection c;
    c.fd = UniqueFd(::socket(address.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!c.fd.valid()) {
      last_error = fmt::format("socket: {}", errno_text(errno));
      continue;
    }
    int rc = ::connect(c.fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length);
    if (rc != 0 && errno != EINPROGRESS && errno != EINTR) {
      last_error = fmt::format("connect to {}: {}", format_address(address), errno_text(errno));
      continue;
    }
    if (rc != 0) {
      // Completion of a nonblocking connect: writable, then SO_ERROR says how it went.
      if (!wait_writable(c.fd.get(), deadline)) {
        last_error = fmt::format("connect to {}: no answer before the deadline", format_address(address));
        continue;
      }
      int error = 0;
      socklen_t length = sizeof(error);
      ::getsockopt(c.fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) {
        last_error = fmt::format("connect to {}: {}", format_address(address), errno_text(error));
        continue;
      }
    }
    int one = 1;
    ::setsockopt(c.fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (handshake(c, deadline, last_error)) return c;
  }
  return std::nullopt;
}

bool TcpStore::handshake(ClientConnection& c, const Deadline& deadline, std::string& last_error) {
  uint8_t greeting[wire::kGreetingBytes];
  IoResult r = read_full(c.fd.get(), greeting, sizeof(greeting), deadline);
  if (r.status != IoStatus::kOk) {
    // Typical when the server is at max_connections (it closes at once) or going down.
    last_error = r.status == IoStatus::kTimeout ? "no greeting from the server before the deadline"
                 : r.status == IoStatus::kClosed
                     ? "the server closed the connection before its greeting (at max_connections?)"
                     : fmt::format("reading the greeting: {}", errno_text(r.error));
    return false;
  }
  const auto parsed = wire::parse_greeting(greeting);
  if (!parsed) {
    throw TransportError(fmt::format("store {}: the server is not a gradcomm store of protocol version {} "
                                     "(greeting bytes {:02x}; expected magic 'GCST' then version {})",
                                     address_, wire::kVersion, fmt::join(greeting, greeting + 5, " "),
                                     wire::kVersion));
  }
  bool auth = parsed->auth_required;
  if (auth) {
    if (token_.empty()) {
      throw InvalidArgument(fmt::format("store {} requires a job token, but this rank has none: set "
                                        "GRADCOMM_JOB_TOKEN (or InitOptions::job_token) to the token of rank 0",
                                        address_));
    }
    AuthProof proof = make_auth_proof(token_, parsed->nonce);
    r = write_full(c.fd.get(), proof.data(), proof.size(), deadline);
    if (r.status != IoStatus::kOk) {
      last_error = "connection lost while sending the token proof";
      return false;
    }
  } else if (!token_.empty()) {
    log(LogLevel::kInfo, "store {}: the server does not check job tokens; connecting without proving ours",
        address_);
  }
  uint8_t welcome[wire::kWelcomeBytes];
  r = read_full(c.fd.get(), welcome, sizeof(welcome), deadline);
  bool refused = r.status == IoStatus::kOk && welcome[4] == static_cast<uint8_t>(wire::Verdict::kRefused);
  if (auth && (refused || r.status == IoStatus::kClosed)) {
    throw InvalidArgument(fmt::format("store {} refused the job token: this rank's GRADCOMM_JOB_TOKEN differs "
                                      "from the one rank 0 serves the store with",
                                      address_));
  }
  if (r.status != IoStatus::kOk) {
    last_error = "no welcome from the server";
    return false;
  }
  const auto accepted = wire::parse_welcome(welcome);
  if (!accepted || accepted->verdict != wire::Verdict::kAccepted) {
    throw TransportError(fmt::format("store {}: malformed welcome (verdict {}; expected 0)", address_, welcome[4]));
  }
  c.max_key_bytes = accepted->max_key_bytes;
  c.max_value_bytes = accepted->max_value_bytes;
  return true;
}

}  // namespace

std::unique_ptr<Store> connect_tcp_store(const std::string& host, uint16_t port, const std::string& job_token,
                                         std::chrono::milliseconds timeout, std::shared_ptr<TcpStoreServer> server) {
  return std::make_unique<TcpStore>(host, port, job_token, timeout, std::move(server));
}

}  // namespace gradcomm::detail
