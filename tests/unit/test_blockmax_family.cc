// A sparsifier added from outside the tree (tests/unit/blockmax/family.h, the worked
// example of docs/adding-a-compressor.md, "6. A sparsifier") works end to end through
// register_family alone: its spec parses and prints, the engine runs its own selection
// on top-k's collective shape (sparse payloads, their exchange and sum, error feedback),
// and the results match references computed here from the definition (each block's
// largest |x|), not from the family's code.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "blockmax/family.h"
#include "compressors/family.h"
#include "compressors/spec.h"
#include "gradcomm/errors.h"
#include "introspect.h"
#include "test_util.h"

namespace gradcomm {
namespace {

void register_once() {
  static const bool done = (detail::register_family(example::kBlockmaxFamily), true);
  (void)done;
}

// The definition: of `blocks` equal blocks of x, each one's element of largest
// magnitude (the first of equals) kept, everything else 0.
std::vector<float> blockmax_reference(const std::vector<float>& x, int64_t blocks) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<float> out(x.size(), 0.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * n / blocks, hi = (b + 1) * n / blocks;
    int64_t best = lo;
    for (int64_t i = lo; i < hi; ++i) {
      if (std::fabs(x[i]) > std::fabs(x[best])) best = i;
    }
    out[best] = x[best];
  }
  return out;
}

std::vector<float> input(int rank, int step, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = std::sin(0.731f * i + 1.7f * rank + 0.3f * step) * (1 + (i + rank) % 7);
  return x;
}

TEST(BlockmaxFamily, ParsesPrintsAndRoundTripsLikeABuiltIn) {
  register_once();
  const detail::CompressorSpec s = detail::parse_compressor_spec("blockmax:ratio=0.05");
  EXPECT_EQ(s.id, example::kBlockmaxId);
  EXPECT_EQ(s.family<example::BlockmaxParams>().ratio, 0.05);
  EXPECT_TRUE(s.ef);
  EXPECT_EQ(s.canonical(), "blockmax:ratio=0.05,ef=1,min_numel=0,warmup=0,seed=0,values=fp32");
  EXPECT_EQ(detail::parse_compressor_spec(s.canonical()).canonical(), s.canonical());
  EXPECT_THROW(detail::parse_compressor_spec("blockmax"), InvalidArgument);
  EXPECT_THROW(detail::parse_compressor_spec("blockmax:ratio=0"), InvalidArgument);
  EXPECT_THROW(detail::parse_compressor_spec("blockmax:ratio=0.1,k=5"), InvalidArgument);
  // Another family's block is refused by name, not misread.
  try {
    (void)detail::parse_compressor_spec("topk:ratio=0.05").family<example::BlockmaxParams>();
    ADD_FAILURE() << "a topk spec read as blockmax's";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("a topk spec does not hold blockmax's keys"), std::string::npos) << e.what();
  }
}

TEST(BlockmaxFamily, RegistrationRefusesASparsifierWithoutItsSelection) {
  detail::Family f = example::kBlockmaxFamily;
  f.id = static_cast<detail::CompressorId>(205);
  f.name = "blockmax_no_select";
  constexpr detail::SparseOps kShapeOnly{.shape = example::blockmax_shape};
  f.sparse = &kShapeOnly;
  try {
    detail::register_family(f);
    ADD_FAILURE() << "registered a sparsifier without select";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("sparse->select"), std::string::npos) << e.what();
  }
  f.sparse = nullptr;
  EXPECT_THROW(detail::register_family(f), InvalidArgument);
}

// Three ranks, no error feedback: every rank ends with the sum, in rank order, of each
// rank's block maxima; a payload per rank of 50 raw entries, not the dense tensor.
TEST(BlockmaxFamily, ThreeRanksSumEachRanksBlockMaxima) {
  register_once();
  constexpr int kRanks = 3;
  constexpr int64_t kNumel = 1000, kBlocks = 50;  // ratio 0.05
  std::vector<std::vector<float>> out(kRanks);
  testing::run_ranks(kRanks, [&](Communicator& comm) {
    std::vector<float> x = input(comm.rank(), 0, kNumel);
    EXPECT_TRUE(comm.plan_allreduce(kNumel, {"blockmax:ratio=0.05,ef=0", "w"}).compressed);
    const uint64_t before = comm.stats().bytes_sent;
    comm.allreduce(TensorView::of(x.data(), kNumel), ReduceOp::kSum, {"blockmax:ratio=0.05,ef=0", "w"});
    // Each rank sends its payload (50 entries x 8 bytes + the header) to the two
    // others, plus the call's control messages: far below the dense ring's 2 x 2/3 x 4000.
    const uint64_t sent = comm.stats().bytes_sent - before;
    EXPECT_LT(sent, 2000u) << "bytes sent by rank " << comm.rank();
    out[comm.rank()] = x;
  });
  std::vector<float> expected(kNumel, 0.0f);
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<float> kept = blockmax_reference(input(r, 0, kNumel), kBlocks);
    for (int64_t i = 0; i < kNumel; ++i) expected[i] += kept[i];
  }
  for (int r = 0; r < kRanks; ++r) {
    for (int64_t i = 0; i < kNumel; ++i) ASSERT_EQ(out[r][i], expected[i]) << "rank " << r << " element " << i;
  }
}

// Error feedback is the shape's: each step selects from input + residual, and the
// residual keeps everything that was not sent (values=fp32: a sent value drops nothing).
TEST(BlockmaxFamily, ErrorFeedbackCarriesWhatWasNotSent) {
  register_once();
  constexpr int64_t kNumel = 240, kBlocks = 24;  // ratio 0.1
  testing::run_ranks(1, [&](Communicator& comm) {
    std::vector<float> residual(kNumel, 0.0f);
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> in = input(0, step, kNumel);
      std::vector<float> acc(kNumel), x = in;
      for (int64_t i = 0; i < kNumel; ++i) acc[i] = in[i] + residual[i];
      const std::vector<float> expected = blockmax_reference(acc, kBlocks);
      comm.allreduce(TensorView::of(x.data(), kNumel), ReduceOp::kSum, {"blockmax:ratio=0.1", "g"});
      for (int64_t i = 0; i < kNumel; ++i) ASSERT_EQ(x[i], expected[i]) << "step " << step << " element " << i;
      const auto kept = detail::residual_view(comm, "g");
      ASSERT_EQ(kept.size(), static_cast<size_t>(kNumel));
      for (int64_t i = 0; i < kNumel; ++i) {
        ASSERT_EQ(kept[i], acc[i] - expected[i]) << "step " << step << " element " << i;
        residual[i] = kept[i];
      }
    }
  });
}

}  // namespace
}  // namespace gradcomm
