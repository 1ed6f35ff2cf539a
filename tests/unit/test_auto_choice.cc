// compressor=auto (src/auto_choice.h, compressors/auto_spec.h): its spec and guard, the
// cost model's choice against hand-computed predictions, the persisted record, and on
// ranks: the same choice on every rank whatever each rank measured, a switch mid-run
// that keeps replicas bitwise identical and loses nothing of the residual, and
// save/load carrying the choice and the residual, and the overlap measured from issue to
// when the application needs a call (its wait, or Work::needed beside a helper's wait).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <thread>

#include "auto_choice.h"
#include "comm_impl.h"
#include "common/time_scale.h"
#include "compressors/auto_spec.h"
#include "compressors/quantize/quantize.h"
#include "compressors/topk/topk.h"
#include "introspect.h"
#include "test_util.h"

namespace gradcomm {
namespace {

using detail::AutoChooser;
using detail::AutoRecord;
using detail::AutoShape;
using detail::AutoSpec;
using detail::CandidateCost;
using detail::LinkModel;
using detail::parse_auto_spec;

// ---- the spec --------------------------------------------------------------------

TEST(AutoSpec, DefaultsAndCanonicalRoundTrip) {
  const AutoSpec s = parse_auto_spec("auto");
  ASSERT_EQ(s.candidates.size(), 5u);
  EXPECT_EQ(s.min_bits, 4);
  EXPECT_EQ(s.review, 50);
  EXPECT_EQ(s.small, 4096);
  EXPECT_EQ(s.max_ratio, 0.0);
  const std::string c = s.canonical();
  EXPECT_EQ(c.rfind("auto:min_bits=4,max_ratio=0,review=50,small=4096,among=none|bf16:ef=0,", 0), 0u) << c;
  EXPECT_EQ(parse_auto_spec(c).canonical(), c);
}

TEST(AutoSpec, AmongTakesTheRestWithTheCandidatesOwnCommas) {
  const AutoSpec s = parse_auto_spec("auto:review=7,small=10,among=none|quant:bits=4,ef=1,bucket=256|topk:ratio=0.05");
  ASSERT_EQ(s.candidates.size(), 3u);
  EXPECT_EQ(s.review, 7);
  EXPECT_EQ(s.small, 10);
  EXPECT_EQ(s.candidates[1].family<detail::QuantParams>().bits, 4);
  EXPECT_EQ(s.candidates[1].family<detail::QuantParams>().bucket, 256);
  EXPECT_TRUE(s.candidates[1].ef);
  EXPECT_DOUBLE_EQ(s.candidates[2].family<detail::TopkParams>().ratio, 0.05);
}

void expect_refused(const std::string& spec, const std::string& says) {
  try {
    (void)parse_auto_spec(spec);
    ADD_FAILURE() << spec << " was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << spec << ": " << e.what();
  }
}

TEST(AutoSpec, TheGuardAndBadSpecsAreRefusedSayingWhy) {
  expect_refused("auto:among=none|quant:bits=4", "without error feedback");
  expect_refused("auto:among=none|quant:bits=2,ef=1", "below min_bits=4");
  EXPECT_NO_THROW(parse_auto_spec("auto:min_bits=2,among=none|quant:bits=2,ef=1"));
  expect_refused("auto:among=none|topk:ratio=0.01,ef=0", "only with error feedback");
  expect_refused("auto:among=none|randomk:ratio=0.1", "randomk is not one of them");
  expect_refused("auto:among=none|powersgd:rank=2", "powersgd is not one of them");
  expect_refused("auto:among=none|none", "given twice");
  expect_refused("auto:among=none||bf16", "empty candidate");
  expect_refused("auto:among=", "no candidate");
  expect_refused("auto:among=none|auto", "its own candidate");
  expect_refused("auto:among=none|nope", "compressor 'nope' unknown");
  expect_refused("auto:review=0", "review='0'");
  expect_refused("auto:speed=1", "unknown key 'speed'");
  expect_refused("auto:review=5,review=6", "given twice");
  expect_refused("auto:", "nothing after");
  expect_refused("auto:max_ratio=0.5", "at least 1");
  EXPECT_NO_THROW(detail::check_compressor_spec("auto:max_ratio=10"));
  EXPECT_THROW(detail::check_compressor_spec("autox"), InvalidArgument);
}

// ---- the model ---------------------------------------------------------------------

// The default candidates' costs for n elements, shaped as measured on the development VM
// (ns per element): reduce 0.3, bf16 0.6/0.6, quant 1.5/0.8, top-k 4 + 0.5 decode.
std::vector<CandidateCost> default_costs(const AutoSpec& s, int64_t n) {
  std::vector<CandidateCost> c;
  const double x = static_cast<double>(n) * 1e-9;
  c.push_back({0.3 * x * 1e0, 0, 4.0 * n});              // none
  c.push_back({0.6 * x, 0.6 * x, 2.0 * n});              // bf16
  c.push_back({1.8 * x, 0.8 * x, 1.0 * n + 16});         // quant 8, ef
  c.push_back({1.8 * x, 0.8 * x, 0.5 * n + 16});         // quant 4, ef
  c.push_back({4.3 * x, 0.5 * x, 0.01 * n * 3.0 + 32});  // top-k 1 %, ef
  EXPECT_EQ(c.size(), s.candidates.size());
  return c;
}

TEST(AutoModel, PredictionsAreTheDocumentedFormulas) {
  const LinkModel link{50e-6, 1e-8};
  const CandidateCost c{0.01, 0.002, 1e6};
  EXPECT_DOUBLE_EQ(detail::predict_compute_s(AutoShape::kCodecRing, c, 4), 0.01 + 0.002 * 2 * 3 / 4.0);
  EXPECT_DOUBLE_EQ(detail::predict_compute_s(AutoShape::kAllgather, c, 4), 0.01 + 0.002 * 4);
  EXPECT_DOUBLE_EQ(detail::predict_compute_s(AutoShape::kDenseRing, c, 4), 0.01 * 3 / 4.0);
  EXPECT_DOUBLE_EQ(detail::predict_wire_s(AutoShape::kCodecRing, 1e6, link, 4), 6 * (50e-6 + 1e6 / 4 * 1e-8));
  EXPECT_DOUBLE_EQ(detail::predict_wire_s(AutoShape::kAllgather, 1e6, link, 4), 6 * 50e-6 + 3 * 1e6 * 1e-8);
  EXPECT_DOUBLE_EQ(detail::predict_wire_s(AutoShape::kDenseRing, 4e7, link, 2), 2 * (50e-6 + 2e7 * 1e-8));
  EXPECT_EQ(detail::predict_wire_s(AutoShape::kDenseRing, 4e7, link, 1), 0.0);
}

TEST(AutoModel, WireHidesBehindTheCallersOverlapButComputeDoesNot) {
  const AutoSpec s = parse_auto_spec("auto:among=none|quant:bits=4,ef=1");
  const int64_t n = 1 << 22;
  // none: a 2 ms reduce pass, 16 MiB; quant: 4 ms encode, 1 ms decode, 2 MiB.
  const std::vector<CandidateCost> costs{{2e-3, 0, 4.0 * n}, {4e-3, 1e-3, 0.5 * n}};
  const LinkModel link{50e-6, 1.0 / 1e9};  // 8 Gbit/s
  const auto alone = detail::decide_auto(s, costs, link, n, 2, -1, 0.0);
  EXPECT_EQ(alone.choice, 1);  // no overlap: none's 1 + 16.9 ms lose to quant's 5 + 2.2 ms
  const auto hidden = detail::decide_auto(s, costs, link, n, 2, -1, 0.020);
  EXPECT_EQ(hidden.choice, 0);  // 20 ms of backward after the issue hide all of none's wire
  EXPECT_DOUBLE_EQ(hidden.predicted_s[0], 1e-3);
  EXPECT_DOUBLE_EQ(hidden.predicted_s[1], 4e-3 + 1e-3);
  const auto partly = detail::decide_auto(s, costs, link, n, 2, -1, 0.010);
  EXPECT_DOUBLE_EQ(partly.predicted_s[0],
                   1e-3 + detail::predict_wire_s(AutoShape::kDenseRing, 4.0 * n, link, 2) - 0.010);
}

TEST(AutoModel, ChoosesByTheLinkAsTheModelSays) {
  const AutoSpec s = parse_auto_spec("auto");
  const int64_t n = 1 << 22;  // 16 MiB of fp32
  const auto costs = default_costs(s, n);
  // Loopback-fast (40 GB/s): moving bytes costs less than encoding them.
  auto fast = detail::decide_auto(s, costs, LinkModel{10e-6, 1.0 / 40e9}, n, 2, -1);
  EXPECT_EQ(s.candidates[fast.choice].id, detail::CompressorId::kNone);
  // 1 Gbit/s: top-k's 1 % wins by far.
  auto slow = detail::decide_auto(s, costs, LinkModel{50e-6, 8.0 / 1e9}, n, 2, -1);
  EXPECT_EQ(s.candidates[slow.choice].id, detail::CompressorId::kTopk);
  for (size_t i = 0; i < costs.size(); ++i) {
    const auto shape = detail::auto_shape(s.candidates[i]);
    const double expected = detail::predict_compute_s(shape, costs[i], 2) +
                            detail::predict_wire_s(shape, costs[i].payload_bytes, LinkModel{50e-6, 8.0 / 1e9}, 2);
    EXPECT_DOUBLE_EQ(slow.predicted_s[i], expected) << i;
  }
  // The cap: top-k compresses ~130x; max_ratio=10 leaves it out, and quant 4 (8x) wins.
  const AutoSpec capped = parse_auto_spec("auto:max_ratio=10");
  auto c = detail::decide_auto(capped, costs, LinkModel{50e-6, 8.0 / 1e9}, n, 2, -1);
  EXPECT_EQ(capped.candidates[c.choice].family<detail::QuantParams>().bits, 4);
  EXPECT_LT(c.predicted_s[4], 0);
  EXPECT_NE(c.left_out[4].find("max_ratio=10"), std::string::npos) << c.left_out[4];
}

TEST(AutoModel, SmallKeysStayDenseOr16BitAndNearTiesGoToTheCurrentThenTheEarliest) {
  const AutoSpec s = parse_auto_spec("auto");
  const int64_t n = 1000;
  const auto costs = default_costs(s, n);
  auto d = detail::decide_auto(s, costs, LinkModel{50e-6, 8.0 / 1e9}, n, 2, -1);
  EXPECT_TRUE(d.choice == 0 || d.choice == 1) << d.choice;
  for (int i = 2; i < 5; ++i) EXPECT_LT(d.predicted_s[i], 0) << i;

  // Two candidates 5 % apart: the current one stays; 20 % apart: it changes.
  const AutoSpec two = parse_auto_spec("auto:among=none|bf16");
  std::vector<CandidateCost> near{{0.0, 0, 100}, {0.0, 0, 95}};
  const LinkModel link{0, 1e-3};  // wire time only, proportional to bytes
  EXPECT_EQ(detail::decide_auto(two, near, link, 1 << 20, 2, -1).choice, 0);  // the earlier, less lossy
  EXPECT_EQ(detail::decide_auto(two, near, link, 1 << 20, 2, 0).choice, 0);
  EXPECT_EQ(detail::decide_auto(two, near, link, 1 << 20, 2, 1).choice, 1);  // the current one stays
  std::vector<CandidateCost> far{{0.0, 0, 100}, {0.0, 0, 80}};
  EXPECT_EQ(detail::decide_auto(two, far, link, 1 << 20, 2, 0).choice, 1);
}

TEST(AutoRecord, RoundTripsAndRejectsOtherBytes) {
  AutoRecord r;
  r.spec_hash = 0xdeadbeef;
  r.choice = 3;
  r.next_review = 1234567890123ull;
  r.decided_at = 77;
  const auto bytes = r.serialize();
  const auto back = AutoRecord::parse(bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->spec_hash, r.spec_hash);
  EXPECT_EQ(back->choice, 3);
  EXPECT_EQ(back->next_review, r.next_review);
  EXPECT_EQ(back->decided_at, 77u);
  EXPECT_FALSE(AutoRecord::parse({}));
  auto bad = bytes;
  bad[0] ^= 1;
  EXPECT_FALSE(AutoRecord::parse(bad));
  EXPECT_FALSE(AutoRecord::parse(std::span(bytes).first(16)));
}

// ---- on ranks ----------------------------------------------------------------------

constexpr int64_t kBig = 1 << 16;
constexpr int64_t kSmall = 300;

// A rank's gradient for a step: rank- and step-dependent, with a heavy tail.
std::vector<float> gradient(int rank, int step, int64_t n, int salt) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 1000003 + step * 7919 + salt));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(static_cast<size_t>(n));
  for (auto& x : g) x = normal(rng) * (rng() % 50 == 0 ? 20.0f : 1.0f);
  return g;
}

std::string chosen(const Stats& s, const std::string& key) {
  for (const auto& c : s.auto_choices) {
    if (c.key == key) return c.chosen;
  }
  return "";
}

TEST(AutoOnRanks, EveryRankChoosesTheSameWhateverItsOwnTimings) {
  constexpr int kRanks = 3;
  std::vector<std::vector<std::string>> choices(kRanks);  // per rank: "step key choice" lines
  std::vector<std::vector<float>> results(kRanks);
  testing::run_ranks(kRanks, [&](Communicator& comm) {
    const int r = comm.rank();
    // Skewed: rank r's compute costs are 1, 30 or 900 times what it measured, and
    // each rank believes a different link. Alone, they would choose differently.
    const LinkModel link{(1 + 20 * r) * 1e-6, r == 0 ? 1.0 / 40e9 : (r == 1 ? 8.0 / 1e9 : 8.0 / 10e9)};
    comm.impl().set_auto_test_override(std::pow(30.0, r), link);
    CompressOptions big, small;
    big.compressor = small.compressor = "auto:review=4";
    big.key = "big";
    small.key = "small";
    for (int step = 0; step < 12; ++step) {
      auto a = gradient(r, step, kBig, 1);
      auto b = gradient(r, step, kSmall, 2);
      comm.allreduce(TensorView::of(a.data(), kBig), ReduceOp::kAvg, big);
      comm.allreduce(TensorView::of(b.data(), kSmall), ReduceOp::kAvg, small);
      const Stats s = comm.stats();
      choices[r].push_back(fmt::format("{} big {} small {}", step, chosen(s, "big"), chosen(s, "small")));
      results[r].insert(results[r].end(), a.begin(), a.end());
      results[r].insert(results[r].end(), b.begin(), b.end());
    }
  });
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_EQ(choices[r], choices[0]) << "rank " << r;
    ASSERT_EQ(results[r].size(), results[0].size());
    EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), results[0].size() * sizeof(float)), 0) << r;
  }
  EXPECT_NE(choices[0].back().find("big "), std::string::npos);
}

TEST(AutoOnRanks, ASwitchMidRunKeepsReplicasIdenticalAndFlushesTheResidual) {
  constexpr int kRanks = 2, kSteps = 30;
  std::vector<std::vector<std::string>> seen(kRanks);
  std::vector<std::vector<float>> results(kRanks);
  std::vector<double> input_sum(kRanks), output_sum(kRanks);
  testing::run_ranks(kRanks, [&](Communicator& comm) {
    const int r = comm.rank();
    const LinkModel fast{1e-6, 1.0 / 100e9}, slow{100e-6, 8.0 / 100e6};  // 100 GB/s; 100 Mbit/s
    CompressOptions o;
    o.compressor = "auto:review=5,among=none|quant:bits=4,ef=1";
    o.key = "w";
    std::vector<double> total(kBig, 0.0), sent(kBig, 0.0);
    for (int step = 0; step < kSteps; ++step) {
      if (step == 0) comm.impl().set_auto_test_override(1.0, fast);
      if (step == 8) comm.impl().set_auto_test_override(1.0, slow);   // reviewed at step 10
      if (step == 18) comm.impl().set_auto_test_override(1.0, fast);  // reviewed at step 20
      auto g = gradient(r, step, kBig, 3);
      for (int q = 0; q < kRanks; ++q) {
        const auto gq = gradient(q, step, kBig, 3);
        for (int64_t i = 0; i < kBig; ++i) total[i] += gq[i];
      }
      comm.allreduce(TensorView::of(g.data(), kBig), ReduceOp::kSum, o);
      for (int64_t i = 0; i < kBig; ++i) sent[i] += g[i];
      seen[r].push_back(chosen(comm.stats(), "w"));
      results[r].insert(results[r].end(), g.begin(), g.end());
    }
    // What every rank gave was sent in full: quant's residual was flushed into the
    // first dense call after the switch back, so the sums match up to fp32 rounding.
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < kBig; ++i) {
      worst = std::max(worst, std::abs(sent[i] - total[i]));
      scale = std::max(scale, std::abs(total[i]));
    }
    input_sum[r] = scale;
    output_sum[r] = worst;
    EXPECT_TRUE(detail::residual_view(comm, "w").empty());
  });
  EXPECT_EQ(seen[0], seen[1]);
  EXPECT_EQ(seen[0][5], "none");
  EXPECT_EQ(seen[0][15].rfind("quant:bits=4", 0), 0u) << seen[0][15];
  EXPECT_EQ(seen[0][25], "none");
  EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)), 0);
  for (int r = 0; r < kRanks; ++r) EXPECT_LT(output_sum[r], 1e-4 * input_sum[r]) << r;
}

TEST(AutoOnRanks, SaveAndLoadCarryTheChoiceAndTheResidual) {
  constexpr int kRanks = 2;
  std::vector<std::vector<float>> first(kRanks), again(kRanks);
  std::vector<std::vector<uint8_t>> saved(kRanks);
  testing::run_ranks(kRanks, [&](Communicator& comm) {
    const int r = comm.rank();
    comm.impl().set_auto_test_override(1.0, LinkModel{100e-6, 8.0 / 100e6});  // 100 Mbit/s: compress
    // Two candidates far apart at this link (none ~21 ms a call, quant ~3 ms plus a few of
    // compute even under sanitizers): the reviews after the load decide as those before it
    // did, whatever the clocks say. (Near-ties are settled by measured times, which no
    // saved state can replay.)
    CompressOptions o;
    o.compressor = "auto:review=4,among=none|quant:bits=4,ef=1";
    o.key = "w";
    auto run = [&](int from, int to, std::vector<float>& out) {
      for (int step = from; step < to; ++step) {
        auto g = gradient(r, step, kBig, 4);
        comm.allreduce(TensorView::of(g.data(), kBig), ReduceOp::kAvg, o);
        out.insert(out.end(), g.begin(), g.end());
      }
    };
    std::vector<float> warm;
    run(0, 6, warm);
    EXPECT_FALSE(detail::residual_view(comm, "w").empty());  // a compressed choice with error feedback
    EXPECT_TRUE(comm.plan_allreduce(kBig, o).compressed);
    saved[r] = comm.save_state();
    run(6, 13, first[r]);  // through a review at step 8 and 12
    comm.load_state(saved[r]);
    run(6, 13, again[r]);
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(first[r].size(), again[r].size());
    EXPECT_EQ(std::memcmp(first[r].data(), again[r].data(), first[r].size() * sizeof(float)), 0) << r;
  }
  // A fresh communicator that loads the state takes up the saved choice at once.
  testing::run_ranks(kRanks, [&](Communicator& comm) {
    comm.load_state(saved[comm.rank()]);
    CompressOptions o;
    o.compressor = "auto:review=4,among=none|quant:bits=4,ef=1";
    o.key = "w";
    EXPECT_TRUE(comm.plan_allreduce(kBig, o).compressed);
    EXPECT_FALSE(detail::residual_view(comm, "w").empty());
  });
}

TEST(AutoOnRanks, BadUsesAreRefusedAtIssueAndDifferentSpecsAreAMismatch) {
  testing::run_ranks(2, [](Communicator& comm) {
    std::vector<float> a(100, 1.0f), out(50);
    std::vector<int32_t> ints(100, 1);
    CompressOptions o;
    o.compressor = "auto";
    EXPECT_THROW(comm.allreduce(TensorView::of(a.data(), 100), ReduceOp::kSum, o), InvalidArgument);  // no key
    o.key = "k";
    EXPECT_THROW(comm.allreduce(TensorView::of(ints.data(), 100), ReduceOp::kSum, o), InvalidArgument);
    EXPECT_THROW(comm.allreduce(TensorView::of(a.data(), 100), ReduceOp::kMax, o), InvalidArgument);
    EXPECT_THROW(comm.reduce_scatter(TensorView::of(a.data(), 100), TensorView::of(out.data(), 50), ReduceOp::kSum, o),
                 InvalidArgument);
    o.compressor = "auto:among=none|quant:bits=4";
    EXPECT_THROW(comm.allreduce(TensorView::of(a.data(), 100), ReduceOp::kSum, o), InvalidArgument);
    // Still usable: every refusal left no state behind.
    o.compressor = "auto";
    comm.allreduce(TensorView::of(a.data(), 100), ReduceOp::kSum, o);
    EXPECT_EQ(a[0], 2.0f);
    CompressOptions empty = o;
    empty.key = "empty";
    comm.allreduce(TensorView::of(a.data(), 0), ReduceOp::kSum, empty);  // nothing to choose for
    comm.allreduce(TensorView::of(a.data(), 100), ReduceOp::kSum, o);
    EXPECT_EQ(a[0], 4.0f);
  });
  std::vector<std::string> errors(2);
  (void)testing::run_ranks_collect(2, [&](Communicator& comm) {
    std::vector<float> a(100, 1.0f);
    CompressOptions o;
    o.compressor = comm.rank() == 0 ? "auto:review=5" : "auto:review=6";
    o.key = "k";
    try {
      comm.allreduce(TensorView::of(a.data(), 100), ReduceOp::kSum, o);
    } catch (const MismatchError& e) {
      errors[comm.rank()] = e.what();
    }
  });
  for (const auto& e : errors) EXPECT_NE(e.find("auto-review"), std::string::npos) << e;
}


// Overlap runs from a call's issue to when the application first needs it: its own wait,
// or Work::needed() while a helper thread waits on its behalf (the DDP hook's completer);
// a helper's wait alone does not count. Each rank computes `gap` between issue and need
// (or at once) for three keys; the review 10 calls in reports the least of the ranks'
// means.
TEST(AutoOnRanks, OverlapRunsFromIssueToWhenTheApplicationNeedsTheCall) {
  constexpr int kRanks = 2, kCalls = 11;  // reviews at the first call and 10 calls later
  const auto gap = std::chrono::milliseconds(60 * testing::time_scale());
  const double gap_s = std::chrono::duration<double>(gap).count();
  std::vector<std::map<std::string, double>> overlap(kRanks);
  testing::run_ranks(kRanks, [&](Communicator& comm) {
    const int r = comm.rank();
    comm.impl().set_auto_test_override(1.0, LinkModel{1e-6, 1.0 / 100e9});
    auto options = [](const char* key) {
      CompressOptions o;
      o.compressor = "auto:among=none|quant:bits=8,ef=1";
      o.key = key;
      return o;
    };
    // The helper waits at once, as a thread completing a framework's future would.
    auto helper_waits = [](Work& work) { return std::thread([&work] { work.wait(Waiter::kHelper); }); };
    for (int step = 0; step < kCalls; ++step) {
      auto a = gradient(r, step, kBig, 5), b = gradient(r, step, kBig, 6), c = gradient(r, step, kBig, 7);
      auto own = comm.allreduce_async(TensorView::of(a.data(), kBig), ReduceOp::kSum, options("own_wait"));
      std::this_thread::sleep_for(gap);
      own->wait();

      auto later = comm.allreduce_async(TensorView::of(b.data(), kBig), ReduceOp::kSum, options("needed_later"));
      std::thread helper = helper_waits(*later);
      std::this_thread::sleep_for(gap);
      later->needed();
      helper.join();

      auto at_once = comm.allreduce_async(TensorView::of(c.data(), kBig), ReduceOp::kSum, options("needed_at_once"));
      at_once->needed();
      std::thread helper2 = helper_waits(*at_once);
      std::this_thread::sleep_for(gap);  // the helper's wait ends long before: it does not count
      helper2.join();
      at_once->wait();  // the application's own wait after needed(): needed() came first
    }
    for (const auto& ch : comm.stats().auto_choices) overlap[r][ch.key] = ch.overlap_s;
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(overlap[r].size(), 3u) << r;
    EXPECT_EQ(overlap[r], overlap[0]) << r;  // every rank reports the reduced value
  }
  EXPECT_GE(overlap[0]["own_wait"], 0.9 * gap_s);
  EXPECT_GE(overlap[0]["needed_later"], 0.9 * gap_s);
  EXPECT_LT(overlap[0]["needed_at_once"], 0.5 * gap_s);
}

}  // namespace
}  // namespace gradcomm
