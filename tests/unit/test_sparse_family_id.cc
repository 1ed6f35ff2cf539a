// A sparse payload carries the id of the family that wrote it (issue 32), not top-k's
// whatever the family: a random-k payload says random-k, a sparse-selection family
// other than top-k puts its own id on the wire through both sparse collectives, and a
// payload whose id disagrees with the call is refused with a CorruptPayload that names
// both families and whose payload it was, never decoded into wrong numbers.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "compressors/codec.h"
#include "compressors/family.h"
#include "compressors/payload.h"
#include "compressors/sparse/sparse.h"
#include "compressors/spec.h"
#include "test_util.h"
#include "transport/transport.h"

namespace gradcomm {
namespace {

using detail::CompressorId;
using detail::CompressorSpec;
using detail::PayloadHeader;

// ---- the codec: the header says who wrote it ---------------------------------------

detail::SparseVector example() {
  detail::SparseVector v;
  v.indices = {1, 5, 70};
  v.values = {0.5f, -2.0f, 3.0f};
  return v;
}

std::string corrupt_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const CorruptPayload& e) {
    return e.what();
  }
  ADD_FAILURE() << "no CorruptPayload";
  return "";
}

TEST(SparseFamilyId, RandomkPayloadSaysRandomk) {
  const auto bytes = detail::encode_sparse(CompressorId::kRandomk, 100, example(), detail::SparseFormat{});
  EXPECT_EQ(bytes[5], static_cast<uint8_t>(CompressorId::kRandomk));
  const detail::SparseVector back = detail::decode_sparse(CompressorId::kRandomk, bytes, 100);
  EXPECT_EQ(back.indices, example().indices);
  EXPECT_EQ(back.values, example().values);
}

TEST(SparseFamilyId, PayloadOfAnotherFamilyIsRefusedByName) {
  const auto bytes = detail::encode_sparse(CompressorId::kRandomk, 100, example(), detail::SparseFormat{});
  std::vector<float> out(100, 1.0f);
  const std::string one = corrupt_message([&] { detail::decode_add_sparse(CompressorId::kTopk, bytes, 100, out.data()); });
  EXPECT_NE(one.find("randomk payload (id 4) where topk (id 3) was expected"), std::string::npos) << one;
  EXPECT_EQ(out, std::vector<float>(100, 1.0f)) << "written before the id was checked";
  // Among several payloads, the message says which one.
  const auto good = detail::encode_sparse(CompressorId::kTopk, 100, example(), detail::SparseFormat{});
  const std::vector<std::span<const uint8_t>> spans = {good, bytes};
  const std::string sum = corrupt_message([&] { detail::decode_sum_sparse(CompressorId::kTopk, spans, 100, out.data()); });
  EXPECT_NE(sum.find("payload 1 of 2"), std::string::npos) << sum;
  EXPECT_NE(sum.find("randomk payload (id 4) where topk (id 3) was expected"), std::string::npos) << sum;
  EXPECT_EQ(out, std::vector<float>(100, 1.0f));
}

// ---- the collectives: a second sparse-selection family --------------------------------

// Top-k's collective under another name and id, registered from outside the tree as
// a new family would be: what its payloads carry is its own id.
constexpr auto kPickId = static_cast<CompressorId>(202);
constexpr std::string_view kPickKeys[] = {"ratio", "k", "algo", "ef", "min_numel", "warmup", "seed", "values"};

struct PickParams final : detail::FamilyParams {
  static constexpr const char* kName = "pick's keys";
  double ratio = 0;
  int64_t k = 0;
  detail::SparseAlgo algo = detail::SparseAlgo::kAllgather;
};
std::shared_ptr<const detail::FamilyParams> parse_pick(const detail::SpecReader& r, CompressorSpec& /*common*/) {
  auto p = std::make_shared<PickParams>();
  r.ratio_or_k(p->ratio, p->k);
  p->algo = r.choice<detail::SparseAlgo>(
      "algo", {{"allgather", detail::SparseAlgo::kAllgather}, {"reduce_scatter", detail::SparseAlgo::kReduceScatter}},
      detail::SparseAlgo::kAllgather);
  return p;
}
std::string canonical_pick(const CompressorSpec& s) {
  const auto& p = s.family<PickParams>();
  return fmt::format("{},algo={},", detail::ratio_or_k_text(p.ratio, p.k),
                     p.algo == detail::SparseAlgo::kAllgather ? "allgather" : "reduce_scatter");
}
detail::SparseShape pick_shape(const CompressorSpec& s) {
  const auto& p = s.family<PickParams>();
  detail::SparseShape shape;
  shape.ratio = p.ratio;
  shape.k = p.k;
  shape.format = detail::SparseFormat{s.values, false};
  shape.algo = p.algo;
  return shape;
}
// The exact magnitude selection, as top-k's (sparse.h), with the contract's fold and zeroing.
detail::SparseVector pick_select(const CompressorSpec& /*spec*/, float* data, float* residual, int64_t n,
                                 int64_t count, const detail::PhiloxStream& rng) {
  if (residual != nullptr) return detail::topk_select_fold(data, residual, n, count, detail::TopkSelect::kExact, rng);
  return detail::topk_select_accumulate(data, nullptr, n, count, detail::TopkSelect::kExact, rng);
}
constexpr detail::SparseOps kPickOps{.shape = pick_shape, .select = pick_select};
constexpr detail::Family kPickFamily{.id = kPickId,
                                     .name = "pick",
                                     .keys = kPickKeys,
                                     .ef_default = false,
                                     .values_default = detail::ValueType::kFp32,
                                     .collective = detail::Collective::kSparseSelection,
                                     .parse = parse_pick,
                                     .canonical = canonical_pick,
                                     .sparse = &kPickOps};

void register_once() {
  static const bool done = (detail::register_family(kPickFamily), true);
  (void)done;
}

// The in-process transport, with a tap on the data messages that start with a payload
// header: it records their compressor id and, when told to, sends a copy carrying
// another id instead.
class PayloadIdTap final : public detail::Transport {
 public:
  PayloadIdTap(std::unique_ptr<detail::Transport> inner, std::vector<CompressorId>* seen,
               std::optional<CompressorId> rewrite)
      : inner_(std::move(inner)), seen_(seen), rewrite_(rewrite) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* name() const override { return inner_->name(); }
  detail::RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    const auto* p = static_cast<const uint8_t*>(data);
    uint32_t magic = 0;
    if (bytes >= PayloadHeader::kBytes) std::memcpy(&magic, p, 4);
    if (detail::tag_kind(tag) == detail::TagKind::kData && magic == PayloadHeader::kMagic) {
      seen_->push_back(static_cast<CompressorId>(p[5]));
      if (rewrite_) {
        copies_.emplace_back(p, p + bytes);  // kept until the transport is gone
        copies_.back()[5] = static_cast<uint8_t>(*rewrite_);
        return inner_->isend(peer, tag, copies_.back().data(), bytes);
      }
    }
    return inner_->isend(peer, tag, data, bytes);
  }
  detail::RequestPtr irecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    return inner_->irecv(peer, tag, data, bytes);
  }
  bool progress() override { return inner_->progress(); }
  void wait_for_event(std::chrono::microseconds max_wait) override { inner_->wait_for_event(max_wait); }
  void interrupt() override { inner_->interrupt(); }
  void send_abort(const detail::ControlMessage& message) override { inner_->send_abort(message); }
  std::optional<detail::ControlMessage> poll_abort() override { return inner_->poll_abort(); }
  void abandon_pending(std::chrono::milliseconds grace) override { inner_->abandon_pending(grace); }

 private:
  std::unique_ptr<detail::Transport> inner_;
  std::vector<CompressorId>* seen_;
  std::optional<CompressorId> rewrite_;
  std::deque<std::vector<uint8_t>> copies_;
};

struct Outcome {
  std::vector<std::vector<CompressorId>> seen;  // per rank: the ids its payloads carried
  std::vector<std::exception_ptr> errors;
  std::vector<std::vector<float>> in, out;      // per rank: the tensor before and after
};

// Each of n ranks allreduces 1000 elements once with `spec`; rank `liar` (if any)
// sends its payloads with `lie` for an id.
Outcome allreduce(int n, const std::string& spec, int liar = -1, CompressorId lie = CompressorId::kTopk) {
  register_once();
  Outcome run;
  run.seen.resize(n);
  run.in.resize(n);
  run.out.resize(n);
  for (int r = 0; r < n; ++r) {
    run.in[r].resize(1000);
    for (size_t i = 0; i < 1000; ++i) run.in[r][i] = static_cast<float>((i * 37 + r * 11) % 101) - 50.0f;
    run.out[r] = run.in[r];
  }
  run.errors = testing::run_transport_threads(n, [&](int rank, std::unique_ptr<detail::Transport> t) {
    auto tap = std::make_unique<PayloadIdTap>(std::move(t), &run.seen[rank],
                                              rank == liar ? std::optional(lie) : std::nullopt);
    Communicator comm(std::make_unique<detail::CommunicatorImpl>(std::move(tap), std::chrono::seconds(30)));
    comm.allreduce(TensorView::of(run.out[rank].data(), 1000), ReduceOp::kSum, CompressOptions{spec, "x", nullptr});
  });
  return run;
}

constexpr const char* kBothAlgos[] = {"pick:ratio=0.05,algo=allgather", "pick:ratio=0.05,algo=reduce_scatter"};

TEST(SparseFamilyId, BothSparseCollectivesSendTheCallersId) {
  for (const char* spec : kBothAlgos) {
    SCOPED_TRACE(spec);
    const Outcome run = allreduce(3, spec);
    for (int r = 0; r < 3; ++r) {
      if (run.errors[r]) std::rethrow_exception(run.errors[r]);
      ASSERT_FALSE(run.seen[r].empty()) << "rank " << r << " sent no payload";
      for (CompressorId id : run.seen[r]) EXPECT_EQ(id, kPickId) << "rank " << r << " sent id " << int(id);
    }
  }
}

// Two ranks, rank 1 lying: rank 0 is the one that finds out (in the allgather, rank 1's
// payload is its payload 1; in the reduce-scatter, rank 1's payload for region 0), and
// its tensor is left as it was.
TEST(SparseFamilyId, PayloadWithAnotherIdIsRefusedSayingWhose) {
  const std::string where[] = {"payload 1 of 2", "rank 1's payload for region 0"};
  for (int algo = 0; algo < 2; ++algo) {
    SCOPED_TRACE(kBothAlgos[algo]);
    const Outcome run = allreduce(2, kBothAlgos[algo], /*liar=*/1, CompressorId::kTopk);
    ASSERT_TRUE(run.errors[0]) << "rank 0 accepted a top-k payload for pick";
    try {
      std::rethrow_exception(run.errors[0]);
    } catch (const CorruptPayload& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("topk payload (id 3) where pick (id 202) was expected"), std::string::npos) << what;
      EXPECT_NE(what.find(where[algo]), std::string::npos) << what;
    } catch (const Error& e) {
      FAIL() << "rank 0: " << error_code_name(e.code()) << ": " << e.what();
    }
    EXPECT_EQ(run.out[0], run.in[0]) << "rank 0's tensor was written";
  }
}

}  // namespace
}  // namespace gradcomm
