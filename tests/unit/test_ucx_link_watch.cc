// LinkWatch (transport/ucx/ucx_link_watch.h): the judgement of one connection over time,
// and the scan of this process's real TCP sockets. The cut itself (a host that stops
// acknowledging) needs network namespaces: tests/cluster/test_link_partition.sh.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "transport/ucx/ucx_link_watch.h"

namespace gradcomm::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
constexpr milliseconds kLimit{5000};

TEST(LinkWatchJudgement, OnlyDataStuckForTheWholeLimitWithNoAckIsDead) {
  const Clock::time_point t0 = Clock::now();
  StuckClock c;
  // Nothing outstanding, however long since the last ack (an idle connection).
  EXPECT_FALSE(c.dead({0, 0, 600'000}, t0, kLimit));
  // Outstanding but not retransmitted on timeout (in flight, or a zero window being probed).
  EXPECT_FALSE(c.dead({12, 0, 600'000}, t0 + milliseconds(6000), kLimit));
  EXPECT_FALSE(c.stuck);
  // Stuck from t0 + 10 s: dead only once stuck for the limit, with no ack for as long.
  const Clock::time_point s = t0 + milliseconds(10'000);
  EXPECT_FALSE(c.dead({3, 1, 200}, s, kLimit));
  EXPECT_TRUE(c.stuck);
  EXPECT_FALSE(c.dead({3, 4, 4900}, s + milliseconds(4900), kLimit));
  EXPECT_TRUE(c.dead({3, 5, 5100}, s + milliseconds(5000), kLimit));
}

TEST(LinkWatchJudgement, AnAckOrARecoveryRestartsTheClock) {
  const Clock::time_point t0 = Clock::now();
  StuckClock c;
  EXPECT_FALSE(c.dead({3, 1, 300}, t0, kLimit));
  // Long enough stuck, but an ack came 1 s ago (a slow peer, not a cut one).
  EXPECT_FALSE(c.dead({3, 6, 1000}, t0 + milliseconds(8000), kLimit));
  // Recovered (retransmits back to 0), then stuck again: the clock starts over.
  EXPECT_FALSE(c.dead({0, 0, 10}, t0 + milliseconds(8100), kLimit));
  EXPECT_FALSE(c.dead({2, 1, 9000}, t0 + milliseconds(9000), kLimit));
  EXPECT_FALSE(c.dead({2, 3, 12'000}, t0 + milliseconds(12'000), kLimit));
  EXPECT_TRUE(c.dead({2, 4, 14'000}, t0 + milliseconds(14'000), kLimit));
}

TEST(LinkWatchScan, InterfaceAddressesLeaveLoopbackOut) {
  for (const std::string& a : interface_addresses()) {
    EXPECT_NE(a, "127.0.0.1");
    EXPECT_NE(a, "::1");
    EXPECT_FALSE(a.empty());
  }
}

// A healthy loopback connection with data in flight, watched as if 127.0.0.1 were a
// peer's host: it is found and sampled, and never called dead.
TEST(LinkWatchScan, AHealthyConnectionIsNeverDead) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const int server = accept(listener, nullptr, nullptr);
  ASSERT_GE(server, 0);
  LinkWatch watch({{}, {"127.0.0.1"}}, milliseconds(1));
  EXPECT_FALSE(watch.empty());
  const std::vector<char> chunk(1 << 16, 'x');
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < 20; ++i) {
    ASSERT_GT(write(client, chunk.data(), chunk.size()), 0);
    EXPECT_TRUE(watch.poll(t0 + milliseconds(100 * i)).empty()) << "poll " << i;
    std::vector<char> sink(chunk.size());
    ASSERT_GT(read(server, sink.data(), sink.size()), 0);
  }
  close(client);
  close(server);
  close(listener);
}

// A peer address this host has itself (another rank here) is no link to watch.
TEST(LinkWatchScan, OwnAddressesAreNotWatched) {
  const std::vector<std::string> mine = interface_addresses();
  if (mine.empty()) GTEST_SKIP() << "no non-loopback interface here";
  EXPECT_TRUE(LinkWatch({{}, mine}, kLimit).empty());
}

}  // namespace
}  // namespace gradcomm::detail
