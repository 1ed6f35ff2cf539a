// TCP store server: one thread, one poll() loop, nonblocking sockets.
//
// Protocol (version 1; integers little-endian; constants in tcp_store_protocol.h)
// ---------------------------------------------------------------------------
//  1. On accept the server sends a GREETING (40 bytes):
//       magic u32 "GCST" | version u8 = 1 | flags u8 (bit 0: auth required) |
//       reserved u16 = 0 | nonce[32] (random when auth is required, else zeros)
//  2. With auth, the client sends PROOF[32] = HMAC-SHA256(job token,
//     nonce || "gradcomm-store-auth-v1"). The server compares in constant time.
//  3. The server sends a WELCOME (24 bytes): magic u32 | verdict u8 (0 accepted,
//     1 refused) | reserved[3] | max_key_bytes u64 | max_value_bytes u64. Without
//     auth it follows the greeting at once. After "refused" the server closes.
//  4. Then requests, one at a time (the server reads the next request only after
//     it answered the previous one):
//       REQUEST  = opcode u8 | reserved[3] = 0 | key_len u32 | value_len u64 | key | value
//       RESPONSE = status u8 | reserved[7] = 0 | value_len u64 | value
//     SET (1): value = the bytes to store             -> OK, empty
//     GET (2): value = wait timeout in ms, u64        -> OK + value as soon as the key
//              exists (the request is parked until a SET/ADD makes it), or TIMEOUT
//              once the wait passes
//     ADD (3): value = delta, i64                     -> OK + the new value, i64; the
//              key holds the counter as decimal text
//     ERASE_PREFIX (4): key = a prefix, no value      -> OK + how many keys it deleted,
//              u64 (every key starting with the prefix; parked GETs keep waiting)
//     WILL (5): value = bytes to set at `key` when    -> OK, empty. The connection's
//              this connection closes (MQTT's last will): replaces its earlier one;
//              an empty key withdraws it. Whatever closes the connection (the client
//              exiting or killed, or the server dropping it) sets the key, unless it
//              holds a value by then. The server's own shutdown does not.
//     status ERROR (2) carries a text (<= 4 KiB): a limit was hit (store full) or an
//     ADD found a non-integer value. The connection stays usable.
//
// Trust model. With a job token, only holders of the token are served: a
// connection that does not prove it within auth_timeout, or proves it wrongly, is
// closed before any request is read. The proof authenticates the connection, not
// each frame: traffic is neither encrypted nor integrity-protected, so an attacker
// who can inject into a live TCP stream is out of scope (use a private network).
// Without a token anyone who can reach host:port may read and write every key;
// that is only safe when the address is reachable by the job alone (loopback, or a
// private interface), which is why the server binds the configured address only.
//
// Robustness invariants.
//  - A connection's input buffer never holds more than one frame: the server reads
//    only the bytes the current frame still needs, and validates a request header
//    (opcode, reserved bytes, key_len <= max_key_bytes, value_len <= max_value_bytes,
//    or == 8 for GET/ADD) before reading any of its body. A bad header drops that
//    connection; nothing of the claimed size is allocated.
//  - Output is one response at a time: while a response is unsent (or a GET is
//    parked) the connection is not read, so a client that never reads its answers
//    cannot grow server memory.
//  - Stored data is bounded by max_keys and max_total_bytes (last wills count
//    toward the bytes); connections by max_connections.
//  - Garbage cannot lock the job out of a full table. When max_connections are
//    open and another arrives, the server evicts an unauthenticated connection
//    to make room: first one already refused (flushing its refusal), else the
//    oldest still owing its proof, provided it has owed it for kEvictableAfter
//    (a real client proves within one round trip, so it is not the one cut off
//    mid-handshake, which its client would read as a refused token). Only
//    when no connection qualifies is the newcomer accepted and closed at once;
//    a real client retries that with backoff and gets in once the garbage has
//    aged. Authenticated connections are never evicted, and without a job token
//    there is no unauthenticated phase, so nothing is evicted (that mode trusts
//    its network; see the trust model).
//  - Every connection has a deadline: auth_timeout before the proof, idle_timeout
//    since its last progress otherwise; a parked GET answers TIMEOUT at its own
//    deadline instead, and a connection holding a last will is silent on purpose
//    (its deadline renews). Anything unexpected from one client closes that client only.
#include <openssl/crypto.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "gradcomm/errors.h"
#include "logging.h"
#include "store/auth.h"
#include "store/socket_util.h"
#include "store/store_backends.h"

namespace gradcomm::detail {

namespace wire = store_wire;

namespace {

constexpr int kListenBacklog = 1024;
constexpr int kMaxAcceptsPerWake = 64;
constexpr auto kMaxPollWait = std::chrono::milliseconds(1000);
constexpr auto kCloseFlushGrace = std::chrono::milliseconds(1000);  // to send a refusal before closing
constexpr auto kAcceptPauseOnFdExhaustion = std::chrono::milliseconds(100);
// An unauthenticated connection may be evicted for a newcomer once it has owed its
// proof this long (see "Garbage cannot lock the job out" above).
constexpr auto kEvictableAfter = std::chrono::milliseconds(500);
constexpr uint64_t kMaxWaitMs = uint64_t{30} * 24 * 3600 * 1000;  // clamp: no time_point overflow
constexpr size_t kReadChunk = 64 * 1024;

enum class Phase { kAwaitProof, kReady, kClosing };

struct Connection {
  uint64_t id = 0;
  UniqueFd fd;
  std::string peer;
  Phase phase = Phase::kReady;
  Clock::time_point accepted_at;
  AuthNonce nonce{};
  std::vector<uint8_t> in;   // bytes of the current frame only (see read_input)
  size_t frame_bytes = 0;    // size of the current request once its header is validated, else 0
  std::vector<uint8_t> out;  // one unsent greeting/welcome/response
  size_t out_sent = 0;
  Clock::time_point deadline;
  bool parked = false;       // a GET waiting for parked_key
  std::string parked_key;
  struct Will {
    std::string key;
    std::vector<uint8_t> value;
  };
  std::optional<Will> will;  // set when this connection closes (WILL)
};

}  // namespace

struct TcpStoreServer::Impl {
  Impl(const std::string& host, uint16_t port, std::string token, StoreLimits limits);
  ~Impl();

  void run();
  void loop_once();
  void accept_all();
  bool evict_unauthenticated(Clock::time_point now);
  void handle_events(uint64_t id, short revents);
  bool read_input(Connection& c);
  bool process(Connection& c);
  bool execute(Connection& c);
  bool flush(Connection& c);
  void expire(Clock::time_point now);
  void drop(Connection& c, std::string_view reason);
  void close_connection(uint64_t id);
  void unpark(Connection& c);
  void wake_waiters(const std::string& key);
  void respond(Connection& c, wire::Status status, std::span<const uint8_t> value);
  void respond_error(Connection& c, const std::string& text);
  std::string put(const std::string& key, std::vector<uint8_t> value);
  size_t erase_prefix(const std::string& prefix);
  std::string set_will(Connection& c, std::string key, std::vector<uint8_t> value);
  void execute_will(Connection::Will will);
  void queue_welcome(Connection& c, wire::Verdict verdict);
  Clock::time_point idle_deadline() const { return Clock::now() + limits_.idle_timeout; }

  std::string host_;
  uint16_t port_ = 0;
  std::string token_;
  StoreLimits limits_;
  std::string address_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;
  std::atomic<bool> stop_{false};
  std::thread thread_;

  // Loop state, touched by the server thread only. unordered_map keeps references
  // to a Connection valid while other connections are added; a function that may
  // close a connection returns whether it is still open, and callers stop using
  // the reference when it is not.
  std::unordered_map<uint64_t, Connection> conns_;
  std::unordered_map<std::string, std::vector<uint8_t>> data_;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters_;  // key -> parked connection ids
  uint64_t next_id_ = 1;
  size_t will_bytes_ = 0;  // keys + values of the wills connections hold
  Clock::time_point accept_paused_until_{};
  Stats counters_;

  mutable std::mutex stats_mutex_;
  Stats published_;  // copy of counters_ made at the end of each loop turn
};

TcpStoreServer::Impl::Impl(const std::string& host, uint16_t port, std::string token, StoreLimits limits)
    : host_(host), token_(std::move(token)), limits_(limits) {
  limits_.idle_timeout = clamp_store_wait(limits_.idle_timeout);
  limits_.auth_timeout = clamp_store_wait(limits_.auth_timeout);
  std::string error;
  bool retriable = false;
  auto addresses = resolve_tcp(host, port, error, retriable);
  if (addresses.empty()) {
    throw InvalidArgument(fmt::format("store server: host '{}' does not resolve: {}", host, error));
  }
  std::string failures;
  for (const auto& address : addresses) {
    UniqueFd fd(::socket(address.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      failures += fmt::format("; socket({}): {}", format_address(address), errno_text(errno));
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0 ||
        ::listen(fd.get(), kListenBacklog) != 0) {
      failures += fmt::format("; {}: {}", format_address(address), errno_text(errno));
      continue;
    }
    SocketAddress bound;
    bound.length = sizeof(bound.storage);
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound.storage), &bound.length);
    bound.family = address.family;
    port_ = bound.family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&bound.storage)->sin_port)
                                    : ntohs(reinterpret_cast<sockaddr_in6*>(&bound.storage)->sin6_port);
    listen_fd_ = std::move(fd);
    break;
  }
  if (!listen_fd_.valid()) {
    throw TransportError(fmt::format(
        "store server: cannot listen on {} (expected a free port on an address of this host, i.e. rank 0's){}",
        format_host_port(host, port), failures));
  }
  address_ = "tcp://" + format_host_port(host, port_);
  wake_fd_ = UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd_.valid()) {
    throw TransportError(fmt::format("store server {}: eventfd: {}", address_, errno_text(errno)));
  }
  thread_ = std::thread([this] { run(); });
}

TcpStoreServer::Impl::~Impl() {
  stop_.store(true);
  uint64_t one = 1;
  // The loop wakes at least every kMaxPollWait anyway, so a failed write only delays.
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  conns_.clear();  // closes every client socket
}

void TcpStoreServer::Impl::run() {
  while (!stop_.load()) {
    try {
      loop_once();
    } catch (const std::exception& e) {
      // Per-connection failures are handled inside; this is a last resort, so that
      // the store keeps serving the other ranks.
      log(LogLevel::kWarn, "store server {}: unexpected error in the event loop: {}", address_, e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::lock_guard<std::mutex> lock(stats_mutex_);
    published_ = counters_;
    published_.open_connections = conns_.size();
    published_.keys = data_.size();
    published_.wills = std::count_if(conns_.begin(), conns_.end(), [](const auto& kv) { return kv.second.will; });
  }
  // Free this thread's OpenSSL state (the nonces' RNG) as the thread ends.
  OPENSSL_thread_stop();
}

void TcpStoreServer::Impl::loop_once() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  fds.reserve(conns_.size() + 2);
  ids.reserve(conns_.size());
  auto now = Clock::now();
  fds.push_back({wake_fd_.get(), POLLIN, 0});
  bool accepting = now >= accept_paused_until_;
  fds.push_back({accepting ? listen_fd_.get() : -1, POLLIN, 0});
  auto next = now + kMaxPollWait;
  if (!accepting) next = std::min(next, accept_paused_until_);
  for (auto& [id, c] : conns_) {
    short events = 0;
    if (c.out_sent < c.out.size()) {
      events = POLLOUT;
    } else if (c.parked) {
      events = POLLRDHUP;  // not reading; only notice the client going away
    } else if (c.phase != Phase::kClosing) {
      events = POLLIN;
    }
    fds.push_back({c.fd.get(), events, 0});
    ids.push_back(id);
    next = std::min(next, c.deadline);
  }
  auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
  int rc = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait, 0)));
  if (rc < 0 && errno != EINTR) {
    throw TransportError(fmt::format("store server {}: poll: {}", address_, errno_text(errno)));
  }
  if (rc > 0) {
    if (fds[0].revents != 0) {
      uint64_t value = 0;
      [[maybe_unused]] ssize_t n = ::read(wake_fd_.get(), &value, sizeof(value));
    }
    if (fds[1].revents != 0) accept_all();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (fds[i + 2].revents != 0) handle_events(ids[i], fds[i + 2].revents);
    }
  }
  expire(Clock::now());
}

void TcpStoreServer::Impl::accept_all() {
  for (int i = 0; i < kMaxAcceptsPerWake && !stop_.load(); ++i) {
    SocketAddress peer;
    peer.length = sizeof(peer.storage);
    int raw = ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&peer.storage), &peer.length,
                        SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (raw < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The pending connection stays queued and the listener stays readable: stop
        // polling it for a moment instead of spinning.
        log(LogLevel::kWarn, "store server {}: accept: {}; pausing accepts", address_, errno_text(errno));
        accept_paused_until_ = Clock::now() + kAcceptPauseOnFdExhaustion;
      }
      return;  // EAGAIN: queue drained
    }
    UniqueFd fd(raw);
    peer.family = reinterpret_cast<sockaddr*>(&peer.storage)->sa_family;
    ++counters_.accepted;
    if (conns_.size() >= limits_.max_connections && !evict_unauthenticated(Clock::now())) {
      ++counters_.refused_over_capacity;
      ++counters_.dropped;
      log(LogLevel::kInfo, "store server {}: closing {}: already {} connections (max_connections)", address_,
          format_address(peer), conns_.size());
      continue;  // fd closes here, before anything is sent
    }
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    uint64_t id = next_id_++;
    Connection& c = conns_[id];
    c.id = id;
    c.fd = std::move(fd);
    c.peer = format_address(peer);
    c.accepted_at = Clock::now();
    c.out.assign(wire::kGreetingBytes, 0);
    wire::put_u32(c.out.data(), wire::kMagic);
    c.out[4] = wire::kVersion;
    if (!token_.empty()) {
      c.phase = Phase::kAwaitProof;
      c.out[5] = wire::kFlagAuthRequired;
      c.nonce = make_auth_nonce();
      std::copy(c.nonce.begin(), c.nonce.end(), c.out.begin() + 8);
      c.deadline = Clock::now() + limits_.auth_timeout;
    } else {
      c.phase = Phase::kReady;
      queue_welcome(c, wire::Verdict::kAccepted);
      c.deadline = idle_deadline();
    }
    flush(c);
  }
}

bool TcpStoreServer::Impl::evict_unauthenticated(Clock::time_point now) {
  // A linear scan, only while the table is full: at most max_connections entries
  // per accepted newcomer, and the accepts per loop turn are capped.
  Connection* victim = nullptr;
  for (auto& [id, c] : conns_) {
    if (c.phase == Phase::kClosing) {
      victim = &c;  // already refused: nothing is lost by closing it now
      break;
    }
    if (c.phase == Phase::kAwaitProof && now - c.accepted_at >= kEvictableAfter &&
        (victim == nullptr || c.accepted_at < victim->accepted_at)) {
      victim = &c;
    }
  }
  if (victim == nullptr) return false;
  ++counters_.evicted_unauthenticated;
  drop(*victim, fmt::format("evicted to make room (max_connections={} reached); it had not proved the job token "
                            "after {} ms",
                            limits_.max_connections,
                            std::chrono::duration_cast<std::chrono::milliseconds>(now - victim->accepted_at).count()));
  return true;
}

void TcpStoreServer::Impl::queue_welcome(Connection& c, wire::Verdict verdict) {
  size_t at = c.out.size();
  c.out.resize(at + wire::kWelcomeBytes, 0);
  uint8_t* p = c.out.data() + at;
  wire::put_u32(p, wire::kMagic);
  p[4] = static_cast<uint8_t>(verdict);
  wire::put_u64(p + 8, limits_.max_key_bytes);
  wire::put_u64(p + 16, limits_.max_value_bytes);
}

void TcpStoreServer::Impl::handle_events(uint64_t id, short revents) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;  // closed earlier in this turn
  Connection& c = it->second;
  if (c.out_sent < c.out.size()) {
    flush(c);
  } else if (c.parked) {
    if (revents & (POLLRDHUP | POLLHUP | POLLERR)) close_connection(id);  // client gave up waiting
  } else if (c.phase != Phase::kClosing) {
    if (read_input(c)) process(c);
  }
}

bool TcpStoreServer::Impl::read_input(Connection& c) {
  // Read no further than the end of the current frame, so `in` holds one frame at most.
  size_t want = 0;
  if (c.phase == Phase::kAwaitProof) {
    want = wire::kProofBytes - c.in.size();
  } else if (c.frame_bytes == 0) {
    want = wire::kRequestHeaderBytes - c.in.size();
  } else {
    want = c.frame_bytes - c.in.size();
  }
  want = std::min(want, kReadChunk);
  size_t old = c.in.size();
  c.in.resize(old + want);
  ssize_t n = ::recv(c.fd.get(), c.in.data() + old, want, 0);
  if (n <= 0) {
    c.in.resize(old);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n == 0 && old == 0 && c.phase == Phase::kReady) {
      close_connection(c.id);  // orderly goodbye between requests
    } else if (n == 0) {
      drop(c, c.phase == Phase::kAwaitProof
                  ? fmt::format("closed after {} of the {} proof bytes", old, wire::kProofBytes)
                  : fmt::format("closed mid-frame after {} of its bytes", old));
    } else {
      drop(c, errno_text(errno));
    }
    return false;
  }
  c.in.resize(old + static_cast<size_t>(n));
  counters_.peak_buffered_bytes = std::max(counters_.peak_buffered_bytes, c.in.capacity());
  if (c.phase == Phase::kReady) c.deadline = idle_deadline();
  return true;
}

bool TcpStoreServer::Impl::process(Connection& c) {
  if (c.phase == Phase::kAwaitProof) {
    if (c.in.size() < wire::kProofBytes) return true;
    bool ok = auth_proof_matches(make_auth_proof(token_, c.nonce), c.in);
    c.in.clear();
    if (!ok) {
      ++counters_.failed_auth;
      log(LogLevel::kInfo, "store server {}: {} failed the job-token challenge; closing", address_, c.peer);
      c.phase = Phase::kClosing;
      c.deadline = Clock::now() + kCloseFlushGrace;
      queue_welcome(c, wire::Verdict::kRefused);
      return flush(c);
    }
    c.phase = Phase::kReady;
    c.deadline = idle_deadline();
    queue_welcome(c, wire::Verdict::kAccepted);
    return flush(c);
  }
  if (c.frame_bytes == 0) {
    if (c.in.size() < wire::kRequestHeaderBytes) return true;
    std::string error;
    const auto header = wire::parse_request_header(c.in, limits_.max_key_bytes, limits_.max_value_bytes, error);
    if (!header) {
      drop(c, error);
      return false;
    }
    c.frame_bytes = header->frame_bytes();
  }
  if (c.in.size() < c.frame_bytes) return true;
  return execute(c);
}

bool TcpStoreServer::Impl::execute(Connection& c) {
  const uint8_t* h = c.in.data();
  auto op = static_cast<wire::Op>(h[0]);
  size_t key_len = wire::get_u32(h + 4);
  std::string key(reinterpret_cast<const char*>(h) + wire::kRequestHeaderBytes, key_len);
  const uint8_t* value = h + wire::kRequestHeaderBytes + key_len;
  size_t value_len = c.frame_bytes - wire::kRequestHeaderBytes - key_len;
  std::vector<uint8_t> body(value, value + value_len);
  c.in.clear();
  c.in.shrink_to_fit();  // an idle connection holds no large buffer
  c.frame_bytes = 0;

  switch (op) {
    case wire::Op::kSet: {
      std::string error = put(key, std::move(body));
      if (!error.empty()) {
        respond_error(c, error);
        break;
      }
      respond(c, wire::Status::kOk, {});
      bool open = flush(c);
      wake_waiters(key);
      return open;
    }
    case wire::Op::kGet: {
      auto it = data_.find(key);
      if (it != data_.end()) {
        respond(c, wire::Status::kOk, it->second);
        break;
      }
      uint64_t wait_ms = std::min(wire::get_u64(body.data()), kMaxWaitMs);
      c.parked = true;
      c.parked_key = key;
      c.deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
      waiters_[key].push_back(c.id);
      return true;
    }
    case wire::Op::kAdd: {
      auto delta = static_cast<int64_t>(wire::get_u64(body.data()));
      int64_t current = 0;
      auto it = data_.find(key);
      if (it != data_.end()) {
        const auto parsed = wire::parse_counter(it->second);
        if (!parsed) {
          respond_error(c, fmt::format("ADD on key '{}': it holds {} bytes that are not a decimal integer", key,
                                       it->second.size()));
          break;
        }
        current = *parsed;
      }
      int64_t updated = 0;
      if (__builtin_add_overflow(current, delta, &updated)) {
        respond_error(c, fmt::format("ADD on key '{}': {} + {} overflows int64", key, current, delta));
        break;
      }
      std::string text = std::to_string(updated);
      std::string error = put(key, std::vector<uint8_t>(text.begin(), text.end()));
      if (!error.empty()) {
        respond_error(c, error);
        break;
      }
      uint8_t out[8];
      wire::put_u64(out, static_cast<uint64_t>(updated));
      respond(c, wire::Status::kOk, out);
      bool open = flush(c);
      wake_waiters(key);
      return open;
    }
    case wire::Op::kErasePrefix: {
      uint8_t out[8];
      wire::put_u64(out, erase_prefix(key));
      respond(c, wire::Status::kOk, out);
      break;
    }
    case wire::Op::kWill: {
      std::string error = set_will(c, std::move(key), std::move(body));
      if (!error.empty()) {
        respond_error(c, error);
        break;
      }
      respond(c, wire::Status::kOk, {});
      break;
    }
  }
  return flush(c);
}

std::string TcpStoreServer::Impl::put(const std::string& key, std::vector<uint8_t> value) {
  auto it = data_.find(key);
  size_t old_bytes = it == data_.end() ? 0 : key.size() + it->second.size();
  size_t new_bytes = key.size() + value.size();
  if (it == data_.end() && data_.size() >= limits_.max_keys) {
    return fmt::format("store {} is full: it holds {} keys (max_keys={}); cannot add key '{}'", address_,
                       data_.size(), limits_.max_keys, key);
  }
  if (counters_.stored_bytes + will_bytes_ - old_bytes + new_bytes > limits_.max_total_bytes) {
    return fmt::format("store {} is full: {} bytes held, {} more for key '{}' would pass max_total_bytes={}",
                       address_, counters_.stored_bytes, new_bytes - std::min(new_bytes, old_bytes), key,
                       limits_.max_total_bytes);
  }
  counters_.stored_bytes = counters_.stored_bytes - old_bytes + new_bytes;
  data_[key] = std::move(value);
  return {};
}

size_t TcpStoreServer::Impl::erase_prefix(const std::string& prefix) {
  // A linear scan: the table is bounded by max_keys, and a prefix erase retires a
  // whole generation of keys at once (store/rendezvous.h), rarely.
  const size_t before = data_.size();
  std::erase_if(data_, [&](const auto& kv) {
    if (!kv.first.starts_with(prefix)) return false;
    counters_.stored_bytes -= kv.first.size() + kv.second.size();
    return true;
  });
  return before - data_.size();
}

std::string TcpStoreServer::Impl::set_will(Connection& c, std::string key, std::vector<uint8_t> value) {
  if (c.will) will_bytes_ -= c.will->key.size() + c.will->value.size();
  c.will.reset();
  if (key.empty()) return {};  // withdrawn
  const size_t bytes = key.size() + value.size();
  if (counters_.stored_bytes + will_bytes_ + bytes > limits_.max_total_bytes) {
    return fmt::format("store {} is full: {} bytes held, {} more for a last will on key '{}' would pass "
                       "max_total_bytes={}",
                       address_, counters_.stored_bytes + will_bytes_, bytes, key, limits_.max_total_bytes);
  }
  will_bytes_ += bytes;
  c.will = Connection::Will{std::move(key), std::move(value)};
  return {};
}

void TcpStoreServer::Impl::execute_will(Connection::Will will) {
  if (data_.contains(will.key)) return;  // someone said more than "gone" already
  std::string error = put(will.key, std::move(will.value));
  if (!error.empty()) {
    log(LogLevel::kWarn, "store server {}: a closed connection's last will was not kept: {}", address_, error);
    return;
  }
  wake_waiters(will.key);
}

void TcpStoreServer::Impl::wake_waiters(const std::string& key) {
  auto node = waiters_.extract(key);
  if (node.empty()) return;
  const std::vector<uint8_t>& value = data_.at(key);
  for (uint64_t id : node.mapped()) {
    auto it = conns_.find(id);
    if (it == conns_.end() || !it->second.parked || it->second.parked_key != key) continue;
    Connection& waiter = it->second;
    waiter.parked = false;
    waiter.parked_key.clear();
    waiter.deadline = idle_deadline();
    respond(waiter, wire::Status::kOk, value);
    flush(waiter);
  }
}

void TcpStoreServer::Impl::unpark(Connection& c) {
  auto it = waiters_.find(c.parked_key);
  if (it != waiters_.end()) {
    std::erase(it->second, c.id);
    if (it->second.empty()) waiters_.erase(it);
  }
  c.parked = false;
  c.parked_key.clear();
}

void TcpStoreServer::Impl::respond(Connection& c, wire::Status status, std::span<const uint8_t> value) {
  c.out.assign(wire::kResponseHeaderBytes + value.size(), 0);
  c.out_sent = 0;
  c.out[0] = static_cast<uint8_t>(status);
  wire::put_u64(c.out.data() + 8, value.size());
  std::copy(value.begin(), value.end(), c.out.begin() + wire::kResponseHeaderBytes);
}

void TcpStoreServer::Impl::respond_error(Connection& c, const std::string& text) {
  std::string_view view(text.data(), std::min(text.size(), wire::kMaxErrorBytes));
  respond(c, wire::Status::kError, {reinterpret_cast<const uint8_t*>(view.data()), view.size()});
}

bool TcpStoreServer::Impl::flush(Connection& c) {
  while (c.out_sent < c.out.size()) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_sent += static_cast<size_t>(n);
      if (c.phase == Phase::kReady) c.deadline = idle_deadline();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;  // POLLOUT resumes it
    close_connection(c.id);  // the peer is gone: nothing to tell it
    return false;
  }
  c.out.clear();
  c.out.shrink_to_fit();
  c.out_sent = 0;
  if (c.phase == Phase::kClosing) {
    drop(c, "refused");
    return false;
  }
  return true;
}

void TcpStoreServer::Impl::expire(Clock::time_point now) {
  std::vector<uint64_t> due;
  for (auto& [id, c] : conns_) {
    if (now >= c.deadline) due.push_back(id);
  }
  for (uint64_t id : due) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    Connection& c = it->second;
    if (c.parked) {
      unpark(c);
      c.deadline = idle_deadline();
      respond(c, wire::Status::kTimeout, {});
      flush(c);
    } else if (c.phase == Phase::kAwaitProof) {
      drop(c, fmt::format("did not prove the job token within auth_timeout={} ms", limits_.auth_timeout.count()));
    } else if (c.phase == Phase::kClosing) {
      drop(c, "did not read its refusal in time");
    } else if (c.will) {
      c.deadline = idle_deadline();  // silent on purpose: it only waits to be closed
    } else {
      drop(c, fmt::format("idle for idle_timeout={} ms", limits_.idle_timeout.count()));
    }
  }
}

void TcpStoreServer::Impl::drop(Connection& c, std::string_view reason) {
  ++counters_.dropped;
  log(LogLevel::kInfo, "store server {}: dropping connection from {}: {}", address_, c.peer, reason);
  close_connection(c.id);
}

void TcpStoreServer::Impl::close_connection(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  if (it->second.parked) unpark(it->second);
  std::optional<Connection::Will> will = std::move(it->second.will);
  conns_.erase(it);  // UniqueFd closes the socket
  if (will) {
    will_bytes_ -= will->key.size() + will->value.size();
    execute_will(std::move(*will));  // after the erase: waking waiters may close others
  }
}

TcpStoreServer::TcpStoreServer(const std::string& host, uint16_t port, std::string job_token, StoreLimits limits)
    : impl_(std::make_unique<Impl>(host, port, std::move(job_token), limits)) {}

TcpStoreServer::~TcpStoreServer() = default;

uint16_t TcpStoreServer::port() const { return impl_->port_; }

std::string TcpStoreServer::address() const { return impl_->address_; }

TcpStoreServer::Stats TcpStoreServer::stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mutex_);
  return impl_->published_;
}

}  // namespace gradcomm::detail
