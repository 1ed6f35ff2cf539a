// RendezvousStore (store/rendezvous.h): framed, tagged records; a namespace per
// communicator generation; world-size and duplicate-rank diagnosis. Ranks are
// clients of one in-process TCP store server; a "second process" is simulated by
// writing its join record with another process id.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "gradcomm/errors.h"
#include "store/rendezvous.h"
#include "store/store_backends.h"

namespace gradcomm::detail {
namespace {

using namespace std::chrono_literals;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

struct Server {
  TcpStoreServer server{"127.0.0.1", 0, ""};
  std::unique_ptr<Store> client() { return connect_tcp_store("127.0.0.1", server.port(), "", 5s); }
};

RendezvousRecord sample() {
  RendezvousRecord r;
  r.rank = 3;
  r.world_size = 8;
  r.generation = 2;
  r.process = 0x1122334455667788ull;
  r.pid = 4242;
  r.host = "node7";
  r.payload = bytes("worker address bytes");
  return r;
}

TEST(RendezvousRecord, RoundTripsEveryField) {
  const auto frame = encode_rendezvous_record(sample(), "k", "token");
  const RendezvousRecord r = decode_rendezvous_record(frame, "k", "token", "store");
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.generation, 2u);
  EXPECT_EQ(r.process, 0x1122334455667788ull);
  EXPECT_EQ(r.pid, 4242u);
  EXPECT_EQ(r.host, "node7");
  EXPECT_EQ(r.payload, bytes("worker address bytes"));
}

TEST(RendezvousRecord, EveryFlippedByteTruncationAndForeignKeyOrTokenIsRefusedNamingTheKey) {
  for (std::string token : {"", "secret"}) {
    const auto frame = encode_rendezvous_record(sample(), "gradcomm/g2/comm/ucx/addr/3", token);
    const auto refused = [&](std::vector<uint8_t> b, const std::string& key, const std::string& tok) {
      try {
        decode_rendezvous_record(b, key, tok, "tcp://h:1");
        return false;
      } catch (const TransportError& e) {
        EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
        return true;
      }
    };
    for (size_t i = 0; i < frame.size(); ++i) {
      auto damaged = frame;
      damaged[i] ^= 0x01;
      EXPECT_TRUE(refused(damaged, "gradcomm/g2/comm/ucx/addr/3", token)) << "byte " << i << " token '" << token << "'";
    }
    for (size_t n : {size_t{0}, size_t{3}, size_t{43}, frame.size() - 1}) {
      EXPECT_TRUE(refused({frame.begin(), frame.begin() + static_cast<ptrdiff_t>(n)}, "gradcomm/g2/comm/ucx/addr/3",
                          token));
    }
    // Moved to another rank's key, or checked with another token.
    EXPECT_TRUE(refused(frame, "gradcomm/g2/comm/ucx/addr/4", token));
    EXPECT_TRUE(refused(frame, "gradcomm/g2/comm/ucx/addr/3", token + "x"));
  }
}

TEST(RendezvousStore, EachCommunicatorOfARankIsItsNextGenerationWithItsOwnKeys) {
  Server s;
  RendezvousStore a1(s.client(), 0, 2, "");
  RendezvousStore b1(s.client(), 1, 2, "");
  EXPECT_EQ(a1.generation(), 1u);
  EXPECT_EQ(b1.generation(), 1u);
  a1.set("addr/0", bytes("a-old"));
  b1.set("addr/1", bytes("b-old"));
  EXPECT_EQ(b1.get("addr/0", 1s), bytes("a-old"));
  // Rank 1 re-creates first and publishes; rank 0's old communicator is still alive.
  RendezvousStore b2(s.client(), 1, 2, "");
  EXPECT_EQ(b2.generation(), 2u);
  b2.set("addr/1", bytes("b-new"));
  std::thread late([&] {
    std::this_thread::sleep_for(300ms);
    RendezvousStore a2(s.client(), 0, 2, "");
    a2.set("addr/0", bytes("a-new"));
    EXPECT_EQ(a2.get("addr/1", 1s), bytes("b-new"));
  });
  // Rank 1's new generation waits for rank 0's new key; the old one is not it.
  EXPECT_EQ(b2.get("addr/0", 5s), bytes("a-new"));
  late.join();
  EXPECT_EQ(a1.get("addr/1", 1s), bytes("b-old"));  // the old generation is untouched
}

TEST(RendezvousStore, AValueFromARankWithAnotherWorldSizeIsInvalidArgumentAtOnce) {
  Server s;
  RendezvousStore a(s.client(), 0, 3, "");
  RendezvousStore b(s.client(), 1, 2, "");
  b.set("addr/1", bytes("x"));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    a.get("addr/1", 30s);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("world size 2"), std::string::npos) << m;
    EXPECT_NE(m.find("with 3"), std::string::npos) << m;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST(RendezvousStore, GarbageWhereARecordBelongsIsTransportErrorNamingTheKey) {
  Server s;
  RendezvousStore a(s.client(), 0, 2, "");
  auto raw = s.client();
  raw->set("gradcomm/g1/addr/1", bytes("\x01\x02 not a record"));
  try {
    a.get("addr/1", 5s);
    FAIL() << "expected TransportError";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("gradcomm/g1/addr/1"), std::string::npos) << e.what();
  }
}

// Another process (another id) claims rank 1 after ours did: it is rank 1's second
// generation while rank 0 and we are still in the first, waiting for rank 2.
TEST(RendezvousStore, ASecondProcessClaimingARankIsNamedOnEveryWaitingRank) {
  Server s;
  RendezvousStore r0(s.client(), 0, 3, "");
  RendezvousStore r1(s.client(), 1, 3, "");
  auto raw = s.client();
  ASSERT_EQ(raw->add("gradcomm/rank/1/generation", 1), 2);
  RendezvousRecord impostor;
  impostor.rank = 1;
  impostor.world_size = 3;
  impostor.generation = 2;
  impostor.process = rendezvous_process_id() + 1;
  impostor.pid = 999999;
  impostor.host = "elsewhere";
  raw->set("gradcomm/g2/join/1", encode_rendezvous_record(impostor, "gradcomm/g2/join/1", ""));
  for (RendezvousStore* waiting : {&r0, &r1}) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      waiting->get("addr/2", 30s);
      FAIL() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 joined twice"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("999999"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  }
}

// The same process re-creating sooner than its peers is not a duplicate.
TEST(RendezvousStore, OneProcessAheadOfItsPeersIsNotADuplicate) {
  Server s;
  RendezvousStore r0(s.client(), 0, 2, "");
  RendezvousStore r1(s.client(), 1, 2, "");
  RendezvousStore r1_next(s.client(), 1, 2, "");  // rank 1 moved on; rank 0 has not
  EXPECT_THROW(r1_next.get("addr/0", 1500ms), TimeoutError);
  EXPECT_THROW(r0.get("addr/1", 1500ms), TimeoutError);
}

}  // namespace
}  // namespace gradcomm::detail
