// The TCP store server under hostile or broken clients: each bad connection is
// closed (the test sees EOF or a reset), the server keeps serving, memory stays
// bounded, and real clients with the right token still rendezvous.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gradcomm/errors.h"
#include "store/auth.h"
#include "store/store.h"
#include "store/store_backends.h"
#include "store/tcp_store_protocol.h"
#include "unit/store_test_client.h"

// ---- allocation probe ---------------------------------------------------------
// Replaces global operator new to record the largest single request, so a test can
// show that a frame claiming 2^64-1 bytes makes the server allocate nothing of
// that size (a failed huge allocation would also end the process).
namespace {
std::atomic<size_t> g_largest_allocation{0};
}  // namespace

namespace {
void* probed_allocation(size_t size) {
  size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
  while (size > seen && !g_largest_allocation.compare_exchange_weak(seen, size, std::memory_order_relaxed)) {
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
}  // namespace

// Array forms too: sanitizer runtimes otherwise route new[] around the scalar one.
void* operator new(size_t size) { return probed_allocation(size); }
void* operator new[](size_t size) { return probed_allocation(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace gradcomm::detail {
namespace {

using namespace std::chrono_literals;
namespace wire = store_wire;

constexpr const char* kToken = "the-job-token";

using store_test::bytes;
using store_test::client;
using store_test::eventually;
using store_test::RawClient;
using store_test::request_header;

class StoreAbuse : public ::testing::Test {
 protected:
  static StoreLimits limits() {
    StoreLimits l;
    l.max_key_bytes = 256;
    l.max_value_bytes = 4096;
    l.max_connections = 16;
    l.auth_timeout = 300ms;
    l.idle_timeout = 500ms;
    return l;
  }

  // Four real ranks with the right token exchange keys through the server.
  void expect_still_serving() {
    constexpr int kRanks = 4;
    const std::string round = std::to_string(round_++);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < kRanks; ++rank) {
      threads.emplace_back([&, rank] {
        try {
          auto store = client(server_.port(), kToken);
          store->set(round + "/" + std::to_string(rank), bytes(std::to_string(rank)));
          for (int peer = 0; peer < kRanks; ++peer) {
            auto v = store->get(round + "/" + std::to_string(peer), 10s);
            EXPECT_EQ(std::string(v.begin(), v.end()), std::to_string(peer));
          }
        } catch (const std::exception& e) {
          ADD_FAILURE() << "rank " << rank << ": " << e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
  }

  TcpStoreServer server_{"127.0.0.1", 0, kToken, limits()};
  int round_ = 0;
};

TEST_F(StoreAbuse, RandomBytesAreDropped) {
  std::mt19937 random(1234);
  for (size_t size : {1, 31, 32, 100, 4096, 65536}) {
    std::vector<uint8_t> junk(size);
    for (auto& b : junk) b = static_cast<uint8_t>(random());
    RawClient raw(server_.port());
    raw.send_bytes(junk);
    EXPECT_TRUE(raw.wait_closed().closed) << size << " random bytes before auth";
  }
  for (size_t size : {1, 16, 100, 4096}) {
    std::vector<uint8_t> junk(size);
    for (auto& b : junk) b = static_cast<uint8_t>(random());
    junk[0] = 0xAB;  // not an opcode
    RawClient raw(server_.port());
    ASSERT_EQ(raw.authenticate(kToken), 0);
    raw.send_bytes(junk);
    EXPECT_TRUE(raw.wait_closed().closed) << size << " random bytes after auth";
  }
  expect_still_serving();
}

TEST_F(StoreAbuse, MaxLengthPrefixIsDroppedWithoutAllocating) {
  constexpr uint64_t kHuge = ~uint64_t{0};  // 2^64 - 1
  const std::vector<std::vector<uint8_t>> frames = {
      request_header(1, 1, kHuge),           // SET claiming 2^64-1 value bytes
      request_header(2, 1, kHuge),           // GET with a bogus length
      request_header(1, 0xFFFFFFFFu, 0),     // 4 GiB key
      request_header(1, 8, 1ull << 40),      // 1 TiB value
  };
  for (const auto& frame : frames) {
    RawClient raw(server_.port());
    ASSERT_EQ(raw.authenticate(kToken), 0);
    g_largest_allocation = 0;
    raw.send_bytes(frame);
    EXPECT_TRUE(raw.wait_closed().closed);
    EXPECT_LT(g_largest_allocation.load(), size_t{1} << 20) << "the server allocated for a claimed length";
  }
  // Straight at the parser, without a token in the way.
  TcpStoreServer open_server("127.0.0.1", 0, "", limits());
  RawClient raw(open_server.port());
  ASSERT_EQ(raw.authenticate(""), 0);
  g_largest_allocation = 0;
  raw.send_bytes(request_header(1, 1, kHuge));
  EXPECT_TRUE(raw.wait_closed().closed);
  EXPECT_LT(g_largest_allocation.load(), size_t{1} << 20);

  // The probe itself is live: a real 2 MiB allocation registers.
  g_largest_allocation = 0;
  auto probe = std::make_unique<uint8_t[]>(size_t{2} << 20);
  EXPECT_GE(g_largest_allocation.load(), size_t{2} << 20);
  probe.reset();

  expect_still_serving();
  EXPECT_TRUE(eventually([&] { return server_.stats().dropped >= frames.size(); }));
  auto stats = server_.stats();
  // One frame at most per connection: header + max key + max value, with vector slack.
  EXPECT_LE(stats.peak_buffered_bytes, 2 * (wire::kRequestHeaderBytes + 256 + 4096));
}

TEST_F(StoreAbuse, HttpRequestIsDropped) {
  const std::string full = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n";
  const std::string short_request = "GET / HTTP/1.1\r\n\r\n";  // shorter than a proof: the auth timeout ends it
  for (const auto& request : {full, short_request}) {
    RawClient raw(server_.port());
    raw.send_bytes(bytes(request));
    auto outcome = raw.wait_closed(3s);
    EXPECT_TRUE(outcome.closed) << request.size() << "-byte HTTP request before auth";
  }
  {
    RawClient raw(server_.port());
    ASSERT_EQ(raw.authenticate(kToken), 0);
    raw.send_bytes(bytes(full));
    EXPECT_TRUE(raw.wait_closed().closed) << "HTTP request after auth";
  }
  expect_still_serving();
}

TEST_F(StoreAbuse, TruncatedFrameAndUnknownOpcodeAreDropped) {
  {
    RawClient raw(server_.port());
    ASSERT_EQ(raw.authenticate(kToken), 0);
    auto frame = request_header(9, 1, 8);  // unknown opcode
    raw.send_bytes(frame);
    EXPECT_TRUE(raw.wait_closed().closed);
  }
  {
    RawClient raw(server_.port());
    ASSERT_EQ(raw.authenticate(kToken), 0);
    auto frame = request_header(1, 1, 4);
    frame[2] = 1;  // reserved byte set
    raw.send_bytes(frame);
    EXPECT_TRUE(raw.wait_closed().closed);
  }
  {
    // Truncated: a header promising 100 value bytes, then 10 of them, then silence.
    RawClient raw(server_.port());
    ASSERT_EQ(raw.authenticate(kToken), 0);
    auto frame = request_header(1, 1, 100);
    frame.push_back('k');
    frame.resize(frame.size() + 10, 'v');
    raw.send_bytes(frame);
    EXPECT_TRUE(raw.wait_closed().closed) << "a stalled half frame is dropped at the idle timeout";
  }
  {
    // Truncated and then closed by the client mid-frame.
    RawClient raw(server_.port());
    ASSERT_EQ(raw.authenticate(kToken), 0);
    raw.send_bytes(request_header(1, 1, 100));
  }
  expect_still_serving();
}

TEST_F(StoreAbuse, WrongTokenIsRefusedClearly) {
  {
    RawClient raw(server_.port());
    EXPECT_EQ(raw.authenticate("not-the-token"), static_cast<int>(wire::Verdict::kRefused));
    EXPECT_TRUE(raw.wait_closed().closed);
  }
  auto start = std::chrono::steady_clock::now();
  try {
    client(server_.port(), "not-the-token", 30s);
    FAIL() << "a wrong token was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("refused the job token"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "refusal must not wait for the connect timeout";
  try {
    client(server_.port(), "", 30s);
    FAIL() << "no token was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("requires a job token"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(eventually([&] { return server_.stats().failed_auth >= 2; }));
  expect_still_serving();
}

TEST_F(StoreAbuse, SilentClientsAreDropped) {
  auto start = std::chrono::steady_clock::now();
  {
    RawClient raw(server_.port());  // connects, never proves the token
    auto outcome = raw.wait_closed(5s);
    EXPECT_TRUE(outcome.closed);
    EXPECT_EQ(outcome.bytes, wire::kGreetingBytes);  // it got the challenge, then nothing
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  {
    RawClient raw(server_.port());
    ASSERT_EQ(raw.authenticate(kToken), 0);
    EXPECT_TRUE(raw.wait_closed(5s).closed) << "an authenticated client silent past idle_timeout";
  }
  expect_still_serving();
}

TEST_F(StoreAbuse, ExcessConnectionsAreClosedAtOnce) {
  StoreLimits l = limits();
  l.max_connections = 8;
  l.idle_timeout = 30s;  // the held connections must outlive the test's checks
  TcpStoreServer server("127.0.0.1", 0, kToken, l);
  // Authenticated, so never evicted (unauthenticated ones may be, once they are
  // older than a handshake: test_store_storm.cc).
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 8; ++i) {
    held.push_back(std::make_unique<RawClient>(server.port()));
    ASSERT_EQ(held.back()->authenticate(kToken), 0);  // accepted and registered
  }
  for (int i = 0; i < 3; ++i) {
    RawClient extra(server.port());
    auto outcome = extra.wait_closed(2s);
    EXPECT_TRUE(outcome.closed);
    EXPECT_EQ(outcome.bytes, 0u) << "an excess connection is closed before any greeting";
  }
  EXPECT_TRUE(eventually([&] { return server.stats().refused_over_capacity >= 3; }));
  held.clear();
  // The slots free up: a real client (which retries a closed connect) gets in.
  auto store = client(server.port(), kToken);
  store->set("k", bytes("v"));
  EXPECT_EQ(store->get("k", 1s), bytes("v"));
}

TEST_F(StoreAbuse, BindsOnlyTheConfiguredAddress) {
  // 127.0.0.2 routes to lo on Linux: a refused connection there shows the server
  // is not on INADDR_ANY.
  RawClient elsewhere(server_.port(), "127.0.0.2");
  EXPECT_EQ(elsewhere.connect_errno(), ECONNREFUSED);
  RawClient here(server_.port(), "127.0.0.1");
  EXPECT_EQ(here.connect_errno(), 0);
  // And the same port on the other address is still free for someone else.
  TcpStoreServer neighbour("127.0.0.2", server_.port(), "");
  EXPECT_EQ(neighbour.port(), server_.port());
  expect_still_serving();
}

TEST_F(StoreAbuse, ManyAbusersAtOnceThenRendezvous) {
  std::vector<std::thread> abusers;
  for (int i = 0; i < 8; ++i) {
    abusers.emplace_back([this, i] {
      RawClient raw(server_.port());
      if (i % 2 == 0) {
        raw.send_bytes(std::vector<uint8_t>(1000, static_cast<uint8_t>(i)));
      } else if (raw.authenticate(kToken) == 0) {
        raw.send_bytes(request_header(1, 1, ~uint64_t{0}));
      }
      EXPECT_TRUE(raw.wait_closed().closed);
    });
  }
  expect_still_serving();
  for (auto& t : abusers) t.join();
  expect_still_serving();
}

}  // namespace
}  // namespace gradcomm::detail
