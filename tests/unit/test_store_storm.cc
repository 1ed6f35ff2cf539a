// The TCP store under a storm: 1,000 garbage connections of every kind (silent,
// random bytes, HTTP, a wrong token proof, 2^64-1 length prefixes before and after
// authenticating, slowloris, connect-and-close) arrive while 16 real ranks
// rendezvous. Pinned: every rank finishes well inside the auth timeout, every
// garbage connection is closed by the server (or refused), a wrong token is
// refused and the server answers on its configured address only, mid-storm; and
// afterwards the server's memory growth is bounded and its descriptors are back
// to their baseline.
//
// The server runs in a forked child process, so its VmRSS / VmHWM and open
// descriptors (/proc/<pid>/...) are its own, not mixed with the 1,000 client
// sockets and threads of this process. The child answers stats requests over a
// pipe (TcpStoreServer::Stats is plain data).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <type_traits>

#include "gradcomm/errors.h"
#include "store/store_backends.h"
#include "unit/store_test_client.h"

namespace gradcomm::detail {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using store_test::client;
using store_test::eventually;
using store_test::time_scale;
using store_test::RawClient;
using store_test::request_header;
namespace wire = store_wire;

constexpr const char* kToken = "storm-job-token";
constexpr int kRanks = 16;
constexpr int kGarbage = 1000;

std::chrono::milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

// ---- the server, in a child process ----------------------------------------------

class ServerProcess {
 public:
  using Stats = TcpStoreServer::Stats;
  static_assert(std::is_trivially_copyable_v<Stats>, "stats cross a pipe as bytes");

  // Forks; the child serves 127.0.0.1:<ephemeral> with `limits` until the command
  // pipe closes. Call before this process starts threads (fork copies one thread).
  explicit ServerProcess(const StoreLimits& limits) {
    int to_child[2], from_child[2];
    if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
      throw std::runtime_error("pipe2 failed");
    }
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::close(to_child[1]);
      ::close(from_child[0]);
      serve(limits, to_child[0], from_child[1]);  // never returns
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    commands_ = to_child[1];
    replies_ = from_child[0];
    uint16_t port = 0;
    if (!read_all(&port, sizeof(port)) || port == 0) throw std::runtime_error("the store child did not start");
    port_ = port;
  }

  ~ServerProcess() {
    ::close(commands_);  // EOF: the child stops its server and exits
    ::close(replies_);
    for (int i = 0; i < 500; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(10ms);
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }

  Stats stats() {
    char command = 'S';
    Stats stats;
    if (::write(commands_, &command, 1) != 1 || !read_all(&stats, sizeof(stats))) {
      throw std::runtime_error("the store child stopped answering");
    }
    return stats;
  }

  // From /proc/<pid>/status, in KiB: "VmRSS" (now) or "VmHWM" (peak so far).
  size_t status_kib(std::string_view field) const {
    std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.starts_with(field) && line.size() > field.size() && line[field.size()] == ':') {
        return std::stoul(line.substr(field.size() + 1));
      }
    }
    throw std::runtime_error("no " + std::string(field) + " in /proc/<pid>/status");
  }

  size_t open_fds() const {
    auto dir = std::filesystem::path("/proc") / std::to_string(pid_) / "fd";
    return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(dir), {}));
  }

 private:
  [[noreturn]] static void serve(const StoreLimits& limits, int commands, int replies) {
    int status = 0;
    try {
      TcpStoreServer server("127.0.0.1", 0, kToken, limits);
      uint16_t port = server.port();
      if (::write(replies, &port, sizeof(port)) != sizeof(port)) ::_exit(2);
      char command = 0;
      while (::read(commands, &command, 1) == 1) {
        Stats stats = server.stats();
        if (::write(replies, &stats, sizeof(stats)) != sizeof(stats)) break;
      }
    } catch (...) {
      uint16_t zero = 0;
      [[maybe_unused]] ssize_t n = ::write(replies, &zero, sizeof(zero));
      status = 1;
    }
    ::_exit(status);  // no gtest teardown, no atexit handlers in the child
  }

  bool read_all(void* out, size_t n) {
    auto* p = static_cast<uint8_t*>(out);
    size_t got = 0;
    while (got < n) {
      pollfd pfd{replies_, POLLIN, 0};
      if (::poll(&pfd, 1, 10'000) <= 0) return false;
      ssize_t r = ::read(replies_, p + got, n - got);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  }

  pid_t pid_ = -1;
  uint16_t port_ = 0;
  int commands_ = -1;
  int replies_ = -1;
};

// ---- the garbage ------------------------------------------------------------------

enum class Kind {
  kSilent,                // connects, reads the greeting, says nothing
  kRandomBytes,           // 1..300 random bytes at once
  kHttp,                  // an HTTP request
  kWrongProof,            // a well-formed proof made with the wrong token
  kHugeLengthBeforeAuth,  // a SET header claiming 2^64-1 value bytes, instead of the proof
  kHugeLengthAfterAuth,   // authenticates (an insider), then the same header
  kSlowloris,             // one random byte every 250 ms
  kConnectAndClose,       // connects and hangs up at once
};
constexpr int kKinds = 8;
constexpr std::array<const char*, kKinds> kKindNames = {
    "silent", "random-bytes", "http", "wrong-proof", "huge-length-before-auth", "huge-length-after-auth",
    "slowloris", "connect-and-close"};

enum class End { kOpen, kClosedByServer, kRefusedAtConnect, kClosedByUs, kConnectError };

struct Garbage {
  Kind kind = Kind::kSilent;
  int fd = -1;
  bool connecting = false;
  End end = End::kOpen;
  int error = 0;
  std::vector<uint8_t> received;  // the greeting and welcome (first 64 bytes)
  bool sent_proof = false;
  bool sent_request = false;
  bool lingers = false;  // holds its slot, owing the rest of a proof, until auth_timeout
  Clock::time_point next_drip{};
};

// Drives all garbage connections from one thread with poll(), so 1,000 of them
// cost one thread here. Runs until every connection has ended or `give_up` passes.
class Storm {
 public:
  // persistent_last: the same garbage in two phases, so that the kinds that hold a
  // slot until auth_timeout (silent, slowloris) end up filling the table whatever
  // the machine's speed. Phase one is every other kind. Phase two opens only once
  // phase one has settled (each connection ended, or is lingering with its
  // greeting read) and kEvictableAfter more has passed, so every slot phase one
  // still holds is evictable. Opened at once instead, on a slow server the
  // persistent kinds queue behind short-lived garbage that is still in its
  // handshake (young, so not evictable), are refused for capacity, and the table
  // then drains below full as the short-lived garbage ends.
  Storm(uint16_t port, Clock::duration give_up, bool persistent_last = false)
      : port_(port), give_up_(give_up), conns_(kGarbage) {
    for (int i = 0; i < kGarbage; ++i) conns_[i].kind = static_cast<Kind>(i % kKinds);
    if (persistent_last) {
      auto first_persistent = std::stable_partition(conns_.begin(), conns_.end(), [](const Garbage& g) {
        return g.kind != Kind::kSilent && g.kind != Kind::kSlowloris;
      });
      phase_two_from_ = static_cast<int>(first_persistent - conns_.begin());
    }
    thread_ = std::thread([this] { run(); });
  }
  ~Storm() {
    if (thread_.joinable()) thread_.join();
    for (auto& g : conns_) {
      if (g.fd >= 0) ::close(g.fd);
    }
  }
  int opened() const { return opened_.load(); }
  // Waits for the storm to end; then conns() is stable.
  const std::vector<Garbage>& finish() {
    thread_.join();
    return conns_;
  }

 private:
  static constexpr int kOpenPerTurn = 50;
  static constexpr auto kDripEvery = 250ms;
  // The server's kEvictableAfter (500 ms, tcp_store_server.cc) plus a margin.
  static constexpr auto kPhaseTwoAfter = 750ms;

  // Phase one has settled: each of its connections has ended, or lingers with the
  // greeting read (so the server accepted it before now).
  bool phase_one_settled() const {
    return std::all_of(conns_.begin(), conns_.begin() + phase_two_from_, [](const Garbage& g) {
      return g.fd < 0 || (g.lingers && !g.connecting && g.received.size() >= wire::kGreetingBytes);
    });
  }

  void run() {
    auto start = Clock::now();
    std::optional<Clock::time_point> settled_at;
    int next = 0;
    for (;;) {
      int open_up_to = kGarbage;
      if (next < phase_two_from_) {
        open_up_to = phase_two_from_;
      } else if (next < kGarbage) {  // phase one is all open; phase two waits for it to settle
        if (!settled_at && phase_one_settled()) settled_at = Clock::now();
        if (!settled_at || Clock::now() - *settled_at < kPhaseTwoAfter) open_up_to = phase_two_from_;
      }
      for (int n = 0; n < kOpenPerTurn && next < open_up_to; ++n) open(conns_[next++]);
      opened_.store(next);
      std::vector<pollfd> fds;
      std::vector<Garbage*> owners;
      auto now = Clock::now();
      for (auto& g : conns_) {
        if (g.fd < 0) continue;
        fds.push_back({g.fd, static_cast<short>(g.connecting ? POLLOUT : POLLIN), 0});
        owners.push_back(&g);
        if (g.kind == Kind::kSlowloris && !g.connecting && now >= g.next_drip) {
          drip(g, now);
        }
      }
      if (owners.empty() && next == kGarbage) return;
      if (Clock::now() - start > give_up_) return;  // whatever is still open stays kOpen
      ::poll(fds.data(), fds.size(), 10);
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents != 0 && owners[i]->fd >= 0) handle(*owners[i]);
      }
    }
  }

  void open(Garbage& g) {
    g.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (g.fd < 0) return finish(g, End::kConnectError, errno);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port_);
    ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (::connect(g.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return connected(g);
    if (errno == EINPROGRESS) {
      g.connecting = true;
      return;
    }
    finish(g, errno == ECONNREFUSED ? End::kRefusedAtConnect : End::kConnectError, errno);
  }

  void connected(Garbage& g) {
    g.connecting = false;
    switch (g.kind) {
      case Kind::kRandomBytes: {
        std::vector<uint8_t> junk(1 + random_() % 300);
        for (auto& b : junk) b = static_cast<uint8_t>(random_());
        send(g, junk);
        g.lingers = junk.size() < wire::kProofBytes;  // the server waits for the rest of a "proof"
        break;
      }
      case Kind::kSilent:
        g.lingers = true;
        break;
      case Kind::kHugeLengthBeforeAuth:
        send(g, request_header(static_cast<uint8_t>(wire::Op::kSet), 1, ~uint64_t{0}));
        g.lingers = wire::kRequestHeaderBytes < wire::kProofBytes;  // read as the start of a proof
        break;
      case Kind::kHttp:
        send(g, store_test::bytes("GET /v1/keys HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: scanner/1.0\r\n\r\n"));
        break;
      case Kind::kSlowloris:
        g.lingers = true;
        g.next_drip = Clock::now();
        break;
      case Kind::kConnectAndClose:
        finish(g, End::kClosedByUs, 0);
        break;
      default:
        break;
    }
  }

  void drip(Garbage& g, Clock::time_point now) {
    send(g, {static_cast<uint8_t>(random_())});
    g.next_drip = now + kDripEvery;
  }

  // Readable, hung up or (while connecting) writable: recv() / SO_ERROR tell which.
  void handle(Garbage& g) {
    if (g.connecting) {
      int error = 0;
      socklen_t length = sizeof(error);
      ::getsockopt(g.fd, SOL_SOCKET, SO_ERROR, &error, &length);
      if (error == 0) return connected(g);
      return finish(g, error == ECONNREFUSED ? End::kRefusedAtConnect : End::kConnectError, error);
    }
    uint8_t buffer[4096];
    ssize_t r = ::recv(g.fd, buffer, sizeof(buffer), 0);
    if (r == 0 || (r < 0 && (errno == ECONNRESET || errno == EPIPE))) return finish(g, End::kClosedByServer, 0);
    if (r < 0) return;  // EAGAIN: a spurious wake
    size_t keep = std::min<size_t>(static_cast<size_t>(r), 64 - std::min<size_t>(64, g.received.size()));
    g.received.insert(g.received.end(), buffer, buffer + keep);
    bool have_greeting = g.received.size() >= wire::kGreetingBytes;
    bool have_welcome = g.received.size() >= wire::kGreetingBytes + wire::kWelcomeBytes;
    if ((g.kind == Kind::kWrongProof || g.kind == Kind::kHugeLengthAfterAuth) && have_greeting && !g.sent_proof) {
      std::span<const uint8_t> nonce(g.received.data() + 8, wire::kNonceBytes);
      AuthProof proof = make_auth_proof(g.kind == Kind::kWrongProof ? "not-the-storm-token" : kToken, nonce);
      send(g, std::vector<uint8_t>(proof.begin(), proof.end()));
      g.sent_proof = true;
    }
    if (g.kind == Kind::kHugeLengthAfterAuth && have_welcome && !g.sent_request &&
        g.received[wire::kGreetingBytes + 4] == static_cast<uint8_t>(wire::Verdict::kAccepted)) {
      send(g, request_header(static_cast<uint8_t>(wire::Op::kSet), 1, ~uint64_t{0}));
      g.sent_request = true;
    }
  }

  void send(Garbage& g, const std::vector<uint8_t>& data) {
    // The server may have closed on us already; the next recv() sees that.
    [[maybe_unused]] ssize_t n = ::send(g.fd, data.data(), data.size(), MSG_NOSIGNAL);
  }

  void finish(Garbage& g, End end, int error) {
    if (g.fd >= 0) ::close(g.fd);
    g.fd = -1;
    g.end = end;
    g.error = error;
  }

  uint16_t port_;
  Clock::duration give_up_;
  std::vector<Garbage> conns_;
  int phase_two_from_ = kGarbage;  // conns_[phase_two_from_...] are phase two (persistent_last)
  std::atomic<int> opened_{0};
  std::mt19937 random_{20261122};
  std::thread thread_;
};

// ---- the real ranks ---------------------------------------------------------------

struct RankOutcome {
  std::chrono::milliseconds elapsed{-1};
  int64_t arrival = 0;  // what this rank's ADD on the barrier counter returned
  std::string error;
};

std::vector<uint8_t> rank_value(int rank) {
  std::string text = "address-of-rank-" + std::to_string(rank) + ":";
  text.resize(200, static_cast<char>('a' + rank));
  return store_test::bytes(text);
}

// One rank's rendezvous: publish, read all 16 (its own too), ADD barrier. Rank 0's
// server half is the child process, so rank 0 connects its client half directly
// (what create_store does for rank 0 after starting the server); the others go
// through create_store with their rank and the world size.
void rendezvous(uint16_t port, int rank, RankOutcome& outcome) {
  auto start = Clock::now();
  try {
    auto store = rank == 0 ? connect_tcp_store("127.0.0.1", port, kToken, 30s)
                           : client(port, kToken, 30s, rank, kRanks);
    store->set("rank/" + std::to_string(rank), rank_value(rank));
    for (int peer = 0; peer < kRanks; ++peer) {
      if (store->get("rank/" + std::to_string(peer), 30s) != rank_value(peer)) {
        throw std::runtime_error("wrong value for rank " + std::to_string(peer));
      }
    }
    outcome.arrival = store->add("barrier/arrived", 1);
    if (outcome.arrival == kRanks) store->set("barrier/open", store_test::bytes("1"));
    store->get("barrier/open", 30s);
    outcome.elapsed = since(start);
  } catch (const std::exception& e) {
    outcome.error = e.what();
  }
}

// ---- the test ---------------------------------------------------------------------

// Per-connection server state is a Connection (~200 B), its map node, a pollfd and
// at most one greeting (40 B) plus 32 proof bytes before authentication: under
// 1 KiB. The budget allows 4 KiB each, plus 16 MiB for the allocator's own growth
// (a thread arena's heap, pages touched once and kept).
constexpr size_t kPerConnectionBudgetKiB = 4;
constexpr size_t kFixedBudgetKiB = 16 * 1024;

// Raises this process's descriptor limit to what the storm needs (the child inherits it).
bool enough_descriptors(rlim_t want) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_cur >= want) return true;
  limit.rlim_cur = std::min(want, limit.rlim_max);
  ::setrlimit(RLIMIT_NOFILE, &limit);
  return limit.rlim_cur >= want;
}

// fill_table_first: the ranks start once the garbage fills the whole connection
// table (which must then make room for them); else once half the garbage is open.
void run_storm(const StoreLimits& limits, bool fill_table_first) {
  if (!enough_descriptors(4 * kGarbage)) GTEST_SKIP() << "RLIMIT_NOFILE's hard limit is below " << 4 * kGarbage;
  ServerProcess server(limits);  // fork first, while this process has one thread

  // Warm-up: one full client session, so lazily set-up state (OpenSSL's HMAC, the
  // first allocations of the server thread's arena) is in the baseline.
  {
    auto store = client(server.port(), kToken);
    store->set("warm-up", store_test::bytes("x"));
    store->add("warm-up-counter", 1);
    EXPECT_EQ(store->get("warm-up", 1s), store_test::bytes("x"));
  }
  ASSERT_TRUE(eventually([&] { return server.stats().open_connections == 0; }));
  const size_t rss_before = server.status_kib("VmRSS");
  const size_t fds_before = server.open_fds();

  const auto storm_start = Clock::now();
  Storm storm(server.port(), limits.auth_timeout + 5s, /*persistent_last=*/fill_table_first);
  if (fill_table_first) {
    // The silent, slowloris and unfinished-proof connections alone outnumber the
    // table. Wait until all garbage is out and the table has stayed full for a
    // while: the short-lived kinds (refused proofs, insiders' bad frames) are gone
    // by then, so no slot frees by itself before auth_timeout.
    ASSERT_TRUE(eventually([&] { return storm.opened() == kGarbage; }, 10s));
    auto full_since = Clock::now();
    ASSERT_TRUE(eventually(
        [&] {
          if (server.stats().open_connections < limits.max_connections) full_since = Clock::now();
          return since(full_since) >= 200ms;
        },
        10s))
        << "the garbage did not fill the connection table: " << server.stats().open_connections << " open";
  } else {
    ASSERT_TRUE(eventually([&] { return storm.opened() >= kGarbage / 2; }, 10s));
  }

  // The ranks rendezvous while the garbage keeps arriving and sits in the table.
  std::vector<RankOutcome> ranks(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] { rendezvous(server.port(), rank, ranks[rank]); });
  }

  // Mid-storm: a wrong token is refused (create_store retries a connection the
  // server closed for capacity, and stops at the refusal)...
  auto refusal_start = Clock::now();
  try {
    client(server.port(), "not-the-storm-token", 20s);
    ADD_FAILURE() << "a wrong token was accepted during the storm";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("refused the job token"), std::string::npos) << e.what();
  }
  EXPECT_LT(since(refusal_start), limits.auth_timeout / 2) << "the wrong token's refusal";
  // ... and the server is on its configured address only (127.0.0.2 routes to lo).
  RawClient elsewhere(server.port(), "127.0.0.2");
  EXPECT_EQ(elsewhere.connect_errno(), ECONNREFUSED) << "the store answered on 127.0.0.2";
  const int garbage_open_while_ranks_ran = storm.opened();

  for (auto& t : threads) t.join();
  const auto bound = limits.auth_timeout / 2;
  std::vector<int64_t> arrivals;
  for (int rank = 0; rank < kRanks; ++rank) {
    const auto& r = ranks[rank];
    EXPECT_TRUE(r.error.empty()) << "rank " << rank << ": " << r.error;
    EXPECT_GE(r.elapsed.count(), 0) << "rank " << rank;
    EXPECT_LT(r.elapsed, bound) << "rank " << rank << " took " << r.elapsed.count() << " ms to rendezvous";
    arrivals.push_back(r.arrival);
  }
  std::sort(arrivals.begin(), arrivals.end());
  std::vector<int64_t> one_to_n(kRanks);
  std::iota(one_to_n.begin(), one_to_n.end(), 1);
  EXPECT_EQ(arrivals, one_to_n) << "each ADD on the barrier counter must return a distinct 1..16";
  EXPECT_GE(garbage_open_while_ranks_ran, fill_table_first ? static_cast<int>(limits.max_connections) : kGarbage / 2);
  EXPECT_LT(since(storm_start), limits.auth_timeout) << "the ranks ran after the silent garbage timed out";

  // Every garbage connection ends: closed by the server (or refused), never left open.
  const auto& garbage = storm.finish();
  std::array<int, kKinds> closed_by_server{}, refused_verdicts{}, wrong_proofs_answered{};
  for (size_t i = 0; i < garbage.size(); ++i) {
    const Garbage& g = garbage[i];
    int k = static_cast<int>(g.kind);
    const char* name = kKindNames[k];
    EXPECT_NE(g.end, End::kOpen) << "garbage #" << i << " (" << name << ") is still open after the auth timeout";
    EXPECT_NE(g.end, End::kConnectError) << "garbage #" << i << " (" << name << "): " << std::strerror(g.error);
    if (g.kind == Kind::kConnectAndClose) {
      EXPECT_EQ(g.end, End::kClosedByUs);
      continue;
    }
    if (g.end == End::kClosedByServer || g.end == End::kRefusedAtConnect) ++closed_by_server[k];
    if (g.received.size() >= wire::kGreetingBytes) {
      EXPECT_EQ(store_wire::get_u32(g.received.data()), wire::kMagic) << "garbage #" << i << " got a bad greeting";
    }
    if (g.received.size() >= wire::kGreetingBytes + wire::kWelcomeBytes) {
      uint8_t verdict = g.received[wire::kGreetingBytes + 4];
      if (g.kind == Kind::kWrongProof) {
        ++wrong_proofs_answered[k];
        if (verdict == static_cast<uint8_t>(wire::Verdict::kRefused)) ++refused_verdicts[k];
      } else if (g.kind != Kind::kHugeLengthAfterAuth) {
        // Any 32 bytes read as a proof (random bytes, HTTP, a slow drip): refused.
        EXPECT_EQ(verdict, static_cast<uint8_t>(wire::Verdict::kRefused))
            << "garbage #" << i << " (" << name << ") was welcomed";
      }
    }
  }
  for (int k = 0; k < kKinds; ++k) {
    if (static_cast<Kind>(k) == Kind::kConnectAndClose) continue;
    EXPECT_EQ(closed_by_server[k], kGarbage / kKinds) << kKindNames[k] << " connections closed (or refused) by the server";
  }
  int wrong = static_cast<int>(Kind::kWrongProof);
  EXPECT_EQ(refused_verdicts[wrong], wrong_proofs_answered[wrong]) << "every answered wrong proof is refused";

  // The server is back to no connections, holds its baseline descriptors, and grew
  // by no more than the per-connection budget at its peak.
  ASSERT_TRUE(eventually([&] { return server.stats().open_connections == 0; }, 5s))
      << server.stats().open_connections << " connections still open";
  EXPECT_TRUE(eventually([&] { return server.open_fds() == fds_before; }, 2s))
      << "server descriptors: " << fds_before << " before the storm, " << server.open_fds() << " after";
  auto stats = server.stats();
  const size_t peak_kib = server.status_kib("VmHWM");
  const size_t budget_kib = kFixedBudgetKiB + kPerConnectionBudgetKiB * (kGarbage + kRanks);
  EXPECT_LT(peak_kib - std::min(peak_kib, rss_before), budget_kib)
      << "server RSS " << rss_before << " KiB before the storm, peak " << peak_kib << " KiB";
  // Nothing of a claimed 2^64-1 length was buffered: the largest input buffer is a
  // rank's SET frame (16 + key + 200 value bytes), not a garbage frame.
  EXPECT_LE(stats.peak_buffered_bytes, 4096u);
  EXPECT_GE(stats.failed_auth, static_cast<uint64_t>(wrong_proofs_answered[wrong]) + 1);
  EXPECT_GE(stats.accepted, static_cast<uint64_t>(kGarbage / kKinds * (kKinds - 1)));
  if (fill_table_first) {
    EXPECT_GT(stats.evicted_unauthenticated, 0u) << "the garbage overflowed the table, yet nothing was evicted";
  } else {
    EXPECT_EQ(stats.refused_over_capacity, 0u);
  }
  std::printf("storm: server RSS %zu KiB before, peak %zu KiB (+%zu KiB); %zu fds; accepted %llu, dropped %llu, "
              "over capacity %llu, evicted %llu, failed auth %llu; slowest rank %lld ms\n",
              rss_before, peak_kib, peak_kib - std::min(peak_kib, rss_before), fds_before,
              static_cast<unsigned long long>(stats.accepted), static_cast<unsigned long long>(stats.dropped),
              static_cast<unsigned long long>(stats.refused_over_capacity),
              static_cast<unsigned long long>(stats.evicted_unauthenticated),
              static_cast<unsigned long long>(stats.failed_auth),
              static_cast<long long>(std::max_element(ranks.begin(), ranks.end(), [](auto& a, auto& b) {
                                       return a.elapsed < b.elapsed;
                                     })->elapsed.count()));
}

// The default limits (max_connections = 1024): 1,000 garbage connections and 16
// ranks fit, and nothing real waits on the garbage.
TEST(StoreStorm, ThousandGarbageConnectionsWhileSixteenRanksRendezvous) {
  run_storm(StoreLimits{}, /*fill_table_first=*/false);
}

// A table smaller than the garbage: without eviction the silent and slowloris
// connections would hold every slot until auth_timeout and lock the ranks out.
// Unauthenticated connections past their handshake time make room instead;
// authenticated ones are never evicted.
TEST(StoreStorm, GarbageFillingTheConnectionTableDoesNotLockOutRanks) {
  StoreLimits limits;
  limits.max_connections = 64;
  // The garbage must outlive the storm's setup: under TSan opening 1,000 connections
  // alone can take longer than the default 5 s, and expired garbage frees the table.
  limits.auth_timeout *= time_scale();
  run_storm(limits, /*fill_table_first=*/true);
}

// The eviction rule on its own, in slow motion (the storm above shows it at scale):
// with the table full, a newcomer evicts the oldest connection still owing its
// proof once that one is older than a handshake; young unauthenticated connections
// and authenticated ones are never evicted, so a newcomer is then refused.
TEST(StoreEviction, OnlyStaleUnauthenticatedConnectionsMakeRoom) {
  StoreLimits limits;
  limits.max_connections = 8;
  limits.auth_timeout = 30s;  // nothing expires by itself during the test
  limits.idle_timeout = 30s;
  TcpStoreServer server("127.0.0.1", 0, kToken, limits);
  auto served = [](RawClient& c) {  // one SET answered OK on this connection
    auto frame = request_header(static_cast<uint8_t>(wire::Op::kSet), 1, 1);
    frame.push_back('k');
    frame.push_back('v');
    c.send_bytes(frame);
    uint8_t response[wire::kResponseHeaderBytes];
    return c.read_exact(response, sizeof(response), 2s) && response[0] == static_cast<uint8_t>(wire::Status::kOk);
  };
  std::vector<std::unique_ptr<RawClient>> authenticated, silent;
  for (int i = 0; i < 4; ++i) {
    authenticated.push_back(std::make_unique<RawClient>(server.port()));
    ASSERT_EQ(authenticated.back()->authenticate(kToken), 0);
  }
  auto silent_since = Clock::now();
  for (int i = 0; i < 4; ++i) {
    silent.push_back(std::make_unique<RawClient>(server.port()));
    uint8_t greeting[wire::kGreetingBytes];
    ASSERT_TRUE(silent.back()->read_exact(greeting, sizeof(greeting)));
  }
  {
    // The silent ones are younger than a handshake may take: not evictable yet.
    RawClient early(server.port());
    auto outcome = early.wait_closed(2s);
    if (since(silent_since) < 400ms) {  // else this machine was too slow to tell
      EXPECT_TRUE(outcome.closed);
      EXPECT_EQ(outcome.bytes, 0u) << "a young unauthenticated connection was evicted";
    }
  }
  std::this_thread::sleep_for(600ms);
  std::vector<std::unique_ptr<RawClient>> newcomers;
  for (int i = 0; i < 4; ++i) {
    newcomers.push_back(std::make_unique<RawClient>(server.port()));
    EXPECT_EQ(newcomers.back()->authenticate(kToken), 0) << "newcomer " << i << " found no room";
  }
  for (auto& s : silent) {
    auto outcome = s->wait_closed(2s);
    EXPECT_TRUE(outcome.closed) << "a stale unauthenticated connection was not evicted";
    EXPECT_EQ(outcome.bytes, 0u);  // its greeting was read above; nothing more came
  }
  EXPECT_TRUE(eventually([&] { return server.stats().evicted_unauthenticated == 4; }));
  {
    // Eight authenticated connections: nobody is evictable, the newcomer is refused.
    RawClient extra(server.port());
    auto outcome = extra.wait_closed(2s);
    EXPECT_TRUE(outcome.closed);
    EXPECT_EQ(outcome.bytes, 0u) << "an authenticated connection was evicted";
  }
  for (auto& c : authenticated) EXPECT_TRUE(served(*c)) << "an authenticated connection lost its service";
  for (auto& c : newcomers) EXPECT_TRUE(served(*c));
  EXPECT_EQ(server.stats().evicted_unauthenticated, 4u);
}

}  // namespace
}  // namespace gradcomm::detail
