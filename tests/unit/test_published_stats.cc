// PublishedStats (src/published_stats.h), the sequence lock Communicator::stats reads:
// every field survives the trip; readers racing a publisher never see a torn snapshot (all
// fields from one publication) nor one older than what they saw before; two publishers
// exclude each other. Run under TSan in CI (threads).
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "published_stats.h"

namespace gradcomm::detail {
namespace {

// Every counter derived from one number, so that a snapshot mixing two publications shows.
Stats numbered(uint64_t i) {
  Stats s;
  s.bytes_sent = i;
  s.bytes_received = i + 1;
  s.messages_sent = i + 2;
  s.ops = i + 3;
  s.fused_calls = i + 4;
  s.total_s = static_cast<double>(i) + 0.5;
  s.reduce_s = static_cast<double>(i) + 0.25;
  s.encode_s = static_cast<double>(i) + 0.125;
  s.decode_s = static_cast<double>(i) + 0.0625;
  s.engine_cpu_s = static_cast<double>(i) + 0.75;
  s.node_shm_ops = i + 5;
  s.inline_ops = i + 6;
  s.node_shm_bytes = i + 7;
  return s;
}

void expect_numbered(const Stats& s, uint64_t i) {
  const Stats want = numbered(i);
  EXPECT_EQ(s.bytes_sent, want.bytes_sent);
  EXPECT_EQ(s.bytes_received, want.bytes_received);
  EXPECT_EQ(s.messages_sent, want.messages_sent);
  EXPECT_EQ(s.ops, want.ops);
  EXPECT_EQ(s.fused_calls, want.fused_calls);
  EXPECT_EQ(s.total_s, want.total_s);
  EXPECT_EQ(s.reduce_s, want.reduce_s);
  EXPECT_EQ(s.encode_s, want.encode_s);
  EXPECT_EQ(s.decode_s, want.decode_s);
  EXPECT_EQ(s.engine_cpu_s, want.engine_cpu_s);
  EXPECT_EQ(s.node_shm_ops, want.node_shm_ops);
  EXPECT_EQ(s.inline_ops, want.inline_ops);
  EXPECT_EQ(s.node_shm_bytes, want.node_shm_bytes);
}

TEST(PublishedStats, EveryFieldIsReadAsPublished) {
  PublishedStats board;
  const Stats fresh = board.read();  // nothing published: a fresh Stats
  EXPECT_EQ(fresh.bytes_sent, 0u);
  EXPECT_EQ(fresh.node_shm_bytes, 0u);
  EXPECT_EQ(fresh.total_s, 0.0);
  board.publish(numbered(41));
  expect_numbered(board.read(), 41);
  EXPECT_TRUE(board.read().auto_choices.empty());
}

// Readers in a loop while `publish` runs; counts snapshots that mix publications, and (when
// `ordered`) ones older than a snapshot the same reader saw before.
void race(PublishedStats& board, const std::function<void()>& publish, bool ordered) {
  std::atomic<bool> done{false};
  std::atomic<int> torn{0}, backwards{0}, reads{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      uint64_t last = 0;
      while (!done.load(std::memory_order_acquire)) {
        const Stats s = board.read();
        const uint64_t i = s.bytes_sent;
        const Stats want = numbered(i);
        if (s.bytes_received != want.bytes_received || s.node_shm_bytes != want.node_shm_bytes ||
            s.total_s != want.total_s || s.ops != want.ops || s.engine_cpu_s != want.engine_cpu_s ||
            s.inline_ops != want.inline_ops) {
          torn.fetch_add(1);
        }
        if (ordered && i < last) backwards.fetch_add(1);
        last = i;
        reads.fetch_add(1);
      }
    });
  }
  publish();
  done.store(true, std::memory_order_release);
  for (auto& t : readers) t.join();
  EXPECT_EQ(torn.load(), 0) << "of " << reads.load() << " reads";
  EXPECT_EQ(backwards.load(), 0) << "of " << reads.load() << " reads";
}

constexpr uint64_t kPublications = 20000;

TEST(PublishedStats, ReadersRacingAPublisherSeeWholeSnapshotsInOrder) {
  PublishedStats board;
  board.publish(numbered(0));
  race(board, [&] {
    for (uint64_t i = 1; i <= kPublications; ++i) board.publish(numbered(i));
  }, /*ordered=*/true);
  expect_numbered(board.read(), kPublications);
}

TEST(PublishedStats, TwoPublishersNeverInterleaveTheirFields) {
  // The engine and a caller's inline call publish one after another; should two ever
  // overlap, each publication still lands whole.
  PublishedStats board;
  board.publish(numbered(0));
  race(board, [&] {
    std::thread other([&] {
      for (uint64_t i = 1; i <= kPublications; i += 2) board.publish(numbered(i));
    });
    for (uint64_t i = 2; i <= kPublications; i += 2) board.publish(numbered(i));
    other.join();
  }, /*ordered=*/false);
  board.publish(numbered(kPublications + 1));
  expect_numbered(board.read(), kPublications + 1);
}

}  // namespace
}  // namespace gradcomm::detail
