// A family added from outside the tree (tests/unit/scaled_sign/family.h, the worked
// example of docs/adding-a-compressor.md) works end to end through register_family
// alone: its spec parses and prints, ranks agree on it, the engine runs it over the
// compressed ring with error feedback, and the results match references computed
// here from the definition (sign times the bucket's mean |x|), not from the codec.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "compressors/codec.h"
#include "compressors/family.h"
#include "compressors/spec.h"
#include "gradcomm/errors.h"
#include "introspect.h"
#include "scaled_sign/family.h"
#include "test_util.h"

namespace gradcomm {
namespace {

using detail::Family;

void register_once() {
  static const bool done = (detail::register_family(example::kScaledSignFamily), true);
  (void)done;
}

// The definition: per bucket of the tensor, sign(x) (>= 0 counts as +) times mean |x|.
std::vector<float> scaled_sign_reference(const std::vector<float>& x, int64_t bucket) {
  std::vector<float> out(x.size());
  for (size_t lo = 0; lo < x.size(); lo += bucket) {
    const size_t hi = std::min(x.size(), lo + static_cast<size_t>(bucket));
    double sum = 0;
    for (size_t i = lo; i < hi; ++i) sum += std::fabs(x[i]);
    const auto mean = static_cast<float>(sum / static_cast<double>(hi - lo));
    for (size_t i = lo; i < hi; ++i) out[i] = x[i] >= 0.0f ? mean : -mean;
  }
  return out;
}

TEST(ScaledSignFamily, ParsesPrintsAndRoundTripsLikeABuiltIn) {
  register_once();
  const detail::CompressorSpec s = detail::parse_compressor_spec("scaled_sign:bucket=64");
  EXPECT_EQ(s.id, example::kScaledSignId);
  EXPECT_EQ(s.family<example::ScaledSignParams>().bucket, 64);
  EXPECT_TRUE(s.ef);  // the family's default
  EXPECT_EQ(s.canonical(), "scaled_sign:bucket=64,ef=1,min_numel=0,warmup=0,seed=0");
  EXPECT_EQ(detail::parse_compressor_spec(s.canonical()).canonical(), s.canonical());
  EXPECT_EQ(detail::parse_compressor_spec("scaled_sign").canonical(),
            "scaled_sign:bucket=256,ef=1,min_numel=0,warmup=0,seed=0");
  EXPECT_STREQ(detail::compressor_name(example::kScaledSignId), "scaled_sign");
  // The registry's own errors, with the family's keys.
  try {
    detail::parse_compressor_spec("scaled_sign:bits=4");
    FAIL() << "an unknown key parsed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("accepted: bucket, ef, min_numel, warmup, seed"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(detail::parse_compressor_spec("scaled_sign:bucket=0"), InvalidArgument);
  // Listed among the accepted names once registered.
  try {
    detail::parse_compressor_spec("scaled_sine");
    FAIL() << "a misspelt name parsed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("scaled_sign"), std::string::npos) << e.what();
  }
}

TEST(ScaledSignFamily, RegistrationRefusesTakenIdsNamesAndIncompleteFamilies) {
  register_once();
  auto refused = [](const Family& f, const std::string& fragment) {
    try {
      detail::register_family(f);
      ADD_FAILURE() << "registered " << f.name;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  refused(example::kScaledSignFamily, "the name is taken");
  Family other = example::kScaledSignFamily;
  other.name = "other_sign";
  other.id = detail::CompressorId::kTopk;
  refused(other, "the id is topk's");
  other.id = static_cast<detail::CompressorId>(201);
  other.make_codec = nullptr;
  refused(other, "needs make_codec");
  other = example::kScaledSignFamily;
  other.id = static_cast<detail::CompressorId>(201);
  other.name = "low_rank";
  other.collective = detail::Collective::kLowRank;
  refused(other, "reads the shapes");
  other = example::kScaledSignFamily;
  other.id = static_cast<detail::CompressorId>(201);
  other.name = "Bad Name";
  refused(other, "lower-case");
  constexpr std::string_view kNoWarmup[] = {"bucket", "ef", "min_numel", "seed"};
  other.name = "no_warmup";
  other.keys = kNoWarmup;
  refused(other, "'warmup'");
  EXPECT_THROW(detail::family_of(static_cast<detail::CompressorId>(201)), InvalidArgument);
}

TEST(ScaledSignFamily, CodecRejectsCorruptPayloads) {
  const example::ScaledSignCodec codec(8);
  const std::vector<float> x = {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11};
  std::vector<uint8_t> payload(codec.encoded_bytes(11));
  codec.encode(x.data(), 11, payload.data(), detail::PhiloxStream{}, 0);
  std::vector<float> out(11);
  codec.decode(payload, 11, out.data());
  EXPECT_EQ(out, scaled_sign_reference(x, 8));
  EXPECT_THROW(codec.decode(std::span(payload).first(payload.size() - 1), 11, out.data()), CorruptPayload);
  EXPECT_THROW(codec.decode(payload, 12, out.data()), CorruptPayload);  // numel in the header
  auto padded = payload;
  padded.back() |= 0x80;  // a bit past element 10
  EXPECT_THROW(codec.decode(padded, 11, out.data()), CorruptPayload);
  EXPECT_THROW(example::ScaledSignCodec(16).decode(payload, 11, out.data()), CorruptPayload);  // another bucket
  EXPECT_THROW(codec.encode(x.data(), 11, payload.data(), detail::PhiloxStream{}, 3), InvalidArgument);
}

// Inputs whose every bucket holds one magnitude per rank and the same signs on every
// rank: scaled sign represents them, and every partial sum the ring re-encodes,
// exactly. So the compressed ring's result must be the exact sum.
TEST(ScaledSignFamily, RingOverThreeRanksSumsRepresentableInputsExactly) {
  register_once();
  constexpr int kRanks = 3;
  constexpr int64_t kBucket = 16, kNumel = 1000;
  const float magnitude[kRanks] = {0.5f, 1.0f, 2.25f};
  auto sign_of = [](int64_t i) { return (i * 7 + i / 5) % 3 == 0 ? -1.0f : 1.0f; };
  auto bucket_scale = [](int64_t i) { return static_cast<float>(1 + (i / kBucket) % 4); };
  std::vector<std::vector<float>> out(kRanks);
  testing::run_ranks(kRanks, [&](Communicator& comm) {
    std::vector<float> x(kNumel);
    for (int64_t i = 0; i < kNumel; ++i) x[i] = sign_of(i) * bucket_scale(i) * magnitude[comm.rank()];
    EXPECT_TRUE(comm.plan_allreduce(kNumel, {"scaled_sign:bucket=16,ef=0", "w"}).compressed);
    const uint64_t before = comm.stats().bytes_sent;
    comm.allreduce(TensorView::of(x.data(), kNumel), ReduceOp::kSum, {"scaled_sign:bucket=16,ef=0", "w"});
    // Compressed, not a dense ring: its 2 (N-1)/N of 4000 bytes would be 2667; four
    // payloads of 336 elements are 4 x 150 bytes, plus the call's control messages.
    const uint64_t sent = comm.stats().bytes_sent - before;
    EXPECT_GT(sent, 0u);
    EXPECT_LT(sent, 1200u) << "bytes sent by rank " << comm.rank();
    out[comm.rank()] = x;
  });
  for (int64_t i = 0; i < kNumel; ++i) {
    ASSERT_EQ(out[0][i], sign_of(i) * bucket_scale(i) * 3.75f) << "element " << i;
    for (int r = 1; r < kRanks; ++r) ASSERT_EQ(out[r][i], out[0][i]) << "rank " << r << " element " << i;
  }
}

// One rank: the output is the definition applied to data + residual, and the residual
// keeps exactly what it dropped, step after step (error feedback, with no engine change).
TEST(ScaledSignFamily, ErrorFeedbackCarriesWhatCompressionDropped) {
  register_once();
  constexpr int64_t kNumel = 100;
  std::vector<std::vector<float>> inputs(3, std::vector<float>(kNumel));
  for (size_t s = 0; s < inputs.size(); ++s) {
    for (int64_t i = 0; i < kNumel; ++i) inputs[s][i] = std::sin(0.37f * i + s) * (1 + i % 5);
  }
  testing::run_ranks(1, [&](Communicator& comm) {
    std::vector<float> residual(kNumel, 0.0f);
    for (const auto& input : inputs) {
      std::vector<float> acc(kNumel), x = input;
      for (int64_t i = 0; i < kNumel; ++i) acc[i] = input[i] + residual[i];
      const std::vector<float> expected = scaled_sign_reference(acc, 32);
      comm.allreduce(TensorView::of(x.data(), kNumel), ReduceOp::kSum, {"scaled_sign:bucket=32", "g"});
      for (int64_t i = 0; i < kNumel; ++i) ASSERT_NEAR(x[i], expected[i], 1e-6f * (1 + std::fabs(expected[i])));
      const auto kept = detail::residual_view(comm, "g");
      ASSERT_EQ(kept.size(), static_cast<size_t>(kNumel));
      for (int64_t i = 0; i < kNumel; ++i) {
        ASSERT_NEAR(kept[i], acc[i] - x[i], 1e-6f * (1 + std::fabs(acc[i])));
        residual[i] = kept[i];
      }
    }
  });
}

}  // namespace
}  // namespace gradcomm
