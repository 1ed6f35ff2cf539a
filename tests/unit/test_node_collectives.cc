// The shared-segment collectives of one node's ranks (collectives/node_collectives.h) and
// their segment (collectives/shm_segment.h), ranks as threads that each map the segment
// themselves: every dtype and op at sizes around the slots' boundaries gives every rank the
// same bytes, equal to the rank-order reduction with reduce.h's kernels (computed here
// independently, one rank's values after another), for allreduce and reduce-scatter (even
// and uneven segments); allgather and broadcast deliver every byte; the collectives mix in
// one segment call after call; a rank that never comes ends the others' wait through their
// poll (no hang); a rank in another collective is caught by the digest; the segment's name
// is gone once unlinked, a stale or foreign segment is refused, and a name is never taken
// over.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/node_collectives.h"
#include "collectives/shm_segment.h"
#include "gradcomm/errors.h"
#include "reduce.h"

namespace gradcomm::detail {
namespace {

std::string unique_name(const char* what) {
  static int counter = 0;
  return "/gradcomm-test-" + std::string(what) + "-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
}

bool exists(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
}

// Rank r's input: bytes drawn per rank, made valid for the type (no NaNs for floats, whose
// min/max would make bit comparisons moot; small magnitudes so integer sums stay exact).
std::vector<uint8_t> input(int rank, int64_t n, DType dtype) {
  std::mt19937 gen(static_cast<uint32_t>(rank * 7919 + n));
  std::normal_distribution<double> normal(0.0, 3.0);
  std::vector<uint8_t> out(static_cast<size_t>(n) * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const double v = normal(gen);
    uint8_t* p = out.data() + static_cast<size_t>(i) * dtype_size(dtype);
    switch (dtype) {
      case DType::kFloat32: { const float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
      case DType::kFloat64: std::memcpy(p, &v, 8); break;
      case DType::kFloat16: case DType::kBFloat16: {
        // A float16/bfloat16 pattern of a modest value: the fp32 bits' top half for bf16,
        // a built half for fp16 (sign, exponent 13..17, mantissa).
        const auto f = static_cast<float>(v);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        const uint16_t h = dtype == DType::kBFloat16
                               ? static_cast<uint16_t>(u >> 16)
                               : static_cast<uint16_t>((u >> 16 & 0x8000) | (13 + i % 5) << 10 | (gen() & 0x3FF));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kInt32: { const auto x = static_cast<int32_t>(v * 1000); std::memcpy(p, &x, 4); break; }
      case DType::kInt64: { const auto x = static_cast<int64_t>(v * 1e6); std::memcpy(p, &x, 8); break; }
      case DType::kUInt8: { const auto x = static_cast<uint8_t>(gen()); std::memcpy(p, &x, 1); break; }
    }
  }
  return out;
}

// The rank-order reduction, one rank's values after another, the average divided in the last.
std::vector<uint8_t> reference(int ranks, int64_t n, DType dtype, ReduceOp op) {
  std::vector<uint8_t> acc = input(0, n, dtype);
  for (int q = 1; q < ranks; ++q) {
    const auto x = input(q, n, dtype);
    reduce_inplace(acc.data(), x.data(), n, dtype, op, op == ReduceOp::kAvg && q == ranks - 1 ? ranks : 1);
  }
  return acc;
}

// Runs `ranks` threads; each maps the segment itself and runs `body(rank, allreduce)`.
void run_node(int ranks, size_t slot_bytes, const std::function<void(int, NodeCollectives&)>& body) {
  const std::string name = unique_name("node");
  const size_t bytes = node_segment_bytes(ranks, slot_bytes);
  ShmSegment creator = ShmSegment::create(name, bytes);
  init_node_segment(creator.data(), ranks, slot_bytes);
  std::vector<ShmSegment> mapped;
  for (int r = 0; r < ranks; ++r) mapped.push_back(ShmSegment::open(name, bytes));
  creator.unlink();  // every rank has mapped it: the name goes, the memory stays
  EXPECT_FALSE(exists(name));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        NodeCollectives node(mapped[static_cast<size_t>(r)].data(), r, ranks, slot_bytes);
        body(r, node);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

const NodeWait kNoPoll{[](int) {},
                       [](int q, std::span<const uint8_t>) {
                         throw MismatchError("rank " + std::to_string(q) + " disagrees");
                       },
                       {}};

TEST(NodeCollectives, EveryDtypeAndOpIsTheRankOrderReductionOnEveryRank) {
  const size_t slot_bytes = 1024;  // small slots: several chunks a call, both slots of every rank reused
  const DType dtypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                          DType::kInt32,   DType::kInt64,   DType::kUInt8};
  for (int ranks : {1, 2, 3, 4}) {
    for (DType dtype : dtypes) {
      const int64_t per_slot = static_cast<int64_t>(slot_bytes / dtype_size(dtype));
      const std::vector<int64_t> sizes = {0, 1, 3, per_slot - 1, per_slot, per_slot + 1, 7 * per_slot / 2};
      run_node(ranks, slot_bytes, [&](int r, NodeCollectives& node) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
          for (int64_t n : sizes) {  // one segment, call after call
            auto data = input(r, n, dtype);
            node.allreduce(data.data(), n, dtype, op, 7, kNoPoll);
            ASSERT_EQ(data, reference(ranks, n, dtype, op))
                << "N=" << ranks << " " << dtype_name(dtype) << " " << reduce_op_name(op) << " n=" << n << " rank "
                << r;
          }
        }
      });
    }
  }
}

TEST(NodeCollectives, LargeCallsInOneSegmentStayExact) {
  // 4 ranks, 256 KiB slots, 16 MiB of float32 (64 chunks a call), two calls.
  const int64_t n = int64_t{4} << 20;
  run_node(4, 256 << 10, [&](int r, NodeCollectives& node) {
    for (int call = 0; call < 2; ++call) {
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>((i + call) % 1000 * (r + 1));
      node.allreduce(x.data(), n, DType::kFloat32, ReduceOp::kSum, 7, kNoPoll);
      for (int64_t i = 0; i < n; i += 9973) {
        ASSERT_EQ(x[static_cast<size_t>(i)], static_cast<float>((i + call) % 1000 * 10)) << "i=" << i;
      }
    }
  });
}

TEST(NodeCollectives, ARankThatNeverComesEndsTheOthersWaitThroughTheirPoll) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(run_node(3, 256,
                        [&](int r, NodeCollectives& node) {
                          if (r == 2) return;  // never calls
                          std::vector<float> x(100, 1.0f);
                          const NodeWait wait{[&](int) {
                                                if (std::chrono::steady_clock::now() - start >
                                                    std::chrono::milliseconds(300)) {
                                                  throw TimeoutError("rank 2 never came");
                                                }
                                              },
                                              kNoPoll.disagree, {}};
                          node.allreduce(x.data(), 100, DType::kFloat32, ReduceOp::kSum, 7, wait);
                        }),
               TimeoutError);
}

TEST(NodeCollectives, ReduceScatterIsTheRankOrderReductionOfEachSegment) {
  const size_t slot_bytes = 1024;
  const DType dtypes[] = {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kInt64, DType::kUInt8};
  for (int ranks : {2, 3, 4}) {
    for (DType dtype : dtypes) {
      const size_t elem = dtype_size(dtype);
      const auto per_round = static_cast<int64_t>(slot_bytes / elem) / ranks;
      for (int64_t count : {int64_t{1}, per_round - 1, per_round + 3, 5 * per_round}) {
        // Even segments (a call's reduce_scatter), then uneven ones (the ring's, two levels).
        for (bool even : {true, false}) {
          std::vector<int64_t> starts(static_cast<size_t>(ranks) + 1, 0);
          for (int p = 0; p < ranks; ++p) starts[p + 1] = starts[p] + (even ? count : count + p * 3 - (p == 1));
          const int64_t n = starts.back();
          run_node(ranks, slot_bytes, [&](int r, NodeCollectives& node) {
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
              const auto in = input(r, n, dtype);
              const auto want = reference(ranks, n, dtype, op);
              const int64_t mine = starts[r + 1] - starts[r];
              // Out of place (the input unchanged), then in place.
              std::vector<uint8_t> out(static_cast<size_t>(mine) * elem + 1, 0xAB);
              auto copy = in;
              node.reduce_scatter(copy.data(), out.data(), starts, dtype, op, 9, kNoPoll);
              ASSERT_EQ(copy, in) << "the input changed";
              ASSERT_EQ(0, std::memcmp(out.data(), want.data() + starts[r] * elem, mine * elem))
                  << "N=" << ranks << " " << dtype_name(dtype) << " count=" << count << " rank " << r;
              ASSERT_EQ(out.back(), 0xAB) << "wrote past its segment";
              node.reduce_scatter(copy.data(), copy.data() + starts[r] * elem, starts, dtype, op, 9, kNoPoll);
              ASSERT_EQ(0, std::memcmp(copy.data() + starts[r] * elem, want.data() + starts[r] * elem, mine * elem));
            }
          });
        }
      }
    }
  }
}

TEST(NodeCollectives, AllgatherBroadcastAndBarrierMixWithAllreduceInOneSegment) {
  const size_t slot_bytes = 512;
  for (int ranks : {2, 3, 4}) {
    run_node(ranks, slot_bytes, [&](int r, NodeCollectives& node) {
      for (int64_t unit : {int64_t{1}, int64_t{100}, int64_t{1500}}) {
        // Allgather of blocks of different lengths (rank p: unit + 7p bytes, one empty).
        std::vector<int64_t> offsets(static_cast<size_t>(ranks) + 1, 0);
        for (int p = 0; p < ranks; ++p) offsets[p + 1] = offsets[p] + (p == 1 ? 0 : unit + 7 * p);
        std::vector<uint8_t> out(static_cast<size_t>(offsets.back()), 0);
        const auto fill = [&](int p, int64_t i) { return static_cast<uint8_t>(p * 31 + i * 7 + unit); };
        for (int64_t i = offsets[r]; i < offsets[r + 1]; ++i) out[i] = fill(r, i);
        const uint64_t written = node.bytes_written();
        node.allgather(out.data(), offsets, 11, kNoPoll);
        ASSERT_EQ(node.bytes_written() - written, static_cast<uint64_t>(offsets[r + 1] - offsets[r]))
            << "an allgather writes its own block into the segment, once";
        for (int p = 0; p < ranks; ++p) {
          for (int64_t i = offsets[p]; i < offsets[p + 1]; ++i) ASSERT_EQ(out[i], fill(p, i)) << "block " << p;
        }
        node.barrier(12, kNoPoll);
        // Broadcast from every root.
        for (int root = 0; root < ranks; ++root) {
          std::vector<uint8_t> data(static_cast<size_t>(unit * 3), static_cast<uint8_t>(r));
          if (r == root) {
            for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 13 + root);
          }
          node.broadcast(data.data(), data.size(), root, 13, kNoPoll);
          for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], static_cast<uint8_t>(i * 13 + root));
        }
        auto x = input(r, unit, DType::kFloat32);
        node.allreduce(x.data(), unit, DType::kFloat32, ReduceOp::kSum, 14, kNoPoll);
        ASSERT_EQ(x, reference(ranks, unit, DType::kFloat32, ReduceOp::kSum));
      }
    });
  }
}

TEST(NodeCollectives, ARankInAnotherCollectiveIsCaughtByTheDigestAndNamedByItsRecord) {
  // Rank 1 calls a barrier while rank 0 allreduces: each sees the other's digest, and the
  // disagreement ends its call with the other's call record in hand (what the caller names).
  const std::string records[] = {"allreduce #7", "barrier #7"};
  std::atomic<int> disagreements{0};
  EXPECT_THROW(run_node(2, 256,
                        [&](int r, NodeCollectives& node) {
                          const std::string& mine = records[r];
                          const NodeWait wait{[](int) {},
                                              [&](int q, std::span<const uint8_t> theirs) {
                                                EXPECT_EQ(q, 1 - r);
                                                EXPECT_EQ(std::string(theirs.begin(), theirs.end()), records[q]);
                                                disagreements += 1;
                                                throw MismatchError("rank " + std::to_string(q) + " disagrees");
                                              },
                                              [&mine](std::span<uint8_t> into) {
                                                std::memcpy(into.data(), mine.data(), mine.size());
                                                return mine.size();
                                              }};
                          std::vector<float> x(10, 1.0f);
                          if (r == 0) node.allreduce(x.data(), 10, DType::kFloat32, ReduceOp::kSum, 1, wait);
                          if (r == 1) node.barrier(2, wait);
                        }),
               MismatchError);
  EXPECT_GE(disagreements.load(), 1);
}

TEST(ShmSegment, NamesAreNeverTakenOverAndForeignSegmentsAreRefused) {
  const std::string name = unique_name("seg");
  ShmSegment a = ShmSegment::create(name, 4096);
  EXPECT_THROW(ShmSegment::create(name, 4096), TransportError);  // exists: never reused
  EXPECT_THROW(ShmSegment::open(name, 8192), TransportError);    // another size: not ours
  ShmSegment b = ShmSegment::open(name, 4096);
  a.data()[1000] = 42;
  EXPECT_EQ(b.data()[1000], 42);  // one memory
  // A segment whose header is not this communicator's (stale, foreign, or uninitialized).
  EXPECT_THROW(NodeCollectives(b.data(), 0, 2, 128), CorruptPayload);
  init_node_segment(a.data(), 3, 192);
  EXPECT_THROW(NodeCollectives(b.data(), 0, 2, 128), CorruptPayload);
  EXPECT_TRUE(exists(name));
  { ShmSegment gone = std::move(a); }  // the creator's destruction unlinks
  EXPECT_FALSE(exists(name));
  EXPECT_THROW(ShmSegment::open(name, 4096), TransportError);
  EXPECT_EQ(b.data()[1000], 42);  // the mapping outlives the name
}

}  // namespace
}  // namespace gradcomm::detail
