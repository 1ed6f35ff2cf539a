// Single-copy rendezvous between ranks of one host (transport/ucx/ucx_cma.h): a large
// message to a peer on shared memory travels as a descriptor, and the receiver reads it
// with process_vm_readv. Each test reads from the transports' info lines which path ran
// (how many messages went by single-copy read), so a silent fall-back to the FIFO
// cannot pass for the path under test.
//
// The fork tests come first, as in test_ucx_transport.cc: a forked child must not
// inherit an initialized UCX.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "transport/ucx/ucx_cma.h"
#include "ucx_test_util.h"

namespace gradcomm::detail {
namespace {

using namespace std::chrono_literals;
using namespace ucx_test;

// The transports' info lines are what the tests read (logging reads GRADCOMM_LOG once).
const bool kInfoLogs = [] { return ::setenv("GRADCOMM_LOG", "info", 1) == 0; }();

// Messages read by single-copy read, summed over the destruction lines in `log`.
uint64_t cma_reads(const std::string& log) {
  const std::regex line(R"(read (\d+) messages \(\d+ bytes\) from its peers by single-copy read)");
  uint64_t total = 0;
  for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it) total += std::stoull((*it)[1]);
  return total;
}

// run_ranks, returning what the ranks logged. Skips the test where this host forbids
// process_vm_readv (the transports then log why and use the FIFO).
std::string run_ranks_logged(int n, const std::function<void(RankContext&)>& body) {
  EXPECT_TRUE(kInfoLogs);
  ::testing::internal::CaptureStderr();
  run_ranks(n, body);
  const std::string log = ::testing::internal::GetCapturedStderr();
  std::fputs(log.c_str(), stderr);
  return log;
}
#define GRADCOMM_SKIP_WITHOUT_CMA(log) \
  if ((log).find("cannot read rank") != std::string::npos) GTEST_SKIP() << "no cma here:\n" << (log)

constexpr size_t kThreshold = static_cast<size_t>(kCmaDefaultMinBytes);

// Child side: waits (20 s at most) for `request` to end; how many ms after the victim's
// death it did, or -1.
int64_t ms_until_it_ends(Transport& t, FileStore& store, const Request& request, const char* what) {
  if (!wait_until(
          t, [&] { return !request.pending(); }, 20s))
    return -1;
  const int64_t took = now_ms() - std::stoll(store.get_text("died_at", 1s));
  std::fprintf(stderr, "%s ended after %lld ms: %s\n", what, static_cast<long long>(took), request.error().c_str());
  return took;
}

// ---- peer death across processes
// ------------------------------------------------------

// The sender dies with its descriptor on the way: the receive posted right after is
// kPeerFailed within seconds (the read finds the process gone, or keepalive does).
TEST(UcxCmaProcesses, SenderKilledWithItsDescriptorInFlightFailsTheReceive) {
  TempDir dir;
  const auto statuses = run_processes(2, [&](int rank) -> int {
    FileStore store(dir.path);
    auto t = create_ucx_transport(rank, 2, store, UcxOptions{});
    if (!warm_up(*t)) return 2;
    std::vector<uint8_t> buffer(size_t{4} << 20, 9);
    const uint64_t tag = make_tag(TagKind::kData, 3, 0);
    if (rank == 1) {
      auto send = t->isend(0, tag, buffer.data(), buffer.size());
      for (int i = 0; i < 50; ++i) t->progress();
      store.set_text("victim_pid", std::to_string(::getpid()));
      store.set_text("died_at", std::to_string(now_ms()));
      raise(SIGKILL);
    }
    store.get_text("died_at", 20s);
    // Only a dead sender's message must fail: posted while it still lives (it sets
    // died_at just before SIGKILL lands), the read may rightly succeed.
    if (!wait_until_dead(static_cast<pid_t>(std::stol(store.get_text("victim_pid", 1s))), 10s)) return 6;
    auto recv = t->irecv(1, tag, buffer.data(), buffer.size());
    const int64_t took = ms_until_it_ends(*t, store, *recv, "receive from the killed sender");
    if (took < 0) return 3;
    if (recv->state() != RequestState::kPeerFailed) return 4;
    return took < 10'000 ? 0 : 5;
  });
  EXPECT_TRUE(WIFEXITED(statuses[0]) && WEXITSTATUS(statuses[0]) == 0) << describe(statuses[0]);
  EXPECT_TRUE(WIFSIGNALED(statuses[1])) << describe(statuses[1]);
}

// The receiver dies before it reads: the sender, waiting for the ack, is kPeerFailed
// within seconds (keepalive), and its transport goes promptly.
TEST(UcxCmaProcesses, ReceiverKilledBeforeItAcksFailsTheSendWithinSeconds) {
  TempDir dir;
  const auto statuses = run_processes(2, [&](int rank) -> int {
    FileStore store(dir.path);
    auto t = connect_then_kill(store, rank, 2, /*victim=*/1);
    if (!t) return 2;
    store.get_text("died_at", 20s);
    std::vector<uint8_t> buffer(size_t{4} << 20, 9);
    auto send = t->isend(1, make_tag(TagKind::kData, 4, 0), buffer.data(), buffer.size());
    const int64_t took = ms_until_it_ends(*t, store, *send, "send to the killed receiver");
    if (took < 0) return 3;
    if (send->state() != RequestState::kPeerFailed || took >= 10'000) return 4;
    const auto start = Clock::now();
    send.reset();
    t.reset();
    return seconds_since(start) < 5.0 ? 0 : 5;
  });
  EXPECT_TRUE(WIFEXITED(statuses[0]) && WEXITSTATUS(statuses[0]) == 0) << describe(statuses[0]);
  EXPECT_TRUE(WIFSIGNALED(statuses[1])) << describe(statuses[1]);
}

// ---- pure functions
// -------------------------------------------------------------------

TEST(UcxCmaWire, DescriptorNeedsItsLengthAndTheSendersCookie) {
  const CmaDescriptor d{0x1234567890ABCDEFull, 77, 5, 0x7F0000001000ull, 1 << 20};
  const std::vector<uint8_t> bytes = encode_cma_descriptor(d);
  ASSERT_EQ(bytes.size(), kCmaDescriptorBytes);
  const auto back = decode_cma_descriptor(bytes.data(), bytes.size(), d.cookie);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->generation, 77u);
  EXPECT_EQ(back->slot, 5u);
  EXPECT_EQ(back->address, d.address);
  EXPECT_EQ(back->length, d.length);
  EXPECT_FALSE(decode_cma_descriptor(bytes.data(), bytes.size(),
                                     d.cookie + 1));  // another sender's
  EXPECT_FALSE(decode_cma_descriptor(bytes.data(), bytes.size() - 1,
                                     d.cookie));  // a plain message
  const auto ack = decode_cma_ack(encode_cma_ack(CmaAck{77, 5, 3, CmaOutcome::kTruncated}).data(), kCmaAckBytes);
  ASSERT_TRUE(ack);
  EXPECT_EQ(ack->receiver, 3);
  EXPECT_EQ(ack->outcome, CmaOutcome::kTruncated);
  std::vector<uint8_t> bad = encode_cma_ack(CmaAck{});
  bad[20] = 9;
  EXPECT_FALSE(decode_cma_ack(bad.data(), bad.size()));
}

// ---- ranks as threads ------------------------------------------------------------

// Both directions at once, sizes around the threshold and beyond: exact bytes, and
// every message of the threshold or more went by single-copy read.
TEST(UcxCma, SizesAroundTheThresholdArriveExact) {
  const std::vector<size_t> sizes{0,
                                  1,
                                  kCmaDescriptorBytes - 1,
                                  kCmaDescriptorBytes,
                                  kCmaDescriptorBytes + 1,
                                  kThreshold - 1,
                                  kThreshold,
                                  kThreshold + 1,
                                  100'000,
                                  (size_t{1} << 20) + 3,
                                  size_t{16} << 20};
  const std::string log = run_ranks_logged(2, [&](RankContext& ctx) {
    for (size_t i = 0; i < sizes.size(); ++i) all_to_all(ctx, i, sizes[i]);
  });
  GRADCOMM_SKIP_WITHOUT_CMA(log);
  const auto large = std::count_if(sizes.begin(), sizes.end(), [](size_t s) { return s >= kThreshold; });
  EXPECT_EQ(cma_reads(log), 2u * static_cast<uint64_t>(large)) << log;
}

// Plain messages and descriptors interleaved on one tag match receives in the order
// posted, whether a receive was posted before its message came or after (then the
// descriptor waited in UCX's unexpected queue). Plain messages of exactly a
// descriptor's length are not taken for one; receive buffers larger than the message
// complete with its length.
TEST(UcxCma, MixedSmallAndLargeOnOneTagMatchInPostOrder) {
  constexpr int kMessages = 120;
  const auto size_of = [](int i) -> size_t {
    if (i % 3 == 0) return kThreshold * 4 + static_cast<size_t>(i);
    return i % 3 == 1 ? kCmaDescriptorBytes : 1000 + static_cast<size_t>(i);
  };
  std::atomic<bool> sent{false};
  const std::string log = run_ranks_logged(2, [&](RankContext& ctx) {
    const uint64_t tag = make_tag(TagKind::kData, 9, 1);
    std::vector<std::vector<uint8_t>> buffers;
    std::vector<RequestPtr> requests;
    if (ctx.rank == 0) {
      for (int i = 0; i < kMessages; ++i) {
        buffers.push_back(make_message(0, static_cast<size_t>(i), size_of(i)));
        requests.push_back(ctx.t.isend(1, tag, buffers.back().data(), buffers.back().size()));
      }
      sent = true;
    } else {
      for (int i = 0; i < kMessages; ++i) buffers.emplace_back(kThreshold * 5, 0xEE);
      for (int i = 0; i < kMessages / 2; ++i)
        requests.push_back(ctx.t.irecv(0, tag, buffers[i].data(), kThreshold * 5));
      ASSERT_TRUE(wait_until(ctx.t, [&] { return sent.load(); }));
      for (int i = 0; i < 200; ++i) ctx.t.progress();  // the rest arrive unexpected
      for (int i = kMessages / 2; i < kMessages; ++i) {
        requests.push_back(ctx.t.irecv(0, tag, buffers[i].data(), kThreshold * 5));
      }
    }
    ASSERT_TRUE(wait_all(ctx.t, requests));
    for (int i = 0; i < kMessages; ++i) {
      ASSERT_EQ(requests[i]->state(), RequestState::kDone) << i << ": " << requests[i]->error();
      EXPECT_EQ(requests[i]->bytes(), size_of(i)) << "message " << i;
      if (ctx.rank == 1) {
        EXPECT_EQ(first_mismatch(buffers[i], 0, static_cast<size_t>(i), size_of(i)), -1) << "message " << i;
        EXPECT_EQ(buffers[i][size_of(i)], 0xEE) << "message " << i << ": written past its length";
      }
    }
  });
  GRADCOMM_SKIP_WITHOUT_CMA(log);
  EXPECT_EQ(cma_reads(log), static_cast<uint64_t>(kMessages / 3)) << log;
}

// A descriptor for a message longer than the receive buffer fails that receive
// (kTruncated), with a buffer larger or smaller than the descriptor itself; the sender
// completes, and the next message on the tag arrives intact.
TEST(UcxCma, LongerMessageTruncatesTheReceive) {
  const std::vector<std::pair<size_t, size_t>> cases{{size_t{1} << 20, size_t{512} << 10}, {kThreshold, 16}};
  const size_t after = kThreshold * 3 + 5;
  const std::string log = run_ranks_logged(2, [&](RankContext& ctx) {
    const uint64_t tag = make_tag(TagKind::kData, 2, 0);
    std::vector<RequestPtr> requests;
    std::vector<std::vector<uint8_t>> buffers;
    for (size_t i = 0; i <= cases.size(); ++i) {
      const size_t bytes = i < cases.size() ? (ctx.rank == 0 ? cases[i].first : cases[i].second) : after;
      buffers.push_back(ctx.rank == 0 ? make_message(0, i, bytes) : std::vector<uint8_t>(bytes));
      requests.push_back(ctx.rank == 0 ? ctx.t.isend(1, tag, buffers[i].data(), bytes)
                                       : ctx.t.irecv(0, tag, buffers[i].data(), bytes));
    }
    ASSERT_TRUE(wait_all(ctx.t, requests, 20s));
    for (size_t i = 0; i < cases.size(); ++i) {
      const RequestState expected = ctx.rank == 0 ? RequestState::kDone : RequestState::kTruncated;
      EXPECT_EQ(requests[i]->state(), expected) << "case " << i << ": " << requests[i]->error();
    }
    EXPECT_EQ(requests.back()->state(), RequestState::kDone) << requests.back()->error();
    if (ctx.rank == 1) EXPECT_EQ(first_mismatch(buffers.back(), 0, cases.size(), after), -1);
  });
  GRADCOMM_SKIP_WITHOUT_CMA(log);
  EXPECT_EQ(cma_reads(log), 1u) << log;  // only the last message was read
}

// Three ranks, each with 40 large messages outstanding to each peer on one tag, in both
// directions at once; receives for one peer posted before its sends, for the other
// after.
TEST(UcxCma, ManyOutstandingInBothDirections) {
  constexpr int kMessages = 40;
  const std::string log = run_ranks_logged(3, [&](RankContext& ctx) {
    const uint64_t tag = make_tag(TagKind::kData, 5, 5);
    const size_t bytes = kThreshold * 2 + static_cast<size_t>(ctx.rank);
    std::vector<std::vector<uint8_t>> out, in;
    std::vector<RequestPtr> requests;
    const int early = (ctx.rank + 1) % ctx.size, late = (ctx.rank + 2) % ctx.size;
    const auto post_receives = [&](int peer) {
      for (int i = 0; i < kMessages; ++i) {
        in.emplace_back(kThreshold * 2 + static_cast<size_t>(peer), 0);
        requests.push_back(ctx.t.irecv(peer, tag, in.back().data(), in.back().size()));
      }
    };
    in.reserve(2 * kMessages);
    post_receives(early);
    for (int peer : {early, late}) {
      for (int i = 0; i < kMessages; ++i) {
        out.push_back(make_message(ctx.rank, static_cast<size_t>(i), bytes));
        requests.push_back(ctx.t.isend(peer, tag, out.back().data(), bytes));
      }
    }
    for (int i = 0; i < 100; ++i) ctx.t.progress();
    post_receives(late);
    ASSERT_TRUE(wait_all(ctx.t, requests));
    for (const auto& r : requests) EXPECT_EQ(r->state(), RequestState::kDone) << r->error();
    for (int i = 0; i < 2 * kMessages; ++i) {
      const int peer = i < kMessages ? early : late;
      EXPECT_EQ(first_mismatch(in[i], peer, static_cast<size_t>(i % kMessages), in[i].size()), -1) << i;
    }
  });
  GRADCOMM_SKIP_WITHOUT_CMA(log);
  EXPECT_EQ(cma_reads(log), 3u * 2u * kMessages) << log;
}

// A send abandoned before its receiver came clears its slot: the receive posted later
// fails (kPeerFailed, "withdrew") instead of returning whatever the freed buffer holds
// by then.
TEST(UcxCma, AbandonedSendIsWithdrawnNotReadStale) {
  std::atomic<bool> abandoned{false};
  std::vector<uint8_t> buffer(size_t{1} << 20, 5);  // outlives both ranks: the read finds it mapped
  const std::string log = run_ranks_logged(2, [&](RankContext& ctx) {
    const uint64_t tag = make_tag(TagKind::kData, 6, 0);
    if (ctx.rank == 0) {
      auto send = ctx.t.isend(1, tag, buffer.data(), buffer.size());
      for (int i = 0; i < 100; ++i) ctx.t.progress();
      const auto start = Clock::now();
      send.reset();
      EXPECT_LT(seconds_since(start), 5.0);
      std::fill(buffer.begin(), buffer.end(), 0x66);  // what a stale read would see
      abandoned = true;
      return;
    }
    ASSERT_TRUE(wait_until(ctx.t, [&] { return abandoned.load(); }));
    std::vector<uint8_t> in(buffer.size());
    auto recv = ctx.t.irecv(0, tag, in.data(), in.size());
    ASSERT_TRUE(wait_until(
        ctx.t, [&] { return !recv->pending(); }, 20s));
    EXPECT_EQ(recv->state(), RequestState::kPeerFailed) << recv->error();
    EXPECT_NE(recv->error().find("withdrew"), std::string::npos) << recv->error();
  });
  GRADCOMM_SKIP_WITHOUT_CMA(log);
}

// GRADCOMM_CMA_MIN_BYTES=0 turns it off: the same exchange goes through the FIFO.
TEST(UcxCma, OffWhenTheThresholdIsZero) {
  ::setenv("GRADCOMM_CMA_MIN_BYTES", "0", 1);
  const std::string log = run_ranks_logged(2, [](RankContext& ctx) { all_to_all(ctx, 0, size_t{1} << 20); });
  ::unsetenv("GRADCOMM_CMA_MIN_BYTES");
  EXPECT_NE(log.find("through the FIFO only: GRADCOMM_CMA_MIN_BYTES=0"), std::string::npos) << log;
  EXPECT_EQ(cma_reads(log), 0u) << log;
}

}  // namespace
}  // namespace gradcomm::detail
