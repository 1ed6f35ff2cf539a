// Communicator::alloc_shared (src/shared_buffer.cc) and the allreduce that reads the node's
// buffers in place (NodeCollectives::allreduce_direct), ranks as threads on one node
// segment: results bitwise equal to the segment's slot path on a private copy, for every
// dtype and op; a part of a buffer (an offset); the slot path's bytes never written; every
// rank's MismatchError, never a hang or a wrong sum, when one rank passes private memory
// or another place; sizes that differ at allocation; plain memory without a segment; a
// buffer that outlives its communicator (runs under TSan and ASan).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gradcomm/errors.h"
#include "segment_ranks.h"
#include "test_util.h"

namespace gradcomm::detail {
namespace {

// Inputs that differ by rank and element, in the dtype's own bits, with values whose sums
// round (so that the order of the reduction shows).
void fill(void* data, int64_t numel, DType dtype, int r) {
  auto* bytes = static_cast<uint8_t*>(data);
  for (int64_t i = 0; i < numel; ++i) {
    const double v = 0.1 * static_cast<double>((i * 7 + r * 13) % 101) - 3.3 + 1e-3 * r;
    uint8_t* at = bytes + static_cast<size_t>(i) * dtype_size(dtype);
    switch (dtype) {
      case DType::kFloat32: { const auto x = static_cast<float>(v); std::memcpy(at, &x, 4); break; }
      case DType::kFloat64: std::memcpy(at, &v, 8); break;
      case DType::kInt32: { const auto x = static_cast<int32_t>(v * 1000); std::memcpy(at, &x, 4); break; }
      case DType::kInt64: { const auto x = static_cast<int64_t>(v * 1e6); std::memcpy(at, &x, 8); break; }
      case DType::kFloat16:
      case DType::kBFloat16: {
        const auto x = static_cast<float>(v);  // a 16-bit pattern of a float's top half: a valid value
        uint32_t u = 0;
        std::memcpy(&u, &x, 4);
        const auto h = static_cast<uint16_t>(dtype == DType::kBFloat16 ? u >> 16 : 0x3c00 + (i * 37 + r * 11) % 2000);
        std::memcpy(at, &h, 2);
        break;
      }
      default: FAIL() << "dtype not covered";
    }
  }
}

constexpr int64_t kBytes = int64_t{1} << 20;  // past the small-call limit: the direct path

TEST(SharedBuffer, AllreduceFromPeersBuffersEqualsTheSlotPathBitForBit) {
  for (int n : {2, 3}) {
    run_on_segment(n, [&](int r, Communicator& comm) {
      SharedBuffer buffer = comm.alloc_shared(kBytes);
      ASSERT_TRUE(buffer.shared());
      ASSERT_EQ(buffer.size(), static_cast<size_t>(kBytes));
      for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt32,
                          DType::kInt64}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
          const int64_t numel = kBytes / static_cast<int64_t>(dtype_size(dtype));
          std::vector<uint8_t> reference(static_cast<size_t>(kBytes));
          fill(reference.data(), numel, dtype, r);
          std::memcpy(buffer.data(), reference.data(), reference.size());
          comm.allreduce(TensorView{reference.data(), numel, dtype}, op);  // private memory: the slot path
          const Stats before = comm.stats();
          comm.allreduce(TensorView{buffer.data(), numel, dtype}, op);
          const Stats after = comm.stats();
          ASSERT_EQ(after.node_shm_ops, before.node_shm_ops + 1);
          ASSERT_EQ(after.node_shm_bytes, before.node_shm_bytes) << "the direct path writes no slot";
          ASSERT_EQ(std::memcmp(buffer.data(), reference.data(), reference.size()), 0)
              << "n " << n << " dtype " << dtype_name(dtype) << " op " << reduce_op_name(op);
        }
      }
    });
  }
}

TEST(SharedBuffer, PartOfABufferLeavesTheRestAlone) {
  run_on_segment(3, [&](int r, Communicator& comm) {
    SharedBuffer buffer = comm.alloc_shared(kBytes + 4096);
    auto* all = static_cast<float*>(buffer.data());
    const int64_t total = static_cast<int64_t>(buffer.size() / 4);
    for (int64_t i = 0; i < total; ++i) all[i] = static_cast<float>(r * 1000 + i % 997);
    const int64_t begin = 1001, numel = 100003;  // not aligned to anything
    comm.allreduce(TensorView::of(all + begin, numel));
    for (int64_t i = 0; i < total; ++i) {
      const float want = i >= begin && i < begin + numel ? static_cast<float>(3 * (i % 997) + 3000)
                                                         : static_cast<float>(r * 1000 + i % 997);
      ASSERT_EQ(all[i], want) << "element " << i;
    }
  });
}

TEST(SharedBuffer, SmallCallsInASharedBufferTakeTheSlots) {
  run_on_segment(2, [&](int r, Communicator& comm) {
    SharedBuffer buffer = comm.alloc_shared(4096);
    auto* x = static_cast<int32_t*>(buffer.data());
    for (int i = 0; i < 1024; ++i) x[i] = r + i;
    const Stats before = comm.stats();
    comm.allreduce(TensorView::of(x, 1024));
    EXPECT_GT(comm.stats().node_shm_bytes, before.node_shm_bytes);
    for (int i = 0; i < 1024; ++i) ASSERT_EQ(x[i], 2 * i + 1);
  });
}

// Every rank raises MismatchError naming the call (no rank waits on, or sums, the other).
void expect_mismatch_everywhere(int n, const std::function<void(int, Communicator&, SharedBuffer&)>& call) {
  const auto errors = run_on_segment_collect(n, [&](int r, Communicator& comm) {
    SharedBuffer buffer = comm.alloc_shared(kBytes + 4096);
    call(r, comm, buffer);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(errors[static_cast<size_t>(r)]) << "rank " << r << " returned";
    try {
      std::rethrow_exception(errors[static_cast<size_t>(r)]);
    } catch (const MismatchError& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
}

TEST(SharedBuffer, OneRankWithPrivateMemoryIsAMismatchOnEveryRank) {
  expect_mismatch_everywhere(2, [](int r, Communicator& comm, SharedBuffer& buffer) {
    std::vector<float> own(kBytes / 4, 1.0f);
    float* data = r == 1 ? own.data() : static_cast<float*>(buffer.data());
    comm.allreduce(TensorView::of(data, kBytes / 4));
  });
}

TEST(SharedBuffer, AnotherPlaceInTheBufferIsAMismatchOnEveryRank) {
  expect_mismatch_everywhere(3, [](int r, Communicator& comm, SharedBuffer& buffer) {
    comm.allreduce(TensorView::of(static_cast<float*>(buffer.data()) + (r == 2 ? 16 : 0), kBytes / 4));
  });
}

TEST(SharedBuffer, SizesThatDifferAreAMismatchOnEveryRank) {
  const auto errors = run_on_segment_collect(2, [&](int r, Communicator& comm) {
    (void)comm.alloc_shared(r == 0 ? 4096 : 8192);
  });
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    EXPECT_THROW(std::rethrow_exception(e), MismatchError);
  }
}

TEST(SharedBuffer, ZeroBytesIsInvalid) {
  run_on_segment(2, [&](int, Communicator& comm) { EXPECT_THROW((void)comm.alloc_shared(0), InvalidArgument); });
}

TEST(SharedBuffer, WithoutASegmentItIsPlainMemoryAndTheCallsWork) {
  gradcomm::testing::run_ranks(2, [](Communicator& comm) {
    SharedBuffer buffer = comm.alloc_shared(kBytes);
    EXPECT_FALSE(buffer.shared());
    auto* x = static_cast<float*>(buffer.data());
    for (int64_t i = 0; i < kBytes / 4; ++i) ASSERT_EQ(x[i], 0.0f);  // zero-filled
    for (int64_t i = 0; i < kBytes / 4; ++i) x[i] = static_cast<float>(comm.rank() + i % 10);
    comm.allreduce(TensorView::of(x, kBytes / 4));
    for (int64_t i = 0; i < kBytes / 4; ++i) ASSERT_EQ(x[i], static_cast<float>(1 + 2 * (i % 10)));
  });
}

TEST(SharedBuffer, OutlivesItsCommunicator) {
  std::vector<SharedBuffer> kept(2);
  run_on_segment(2, [&](int r, Communicator& comm) {
    kept[static_cast<size_t>(r)] = comm.alloc_shared(kBytes);
    static_cast<float*>(kept[static_cast<size_t>(r)].data())[0] = 1.0f;
  });
  for (auto& b : kept) {
    EXPECT_EQ(static_cast<float*>(b.data())[0], 1.0f);
    b = SharedBuffer();  // unmaps after the communicator (and its registry) went
    EXPECT_EQ(b.data(), nullptr);
  }
}

}  // namespace
}  // namespace gradcomm::detail
