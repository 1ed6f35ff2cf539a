// The NCCL rings' ordering, tested without a GPU: the ring driver (ring_driver.h) with
// the stream channel (stream_ring_channel.h) over simulated streams. Each rank is a
// thread; a group is a blocking exchange with the neighbours (as NCCL pairs a send with
// the matching receive); side-stream work is a FIFO that runs only when the caller's
// stream waits for an event recorded after it, or at the end, as a slow side stream
// would. So a wait the channel forgets shows up as a wrong sum, not as a lucky race.
// Two step policies run on it: the dense ring's (a fold per reduce-scatter unit into
// reused slots, nccl_ring_allreduce.cc) and the compressed ring's (every send made by
// an encode on the side stream, payload regions of CompressedRingPlan,
// nccl_compressed_ring.cc), both with an exact integer "codec".
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "collectives/allgather_steps.h"
#include "collectives/compressed_ring_plan.h"
#include "collectives/ring_driver.h"
#include "collectives/stream_ring_channel.h"

namespace gradcomm::detail {
namespace {

// Messages between simulated ranks, keyed by (sender, unit).
class Mailbox {
 public:
  void put(int from, int64_t u, const void* data, size_t bytes) {
    std::lock_guard lock(mu_);
    auto& m = box_[{from, u}];
    m.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
    cv_.notify_all();
  }
  void take(int from, int64_t u, void* data, size_t bytes) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return box_.count({from, u}) != 0; })) {
      throw std::runtime_error("simulated ring: unit " + std::to_string(u) + " from rank " + std::to_string(from) +
                               " never came");
    }
    const auto& m = box_[{from, u}];
    if (m.size() != bytes) throw std::runtime_error("simulated ring: message of unit " + std::to_string(u) +
                                                    " has " + std::to_string(m.size()) + " bytes, expected " +
                                                    std::to_string(bytes));
    if (bytes > 0) std::memcpy(data, m.data(), bytes);
    box_.erase({from, u});
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, int64_t>, std::vector<uint8_t>> box_;
};

// One rank's streams: the caller's stream runs at once (groups, waits); the side stream
// is a FIFO of deferred work, and an event is a position in it.
class SimStreams {
 public:
  SimStreams(int rank, int size, Mailbox& mailbox, int64_t events)
      : rank_(rank), size_(size), mailbox_(mailbox), marks_(static_cast<size_t>(events), 0) {}

  void enqueue(std::function<void()> work) {
    side_.push_back(std::move(work));
    ++enqueued_;
  }
  void join_side() { ++joins_; }
  void record(int slot) { marks_.at(static_cast<size_t>(slot)) = enqueued_; }
  void wait(int slot) { run_until(marks_.at(static_cast<size_t>(slot))); }
  void exchange(int64_t u, const RingMessage& send, const RingMessage& recv, bool) {
    mailbox_.put(rank_, u, send.data, send.bytes);
    mailbox_.take((rank_ + size_ - 1) % size_, u, recv.data, recv.bytes);
    ++groups_;
  }
  void side_waits_arrival() {}  // a group has completed when exchange returns
  void join_caller() {
    run_until(enqueued_);
    ++joins_;
  }
  void finish() { finished_ = true; }

  int64_t groups() const { return groups_; }
  int joins() const { return joins_; }
  bool finished() const { return finished_; }
  bool side_idle() const { return side_.empty(); }

 private:
  void run_until(int64_t mark) {
    for (; done_ < mark; ++done_) {
      side_.front()();
      side_.pop_front();
    }
  }

  int rank_, size_;
  Mailbox& mailbox_;
  std::vector<int64_t> marks_;
  std::deque<std::function<void()>> side_;
  int64_t enqueued_ = 0, done_ = 0, groups_ = 0;
  int joins_ = 0;
  bool finished_ = false;
};

// The dense ring's steps (as NcclSumSteps): reduce-scatter units land in `slots`
// reused slots and are folded on the side stream; allgather units land in place.
class SimSumSteps {
 public:
  SimSumSteps(const RingSchedule& ring, std::vector<int64_t>& data, int slots, SimStreams& streams)
      : ring_(ring), data_(data), slots_(slots), streams_(streams),
        scratch_(static_cast<size_t>(ring.max_chunk_elems() * slots), 0) {}

  RingMessage send_message(int64_t u) { return range(ring_.send_range(u)); }
  RingMessage recv_message(int64_t u) {
    if (!ring_.reduce_scatter(u)) return range(ring_.recv_range(u));
    const auto [b, e] = ring_.recv_range(u);
    return {slot(u), static_cast<size_t>(e - b) * sizeof(int64_t)};
  }
  int64_t recv_overwrites(int64_t) const { return -1; }
  int64_t recv_reuses(int64_t u) const { return ring_.reduce_scatter(u) && u >= slots_ ? u - slots_ : -1; }
  bool absorbs(int64_t u) const { return ring_.reduce_scatter(u); }
  void prepare(int64_t) {}
  void absorb(int64_t u) {
    if (!ring_.reduce_scatter(u)) return;
    streams_.enqueue([this, u] {
      const auto [b, e] = ring_.recv_range(u);
      const int64_t* in = slot(u);
      for (int64_t i = b; i < e; ++i) data_[i] += in[i - b];
    });
  }

 private:
  int64_t* slot(int64_t u) { return scratch_.data() + (u % slots_) * ring_.max_chunk_elems(); }
  RingMessage range(std::pair<int64_t, int64_t> r) {
    return {data_.data() + r.first, static_cast<size_t>(r.second - r.first) * sizeof(int64_t)};
  }

  const RingSchedule& ring_;
  std::vector<int64_t>& data_;
  int slots_;
  SimStreams& streams_;
  std::vector<int64_t> scratch_;
};

// The compressed ring's steps (as NcclCodecSteps) with an exact codec: an encode copies
// the values into the unit's payload region on the side stream; a decode adds (reduce-
// scatter) or stores (allgather) on the side stream; forwarded payloads go on unchanged.
class SimCodecSteps {
 public:
  SimCodecSteps(const CompressedRingPlan& plan, std::vector<int64_t>& data, SimStreams& streams)
      : plan_(plan), data_(data), streams_(streams), payloads_(plan.buffer_bytes() / 8 + 1, -999) {}

  RingMessage send_message(int64_t u) { return {at(plan_.send_offset(u)), plan_.send_bytes(u)}; }
  RingMessage recv_message(int64_t u) { return {at(plan_.recv_offset(u)), plan_.recv_bytes(u)}; }
  int64_t recv_overwrites(int64_t) const { return -1; }
  int64_t recv_reuses(int64_t) const { return -1; }
  bool absorbs(int64_t) const { return true; }
  void prepare(int64_t u) {
    if (u >= plan_.encoded_units()) return;
    streams_.enqueue([this, u] {
      const auto [b, e] = plan_.send_range(u);
      if (e > b) std::memcpy(at(plan_.send_offset(u)), data_.data() + b, static_cast<size_t>(e - b) * sizeof(int64_t));
    });
  }
  void absorb(int64_t u) {
    streams_.enqueue([this, u] {
      const auto [b, e] = plan_.recv_range(u);
      const auto* in = static_cast<const int64_t*>(at(plan_.recv_offset(u)));
      for (int64_t i = b; i < e; ++i) {
        data_[i] = plan_.reduce_scatter(u) ? data_[i] + in[i - b] : in[i - b];
      }
    });
  }

 private:
  void* at(size_t offset) { return reinterpret_cast<uint8_t*>(payloads_.data()) + offset; }

  const CompressedRingPlan& plan_;
  std::vector<int64_t>& data_;
  SimStreams& streams_;
  std::vector<int64_t> payloads_;
};

int64_t value(int rank, int64_t i) { return (3 * rank + i) % 13 - 6; }

void expect_sums(const std::vector<std::vector<int64_t>>& data, int n, int64_t numel) {
  for (int64_t i = 0; i < numel; ++i) {
    int64_t sum = 0;
    for (int r = 0; r < n; ++r) sum += value(r, i);
    for (int r = 0; r < n; ++r) ASSERT_EQ(data[r][i], sum) << "rank " << r << " element " << i;
  }
}

// Runs `body(rank)` on n threads; rethrows the first failure.
void on_ranks(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
}

void run_dense(int n, int64_t numel, int64_t chunk_elems, int max_chunks, int slots) {
  SCOPED_TRACE(::testing::Message() << "dense n=" << n << " numel=" << numel << " chunk=" << chunk_elems
                                    << " max_chunks=" << max_chunks << " slots=" << slots);
  Mailbox mailbox;
  std::vector<std::vector<int64_t>> data(n, std::vector<int64_t>(numel));
  std::vector<int64_t> groups(n);
  std::vector<int> joins(n);
  std::vector<int> idle(n);  // not vector<bool>: the ranks write their own entries concurrently
  on_ranks(n, [&](int r) {
    for (int64_t i = 0; i < numel; ++i) data[r][i] = value(r, i);
    const RingSchedule ring(n, r, numel, 1, chunk_elems, max_chunks);
    SimStreams streams(r, n, mailbox, StreamRingChannel<SimStreams>::events_needed(ring.shape(), slots));
    SimSumSteps steps(ring, data[r], slots, streams);
    StreamRingChannel<SimStreams> channel(streams, ring.shape(), slots);
    drive_ring(ring.shape(), ring.units(), channel, steps);
    groups[r] = streams.groups();
    joins[r] = streams.joins();
    idle[r] = streams.side_idle() && streams.finished();
    EXPECT_EQ(groups[r], ring.units());
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(joins[r], 2) << "the side stream joins the caller's at the start and the end";
    EXPECT_TRUE(idle[r]);
  }
  expect_sums(data, n, numel);
}

void run_codec(int n, int64_t numel, int64_t align, int64_t chunk_elems, int max_chunks) {
  SCOPED_TRACE(::testing::Message() << "codec n=" << n << " numel=" << numel << " align=" << align
                                    << " chunk=" << chunk_elems << " max_chunks=" << max_chunks);
  Mailbox mailbox;
  std::vector<std::vector<int64_t>> data(n, std::vector<int64_t>(numel));
  on_ranks(n, [&](int r) {
    for (int64_t i = 0; i < numel; ++i) data[r][i] = value(r, i);
    const CompressedRingPlan plan(n, r, numel, align, chunk_elems, max_chunks,
                                  [](int64_t m) { return static_cast<size_t>(m) * sizeof(int64_t); });
    SimStreams streams(r, n, mailbox, StreamRingChannel<SimStreams>::events_needed(plan.schedule().shape(), 0));
    SimCodecSteps steps(plan, data[r], streams);
    StreamRingChannel<SimStreams> channel(streams, plan.schedule().shape(), 0);
    drive_ring(plan.schedule().shape(), plan.units(), channel, steps);
  });
  expect_sums(data, n, numel);
}

// The allgather's forward steps (NCCL's allgathers: one chunk a block) on the same
// channel with no side work: every block reaches every rank, nothing joins the streams.
void run_allgather(int n, const std::vector<int64_t>& counts, int64_t chunks) {
  SCOPED_TRACE(::testing::Message() << "allgather n=" << n << " chunks=" << chunks);
  std::vector<int64_t> offsets(n, 0);
  for (int s = 1; s < n; ++s) offsets[s] = offsets[s - 1] + counts[s - 1];
  const int64_t total = offsets[n - 1] + counts[n - 1];
  auto byte = [](int s, int64_t i) { return static_cast<uint8_t>(31 * s + 7 * i + 1); };
  Mailbox mailbox;
  std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(static_cast<size_t>(total), 0));
  std::vector<int> joins(n);
  on_ranks(n, [&](int r) {
    for (int64_t i = 0; i < counts[r]; ++i) out[r][offsets[r] + i] = byte(r, i);
    AllgatherSteps steps(out[r].data(), offsets, counts, 1, r, n, chunks);
    SimStreams streams(r, n, mailbox, 1);
    StreamRingChannel<SimStreams> channel(streams, steps.shape(), 0, /*side_work=*/false);
    drive_ring(steps.shape(), steps.units(), channel, steps);
    joins[r] = streams.joins();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(joins[r], 0) << "an allgather never touches the side stream";
    for (int s = 0; s < n; ++s) {
      for (int64_t i = 0; i < counts[s]; ++i) ASSERT_EQ(out[r][offsets[s] + i], byte(s, i)) << r << " " << s << " " << i;
    }
  }
}

TEST(StreamRingChannel, AllgatherOfUnequalBlocksReachesEveryRank) {
  for (int n = 2; n <= 6; ++n) {
    std::vector<int64_t> counts(n);
    for (int s = 0; s < n; ++s) counts[s] = (s * 37) % 11;  // zero-length blocks among them
    for (int64_t chunks : {1, 3}) run_allgather(n, counts, chunks);
  }
}

TEST(RingSchedule, SendRangeOfEveryUnitIsTheNextRanksReceiveRange) {
  for (int n : {2, 3, 5}) {
    for (int64_t numel : {int64_t{2}, int64_t{13}, int64_t{999}}) {
      for (int r = 0; r < n; ++r) {
        const RingSchedule mine(n, r, numel, 1, 4, 16), next(n, (r + 1) % n, numel, 1, 4, 16);
        for (int64_t u = 0; u < mine.units(); ++u) EXPECT_EQ(mine.send_range(u), next.recv_range(u));
      }
    }
  }
}

TEST(StreamRingChannel, DenseSumsAreExactWithDeferredSideWorkForEveryShape) {
  for (int n = 2; n <= 8; ++n) {
    for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{n - 1}, int64_t{n}, int64_t{7}, int64_t{1000},
                          int64_t{4099}}) {
      for (int64_t chunk : {1, 3, 64, 1 << 20}) {
        for (int slots : {1, 2, 4}) run_dense(n, numel, chunk, 16, slots);
      }
    }
  }
}

TEST(StreamRingChannel, DenseChunkCapHoldsAndSumsStayExact) {
  const RingSchedule ring(4, 1, int64_t{1} << 30, 1, 1, 16);
  EXPECT_EQ(ring.chunks(), 16);
  EXPECT_EQ(ring.units(), 2 * 3 * 16);
  EXPECT_EQ((StreamRingChannel<SimStreams>::events_needed(ring.shape(), 4)), 18);  // 17 cycling + the initial
  run_dense(3, 100000, 1, 5, 2);                                           // cap binds: 5 chunks of ~6667
}

TEST(StreamRingChannel, CodecRingSumsAreExactWhenEverySendIsMadeOnTheSideStream) {
  for (int n = 2; n <= 6; ++n) {
    for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{n}, int64_t{37}, int64_t{1000}}) {
      for (int64_t align : {1, 4}) {
        for (int64_t chunk : {4, 64, 1 << 20}) run_codec(n, numel, align, chunk, 8);
      }
    }
  }
}

}  // namespace
}  // namespace gradcomm::detail
