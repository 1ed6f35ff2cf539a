// PublishedStats (src/published_stats.h), the sequence lock Communicator::stats reads:
// every field survives the trip; readers racing a publisher never see a torn snapshot (all
// fields from one publication) nor one older than what they saw before; two publishers
// exclude each other. Run under TSan in CI (threads).
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>
#include <type_traits>
#include <vector>

#include "published_stats.h"

namespace gradcomm::detail {
namespace {

// Every counter of `s` with its index k: snapshot i holds i * 16 + k in counter k, so that a
// snapshot mixing two publications shows.
template <class S, class F>
void each_counter(S& s, F&& f) {
  int k = 0;
  for (auto* field : {&s.bytes_sent, &s.bytes_received, &s.messages_sent, &s.ops, &s.fused_calls, &s.node_shm_ops,
                      &s.inline_ops, &s.node_shm_bytes}) {
    f(*field, k++);
  }
  for (auto* field : {&s.total_s, &s.reduce_s, &s.encode_s, &s.decode_s, &s.engine_cpu_s}) f(*field, k++);
}

Stats numbered(uint64_t i) {
  Stats s;
  each_counter(s, [&](auto& field, int k) {
    field = static_cast<std::remove_reference_t<decltype(field)>>(i * 16 + k);
  });
  return s;
}

void expect_numbered(const Stats& s, uint64_t i) {
  each_counter(s, [&](const auto& field, int k) {
    EXPECT_EQ(field, static_cast<std::remove_cvref_t<decltype(field)>>(i * 16 + k)) << "counter " << k;
  });
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
        const uint64_t i = s.bytes_sent / 16;
        bool whole = true;
        each_counter(s, [&](const auto& field, int k) {
          whole = whole && field == static_cast<std::remove_cvref_t<decltype(field)>>(i * 16 + k);
        });
        if (!whole) torn.fetch_add(1);
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
