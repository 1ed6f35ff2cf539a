// Rendezvous stores: TCP (server + clients in threads) and file, and URL parsing.
// Abuse of the TCP server (garbage, auth, caps) is in test_store_abuse.cc.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "free_port.h"
#include "gradcomm/errors.h"
#include "store/store.h"
#include "store/store_backends.h"

namespace gradcomm::detail {
namespace {

using namespace std::chrono_literals;
using Ms = std::chrono::milliseconds;

std::vector<uint8_t> bytes(std::string_view s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

// A port that was free a moment ago (for create_store, whose URL needs a real port).
uint16_t free_port() {
  const int port = free_loopback_ports(1);
  EXPECT_NE(port, 0) << "no free port on 127.0.0.1";
  return static_cast<uint16_t>(port);
}

std::string url(uint16_t port) { return "tcp://127.0.0.1:" + std::to_string(port); }

std::unique_ptr<Store> client(uint16_t port, const std::string& token = "", Ms timeout = 10s) {
  StoreOptions options;
  options.url = url(port);
  options.rank = 1;
  options.job_token = token;
  options.timeout = timeout;
  return create_store(options);
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "gradcomm-store-XXXXXX").string();
    path = ::mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string url() const { return "file://" + path.string(); }
};

std::unique_ptr<Store> file_store(const std::string& store_url) {
  StoreOptions options;
  options.url = store_url;
  options.timeout = 10s;
  return create_store(options);
}

// ---- TCP store --------------------------------------------------------------

TEST(TcpStore, SetGetAddAcrossClientThreads) {
  TcpStoreServer server("127.0.0.1", 0, "");
  constexpr int kThreads = 4;
  constexpr int kAdds = 50;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        auto store = client(server.port());
        store->set("value/" + std::to_string(t), bytes("from " + std::to_string(t)));
        for (int i = 0; i < kAdds; ++i) store->add("counter", 1);
        for (int peer = 0; peer < kThreads; ++peer) {
          if (text(store->get("value/" + std::to_string(peer), 10s)) != "from " + std::to_string(peer)) ++failures;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  auto store = client(server.port());
  EXPECT_EQ(store->add("counter", 0), kThreads * kAdds);
  EXPECT_EQ(text(store->get("counter", 1s)), std::to_string(kThreads * kAdds));  // decimal text
  EXPECT_EQ(store->add("counter", -kThreads * kAdds - 5), -5);
}

TEST(TcpStore, ValuesAreArbitraryBytes) {
  TcpStoreServer server("127.0.0.1", 0, "");
  auto store = client(server.port());
  std::vector<uint8_t> binary(StoreLimits{}.max_value_bytes);
  for (size_t i = 0; i < binary.size(); ++i) binary[i] = static_cast<uint8_t>(i * 131 + 7);
  store->set("big", binary);
  EXPECT_EQ(store->get("big", 1s), binary);
  store->set("empty", {});
  EXPECT_TRUE(store->get("empty", 1s).empty());
  store->set("", bytes("empty key"));
  EXPECT_EQ(text(store->get("", 1s)), "empty key");
  store->set("big", bytes("overwritten"));
  EXPECT_EQ(text(store->get("big", 1s)), "overwritten");
}

TEST(TcpStore, MaximalTimeoutsMeanWaitLong) {
  StoreLimits limits;
  limits.idle_timeout = Ms::max();
  limits.auth_timeout = Ms::max();
  TcpStoreServer server("127.0.0.1", 0, "t", limits);
  auto store = client(server.port(), "t", Ms::max());
  store->set("k", bytes("v"));
  EXPECT_EQ(text(store->get("k", Ms::max())), "v");
  std::thread t([&] { EXPECT_EQ(text(store->get("later", Ms::max())), "w"); });
  std::this_thread::sleep_for(50ms);
  store->set("later", bytes("w"));
  t.join();
}

// A get() parked on one connection returns once another sets the key.
void expect_get_waits_for_set(Store& waiter, Store& setter) {
  std::vector<uint8_t> got;
  auto start = std::chrono::steady_clock::now();
  std::thread t([&] { got = waiter.get("late", 10s); });
  std::this_thread::sleep_for(300ms);
  setter.set("late", bytes("here"));
  t.join();
  EXPECT_EQ(text(got), "here");
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
}

TEST(TcpStore, GetBlocksUntilLaterSet) {
  TcpStoreServer server("127.0.0.1", 0, "");
  expect_get_waits_for_set(*client(server.port()), *client(server.port()));
}

TEST(TcpStore, SharedStoreServesConcurrentGetAndSet) {
  // One Store used by two threads: the parked get must not block the set.
  TcpStoreServer server("127.0.0.1", 0, "");
  auto store = client(server.port());
  std::vector<uint8_t> got;
  std::thread t([&] { got = store->get("k", 10s); });
  std::this_thread::sleep_for(100ms);
  store->set("k", bytes("v"));
  t.join();
  EXPECT_EQ(text(got), "v");
}

TEST(TcpStore, GetTimeoutNamesKeyAndAddress) {
  TcpStoreServer server("127.0.0.1", 0, "");
  auto store = client(server.port());
  auto start = std::chrono::steady_clock::now();
  try {
    store->get("never/set", 300ms);
    FAIL() << "get returned";
  } catch (const TimeoutError& e) {
    auto elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_GE(elapsed, 290ms);
    EXPECT_LT(elapsed, 2s);
    EXPECT_NE(std::string(e.what()).find("never/set"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(url(server.port())), std::string::npos) << e.what();
  }
  // The connection stays usable after a timed-out wait.
  store->set("after", bytes("ok"));
  EXPECT_EQ(text(store->get("after", 1s)), "ok");
}

TEST(TcpStore, SixteenClientsRendezvous) {
  constexpr int kRanks = 16;
  const uint16_t port = free_port();
  std::vector<std::thread> threads;
  std::atomic<int> done{0};
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        StoreOptions options;
        options.url = url(port);
        options.rank = rank;  // rank 0 serves; the others retry until it is up
        options.world_size = kRanks;
        options.job_token = "sixteen";
        options.timeout = 20s;
        auto store = create_store(options);
        store->set("addr/" + std::to_string(rank), bytes("rank-" + std::to_string(rank)));
        for (int peer = 0; peer < kRanks; ++peer) {
          EXPECT_EQ(text(store->get("addr/" + std::to_string(peer), 20s)), "rank-" + std::to_string(peer));
        }
        // Rank 0's Store owns the server: it stays until every rank is through.
        store->add("finished", 1);
        if (rank == 0) {
          while (store->add("finished", 0) < kRanks) std::this_thread::sleep_for(5ms);
        }
        ++done;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(done, kRanks);
}

TEST(TcpStore, ClientRetriesUntilServerStarts) {
  const uint16_t port = free_port();
  std::unique_ptr<Store> store;
  std::thread t([&] { store = client(port, "", 10s); });
  std::this_thread::sleep_for(400ms);
  TcpStoreServer server("127.0.0.1", port, "");
  t.join();
  ASSERT_NE(store, nullptr);
  store->set("k", bytes("v"));
  EXPECT_EQ(text(store->get("k", 1s)), "v");
}

TEST(TcpStore, ConnectTimeoutNamesAddress) {
  const uint16_t port = free_port();  // nothing listens there
  auto start = std::chrono::steady_clock::now();
  try {
    client(port, "", 300ms);
    FAIL() << "connected to nothing";
  } catch (const TimeoutError& e) {
    EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
    EXPECT_NE(std::string(e.what()).find(url(port)), std::string::npos) << e.what();
  }
}

TEST(TcpStore, LimitsAreInvalidArgumentForTheCaller) {
  StoreLimits limits;
  limits.max_key_bytes = 16;
  limits.max_value_bytes = 64;
  limits.max_keys = 2;
  TcpStoreServer server("127.0.0.1", 0, "", limits);
  auto store = client(server.port());
  EXPECT_THROW(store->set(std::string(17, 'k'), bytes("v")), InvalidArgument);
  EXPECT_THROW(store->set("k", std::vector<uint8_t>(65, 1)), InvalidArgument);
  store->set("a", bytes("1"));
  store->set("b", bytes("2"));
  store->set("a", bytes("overwrite is fine"));
  try {
    store->set("c", bytes("3"));
    FAIL() << "third key accepted with max_keys=2";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("max_keys=2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(store->add("a", 1), InvalidArgument);  // "overwrite is fine" is not an integer
  // Still usable afterwards.
  EXPECT_EQ(text(store->get("b", 1s)), "2");
  EXPECT_EQ(store->add("b", 40), 42);
}

TEST(TcpStore, ReconnectsAfterIdleDrop) {
  StoreLimits limits;
  limits.idle_timeout = 200ms;
  TcpStoreServer server("127.0.0.1", 0, "tok", limits);
  auto store = client(server.port(), "tok");
  store->set("k", bytes("v"));
  std::this_thread::sleep_for(600ms);  // the server drops the idle connection
  EXPECT_EQ(text(store->get("k", 1s)), "v");
  EXPECT_EQ(store->add("n", 2), 2);
}

TEST(TcpStore, ServerShutdownFailsParkedGetPromptly) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0, "");
  auto store = client(server->port(), "", 60s);
  std::atomic<bool> failed{false};
  std::thread t([&] {
    try {
      store->get("never", 60s);
    } catch (const Error&) {
      failed = true;
    }
  });
  std::this_thread::sleep_for(200ms);
  auto start = std::chrono::steady_clock::now();
  server.reset();  // must not wait for the parked client
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  t.join();
  EXPECT_TRUE(failed);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(TcpStore, CreateStoreRankZeroServesItsAddress) {
  const uint16_t port = free_port();
  StoreOptions options;
  options.url = url(port);
  options.rank = 0;
  options.world_size = 2;
  options.timeout = 5s;
  auto rank0 = create_store(options);
  EXPECT_EQ(rank0->address(), url(port));
  auto rank1 = client(port);
  rank1->set("from1", bytes("x"));
  EXPECT_EQ(text(rank0->get("from1", 1s)), "x");
  // The port is taken now: a second server on it is a TransportError naming it.
  try {
    TcpStoreServer clash("127.0.0.1", port, "");
    FAIL() << "second bind succeeded";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(port)), std::string::npos) << e.what();
  }
}

// ---- file store -------------------------------------------------------------

TEST(FileStore, SetGetAddAcrossThreads) {
  TempDir dir;
  constexpr int kThreads = 8;
  constexpr int kAdds = 25;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto store = file_store(dir.url());
      store->set("v/" + std::to_string(t), bytes(std::to_string(t)));
      for (int i = 0; i < kAdds; ++i) store->add("counter", 1);
      for (int peer = 0; peer < kThreads; ++peer) {
        EXPECT_EQ(text(store->get("v/" + std::to_string(peer), 10s)), std::to_string(peer));
      }
    });
  }
  for (auto& t : threads) t.join();
  auto store = file_store(dir.url());
  EXPECT_EQ(store->add("counter", 0), kThreads * kAdds);
  EXPECT_EQ(text(store->get("counter", 1s)), std::to_string(kThreads * kAdds));
  EXPECT_EQ(store->address(), dir.url());
}

TEST(FileStore, GetBlocksUntilLaterSet) {
  TempDir dir;
  expect_get_waits_for_set(*file_store(dir.url()), *file_store(dir.url()));
}

TEST(FileStore, GetTimeoutNamesKey) {
  TempDir dir;
  auto store = file_store(dir.url());
  auto start = std::chrono::steady_clock::now();
  try {
    store->get("never/set", 200ms);
    FAIL();
  } catch (const TimeoutError& e) {
    auto elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_GE(elapsed, 190ms);
    EXPECT_LT(elapsed, 2s);
    EXPECT_NE(std::string(e.what()).find("never/set"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir.url()), std::string::npos) << e.what();
  }
}

TEST(FileStore, AwkwardKeysStayInsideTheDirectory) {
  TempDir dir;
  auto store = file_store(dir.url());
  const std::vector<std::string> keys = {"../escape", "a/b/c", "", ".", "..", "%41", "A", "sp ace\n",
                                         std::string(1000, 'x'), std::string(1000, 'x') + "y"};
  for (size_t i = 0; i < keys.size(); ++i) store->set(keys[i], bytes("value" + std::to_string(i)));
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(store->get(keys[i], 1s)), "value" + std::to_string(i));
  EXPECT_FALSE(std::filesystem::exists(dir.path.parent_path() / "escape"));
  for (const auto& entry : std::filesystem::directory_iterator(dir.path)) {
    EXPECT_TRUE(entry.is_regular_file()) << entry.path();
    EXPECT_LT(entry.path().filename().string().size(), 256u);
    EXPECT_FALSE(entry.path().filename().string().starts_with(".tmp.")) << "temporary file left behind";
  }
}

TEST(FileStore, CreatesMissingDirectoryAndRejectsNonIntegerAdd) {
  TempDir dir;
  auto nested = dir.path / "a" / "b";
  auto store = file_store("file://" + nested.string());
  EXPECT_TRUE(std::filesystem::is_directory(nested));
  store->set("k", bytes("not a number"));
  EXPECT_THROW(store->add("k", 1), InvalidArgument);
}

TEST(FileStore, SixteenRanksRendezvous) {
  TempDir dir;
  constexpr int kRanks = 16;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      StoreOptions options;
      options.url = dir.url();
      options.rank = rank;
      options.world_size = kRanks;
      auto store = create_store(options);
      store->set("addr/" + std::to_string(rank), bytes("rank-" + std::to_string(rank)));
      for (int peer = 0; peer < kRanks; ++peer) {
        EXPECT_EQ(text(store->get("addr/" + std::to_string(peer), 10s)), "rank-" + std::to_string(peer));
      }
    });
  }
  for (auto& t : threads) t.join();
}

// ---- URLs -------------------------------------------------------------------

TEST(StoreUrl, MalformedUrlsAreInvalidArgument) {
  const std::vector<std::string> bad = {
      "",
      "127.0.0.1:29500",
      "http://127.0.0.1:29500",
      "tcp://",
      "tcp://127.0.0.1",
      "tcp://127.0.0.1:",
      "tcp://:29500",
      "tcp://127.0.0.1:0",
      "tcp://127.0.0.1:65536",
      "tcp://127.0.0.1:-1",
      "tcp://127.0.0.1:29x",
      "tcp://127.0.0.1:29500/path",
      "tcp://::1:29500",
      "tcp://[::1]29500",
      "tcp://[::1:29500",
      "file://",
      "file://relative/dir",
  };
  for (const auto& u : bad) {
    StoreOptions options;
    options.url = u;
    options.timeout = 100ms;
    try {
      create_store(options);
      ADD_FAILURE() << "accepted '" << u << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("accepted forms"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("tcp://host:port"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "'" << u << "': wrong exception type: " << e.what();
    }
  }
}

TEST(StoreUrl, Ipv6LoopbackInBrackets) {
  int probe = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  bool have_ipv6 = probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  if (probe >= 0) ::close(probe);
  if (!have_ipv6) GTEST_SKIP() << "no IPv6 loopback here";
  TcpStoreServer server("::1", 0, "");
  StoreOptions options;
  options.url = "tcp://[::1]:" + std::to_string(server.port());
  options.rank = 1;
  options.timeout = 5s;
  auto store = create_store(options);
  EXPECT_EQ(store->address(), options.url);
  store->set("k", bytes("v6"));
  EXPECT_EQ(text(store->get("k", 1s)), "v6");
}

}  // namespace
}  // namespace gradcomm::detail
