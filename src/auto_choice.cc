#include "auto_choice.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "bytes.h"
#include "call.h"
#include "collectives/collectives.h"
#include "compression.h"
#include "compressors/codec.h"
#include "compressors/family.h"
#include "compressors/philox.h"
#include "compressors/sparse/sparse.h"
#include "compressors/auto_spec.h"
#include "compressors/spec.h"
#include "env.h"
#include "hierarchy.h"
#include "logging.h"
#include "op.h"
#include "reduce.h"
#include "wire.h"

namespace gradcomm::detail {

// ---- the model -------------------------------------------------------------------------

AutoShape auto_shape(const CompressorSpec& spec) {
  switch (family_of(spec.id).collective) {
    case Collective::kDense:
      return AutoShape::kDenseRing;
    case Collective::kSparseSelection:
      return AutoShape::kAllgather;
    default:
      return AutoShape::kCodecRing;  // the only other kind parse_auto_spec admits
  }
}

double predict_compute_s(AutoShape shape, const CandidateCost& cost, int ranks) {
  if (ranks <= 1) return 0.0;
  const double n = ranks;
  switch (shape) {
    case AutoShape::kDenseRing:
      return cost.encode_s * (n - 1) / n;
    case AutoShape::kCodecRing:
      return cost.encode_s + cost.decode_s * 2 * (n - 1) / n;
    case AutoShape::kAllgather:
      return cost.encode_s + cost.decode_s * n;
  }
  return 0.0;
}

double predict_wire_s(AutoShape shape, double payload_bytes, const LinkModel& link, int ranks) {
  if (ranks <= 1) return 0.0;
  const double n = ranks;
  const double spb = link.seconds_per_byte;
  switch (shape) {
    case AutoShape::kDenseRing:
      if (payload_bytes <= static_cast<double>(small_allreduce_bytes())) {  // recursive doubling
        return std::ceil(std::log2(n)) * (link.alpha_s + payload_bytes * spb);
      }
      [[fallthrough]];
    case AutoShape::kCodecRing:
      return 2 * (n - 1) * (link.alpha_s + payload_bytes / n * spb);
    case AutoShape::kAllgather:
      return 2 * (n - 1) * link.alpha_s + (n - 1) * payload_bytes * spb;
  }
  return 0.0;
}

AutoDecision decide_auto(const AutoSpec& spec, std::span<const CandidateCost> costs, const LinkModel& link,
                         int64_t numel, int ranks, int current, double overlap_s) {
  AutoDecision d;
  const size_t count = spec.candidates.size();
  d.predicted_s.assign(count, -1.0);
  d.left_out.assign(count, "");
  const double dense_bytes = 4.0 * static_cast<double>(numel);
  int best = -1;
  for (size_t i = 0; i < count; ++i) {
    const CompressorSpec& c = spec.candidates[i];
    const AutoShape shape = auto_shape(c);
    const double bytes = costs[i].payload_bytes;
    if (numel < spec.small && shape != AutoShape::kDenseRing && auto_candidate_bits(c) < 16) {
      d.left_out[i] = fmt::format("small key (< {} elements): 16 bits or more", spec.small);
      continue;
    }
    if (spec.max_ratio > 0 && bytes > 0 && dense_bytes / bytes > spec.max_ratio) {
      d.left_out[i] = fmt::format("compresses {:.0f}x, above max_ratio={}", dense_bytes / bytes, spec.max_ratio);
      continue;
    }
    d.predicted_s[i] = predict_compute_s(shape, costs[i], ranks) +
                       std::max(0.0, predict_wire_s(shape, bytes, link, ranks) - overlap_s);
    if (best < 0 || d.predicted_s[i] < d.predicted_s[best]) best = static_cast<int>(i);
  }
  if (best < 0) {  // nothing priced (every candidate left out): the first, as listed
    d.choice = 0;
    return d;
  }
  // Within 10 % of the best, predictions do not separate the candidates (the clocks
  // behind them are noisier than that): the current choice stays, else the earliest,
  // i.e. the least lossy as the candidates are listed.
  const double near = d.predicted_s[best] / 0.9;
  if (current >= 0 && static_cast<size_t>(current) < count && d.predicted_s[current] >= 0 &&
      d.predicted_s[current] <= near) {
    d.choice = current;
    return d;
  }
  for (size_t i = 0; i < count; ++i) {
    if (d.predicted_s[i] >= 0 && d.predicted_s[i] <= near) {
      d.choice = static_cast<int>(i);
      break;
    }
  }
  return d;
}

// ---- the record ------------------------------------------------------------------------

std::vector<uint8_t> AutoRecord::serialize() const {
  std::vector<uint8_t> out(kBytes, 0);
  put_u32(out.data(), kMagic);
  put_u32(out.data() + 4, spec_hash);
  put_u32(out.data() + 8, static_cast<uint32_t>(choice));
  // bytes 12..15 reserved
  put_u64(out.data() + 16, next_review);
  put_u64(out.data() + 24, decided_at);
  return out;
}

std::optional<AutoRecord> AutoRecord::parse(std::span<const uint8_t> bytes) {
  if (bytes.size() != kBytes || get_u32(bytes.data()) != kMagic) return std::nullopt;
  AutoRecord r;
  r.spec_hash = get_u32(bytes.data() + 4);
  r.choice = static_cast<int32_t>(get_u32(bytes.data() + 8));
  r.next_review = get_u64(bytes.data() + 16);
  r.decided_at = get_u64(bytes.data() + 24);
  return r;
}

// ---- on the engine ---------------------------------------------------------------------

namespace {

const CompressorSpec kDenseSpec{};  // id none

// A review's reduced values before the candidates': α, 1/β, -drift, -observations, -overlap.
constexpr size_t kReviewHead = 5;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The least of two timed runs of fn (the first also warms caches and allocations).
template <class Fn>
double time_min2(Fn&& fn) {
  double best = 0;
  for (int i = 0; i < 2; ++i) {
    const auto start = Clock::now();
    fn();
    const double t = seconds_since(start);
    best = i == 0 ? t : std::min(best, t);
  }
  return best;
}

// Units of the review call's exchanges, apart from one another.
constexpr uint32_t kProbeSmallUnits = 0;
constexpr uint32_t kProbeLargeUnits = 1u << 24;
constexpr uint32_t kReduceUnits = 2u << 24;
constexpr uint32_t kRelinkUnits = 3u << 24;
constexpr int kProbeSmallRounds = 5;
constexpr int64_t kProbeLargeBytes = int64_t{2} << 20;
constexpr double kDriftBand = 2.0;
constexpr uint64_t kFirstReview = 10;  // steps after a key's first choice to its second
constexpr double kDriftCalls = 16;  // calls observed (on every rank) before the drift is judged

}  // namespace

// Where compression happens (hierarchy.h): across the whole job, or, over two levels,
// across the nodes on each rank's piece, about numel / L elements, among one rank of every
// node, every local rank's group at once on the node's link. The dense phases inside the
// nodes are the same for every candidate, so the choice is priced on that level alone:
// its ranks, its piece, and a link probed there.
struct PricedLevel {
  int ranks = 1;
  int64_t numel = 0;
  std::vector<int> across;  // two levels: the first piece's owners (a View of them); else empty
};

namespace {

PricedLevel priced_level(const Op& op, int64_t numel) {
  if (!op.two_levels()) return {op.size(), numel, {}};
  const NodeMap& nodes = op.nodes();
  const int per_node = static_cast<int>(nodes.members(0).size());
  bool even = true;
  for (int n = 0; n < nodes.nodes(); ++n) even &= static_cast<int>(nodes.members(n).size()) == per_node;
  // Nodes of one size: each rank's piece is its segment, its group its local rank on every
  // node, the same for all its members, so the groups probe at once. Uneven nodes cut their
  // pieces differently: the probe runs over the whole job (both levels) instead.
  if (!even) return {nodes.nodes(), numel / std::max(nodes.largest_node(), 1), {}};
  const int local = nodes.local_rank(op.rank());
  std::vector<int> across;
  for (int n = 0; n < nodes.nodes(); ++n) across.push_back(nodes.members(n)[static_cast<size_t>(local)]);
  const std::vector<int64_t> segments = ring_segments(numel, per_node, 1);
  return {nodes.nodes(), segments[static_cast<size_t>(local) + 1] - segments[static_cast<size_t>(local)], across};
}

}  // namespace

std::vector<CandidateCost> AutoChooser::measure(const AutoSpec& spec, const Call& call, HostCompression& compression,
                                                int rank, int64_t numel) const {
  const int64_t n = numel;
  const auto* grad = static_cast<const float*>(call.tensor.data);
  std::vector<float> work(grad, grad + n), other(grad, grad + n);
  const double pass_s = time_min2([&] { reduce_inplace(work.data(), other.data(), n, DType::kFloat32, ReduceOp::kSum); });
  const PhiloxStream rng{0, philox_stream_id(call.key_hash, 0, rank)};
  std::vector<CandidateCost> costs;
  for (const CompressorSpec& c : spec.candidates) {
    CandidateCost cost;
    switch (auto_shape(c)) {
      case AutoShape::kDenseRing:
        cost.encode_s = pass_s;
        cost.payload_bytes = 4.0 * static_cast<double>(n);
        break;
      case AutoShape::kCodecRing: {
        const DenseCodec& codec = compression.codec(c);
        std::vector<uint8_t> payload(codec.encoded_bytes(n));
        cost.encode_s = time_min2([&] { codec.encode(grad, n, payload.data(), rng, 0); });
        cost.decode_s = time_min2([&] { codec.decode_add(payload, n, work.data()); });
        cost.payload_bytes = static_cast<double>(payload.size());
        break;
      }
      case AutoShape::kAllgather: {
        const SparseOps& ops = sparse_ops(c);
        const SparseShape shape = ops.shape(c);
        const int64_t k = selection_count(shape.ratio, shape.k, n);
        std::vector<uint8_t> payload;
        cost.encode_s = time_min2([&] {
          // Without a residual a selection only reads the data (SparseOps::select).
          const SparseVector selected = ops.select(c, const_cast<float*>(grad), nullptr, n, k, rng);
          payload = encode_sparse(c.id, n, selected, shape.format);
        });
        const std::span<const uint8_t> one(payload);
        cost.decode_s = time_min2([&] { decode_sum_sparse(c.id, std::span(&one, 1), n, work.data()); });
        cost.payload_bytes = static_cast<double>(payload.size());
        break;
      }
    }
    if (c.ef) cost.encode_s += pass_s;  // the residual's fold
    cost.encode_s *= test_compute_scale_;
    cost.decode_s *= test_compute_scale_;
    costs.push_back(cost);
  }
  return costs;
}

LinkModel AutoChooser::probe_level(Op& op, const PricedLevel& level) const {
  if (level.across.empty()) return probe(op);
  const Op::View across(op, level.across, 0);  // every local rank's group at once, as the calls run
  return probe(op);
}

LinkModel AutoChooser::probe(Op& op) const {
  const int ranks = op.size();
  double small[kProbeSmallRounds];
  for (int i = 0; i < kProbeSmallRounds; ++i) {
    double x = 1.0;
    const auto start = Clock::now();
    dense_allreduce(op, &x, 1, DType::kFloat64, ReduceOp::kMax, kProbeSmallUnits + static_cast<uint32_t>(i) * 64);
    small[i] = seconds_since(start);
  }
  std::sort(small, small + kProbeSmallRounds);
  LinkModel link;
  link.alpha_s = small[kProbeSmallRounds / 2] / std::max(1.0, std::ceil(std::log2(static_cast<double>(ranks))));
  std::vector<float> big(static_cast<size_t>(kProbeLargeBytes / 4), 1.0f);
  double large = 0;
  for (int i = 0; i < 2; ++i) {
    const auto start = Clock::now();
    dense_allreduce(op, big.data(), static_cast<int64_t>(big.size()), DType::kFloat32, ReduceOp::kMax,
                    kProbeLargeUnits + static_cast<uint32_t>(i) * (1u << 20));
    const double t = seconds_since(start);
    large = i == 0 ? t : std::min(large, t);
  }
  // The ring: 2(N-1) steps of (α + B/N at β).
  const double steps = 2.0 * (ranks - 1);
  const double per_step_bytes = static_cast<double>(kProbeLargeBytes) / ranks;
  link.seconds_per_byte = std::max(1e-12, (large / steps - link.alpha_s) / per_step_bytes);
  return link;
}

WireHeader AutoChooser::review_header(const Call& call, uint64_t seq) const {
  WireHeader header;
  header.op = OpKind::kAllreduce;
  header.dtype = DType::kFloat64;
  header.reduce_op = ReduceOp::kMax;
  header.numel = static_cast<int64_t>(kReviewHead + 3 * call.auto_spec->candidates.size());
  header.seq = seq;
  header.compressor = "auto-review";
  header.compressor_hash = fnv1a32(header.compressor);
  header.fused_digest = call.auto_spec->hash;  // ranks must review with the same auto spec
  header.step = call.key->step;
  return header;
}

void AutoChooser::review(Op& op, HostCompression& compression, Call& call) {
  AutoRecord record = record_of(call);
  const AutoSpec& spec = *call.auto_spec;
  const uint32_t spec_hash = spec.hash;
  AutoKeyState& mine = state_of(*call.key);
  const bool measure_now = mine.costs.empty() || mine.spec_hash != spec_hash || mine.numel != call.tensor.numel ||
                           mine.generation != measure_generation_;
  const size_t count = spec.candidates.size();
  // [the head (kReviewHead), then per candidate: encode, decode, payload bytes]
  std::vector<double> v(kReviewHead + 3 * count);
  const bool probe_now = !link_known_ && !test_link_;
  const double drift = drift_count_ > 0 ? std::exp(drift_log_sum_ / static_cast<double>(drift_count_)) : 1.0;
  const double overlap_mean =
      mine.overlap_count > 0 ? mine.overlap_sum_s / static_cast<double>(mine.overlap_count) : 0.0;
  bool relinked = false;
  // Inside the review's Op: a failure here reaches the other ranks as any call's does.
  const PricedLevel level = priced_level(op, call.tensor.numel);
  mine.level_ranks = level.ranks;
  if (measure_now) {
    mine.costs = measure(spec, call, compression, op.rank(), level.numel);
    mine.spec_hash = spec_hash;
    mine.numel = call.tensor.numel;
    mine.generation = measure_generation_;
  }
  for (size_t i = 0; i < count; ++i) {
    v[kReviewHead + 3 * i] = mine.costs[i].encode_s;
    v[kReviewHead + 3 * i + 1] = mine.costs[i].decode_s;
    v[kReviewHead + 3 * i + 2] = mine.costs[i].payload_bytes;
  }
  LinkModel link = test_link_ ? *test_link_ : link_;
  if (probe_now) link = probe_level(op, level);
  v[0] = link.alpha_s;
  v[1] = link.seconds_per_byte;
  v[2] = -drift;
  v[3] = -static_cast<double>(drift_count_);
  v[4] = -overlap_mean;
  dense_allreduce(op, v.data(), static_cast<int64_t>(v.size()), DType::kFloat64, ReduceOp::kMax, kReduceUnits);
  // Everything below reads reduced values only, so every rank takes the same branch.
  // The drift (the least drifted rank's) is judged once enough calls were seen since
  // the last judgement: the first judgement after a probe is the baseline; two in a
  // row more than 2x away from it mean the rates moved: the link is probed again.
  const double shared_drift = -v[2];
  const bool judged = -v[3] >= kDriftCalls;
  const bool judge_drift = judged && !test_link_ && !probe_now;
  if (judge_drift && drift_baseline_ == 0) {
    drift_baseline_ = shared_drift;
  } else if (judge_drift) {
    const bool moved = shared_drift > drift_baseline_ * kDriftBand || shared_drift < drift_baseline_ / kDriftBand;
    drift_moved_ = moved ? drift_moved_ + 1 : 0;
    if (drift_moved_ >= 2) {
      const LinkModel fresh = probe_level(op, level);
      double w[2] = {fresh.alpha_s, fresh.seconds_per_byte};
      dense_allreduce(op, w, 2, DType::kFloat64, ReduceOp::kMax, kRelinkUnits);
      v[0] = w[0];
      v[1] = w[1];
      relinked = true;
    }
  }
  if (probe_now || relinked) {
    drift_baseline_ = 0;  // the next judgement becomes the baseline
    drift_moved_ = 0;
  }
  if (probe_now || relinked || judged) {
    drift_log_sum_ = 0;
    drift_count_ = 0;
  }
  link_known_ = true;
  link_ = LinkModel{v[0], v[1]};
  const double shared_overlap = -v[4];  // the least of the ranks'
  mine.overlap_sum_s = 0;
  mine.overlap_count = 0;

  std::vector<CandidateCost> shared(count);
  for (size_t i = 0; i < count; ++i) shared[i] = CandidateCost{v[kReviewHead + 3 * i], v[kReviewHead + 3 * i + 1], v[kReviewHead + 3 * i + 2]};
  const AutoDecision d = decide_auto(spec, shared, link_, level.numel, level.ranks, record.choice, shared_overlap);
  const bool changed = d.choice != record.choice;
  // The first choice knows no overlap yet (nothing was waited on): it is revisited after
  // a few calls have measured it.
  const uint64_t period = record.choice < 0 ? std::min<uint64_t>(kFirstReview, spec.review) : spec.review;
  record.spec_hash = spec_hash;
  record.choice = d.choice;
  record.decided_at = call.key->step;
  record.next_review = call.key->step + period;

  AutoChoice report;
  report.key = call.key_name;
  report.numel = call.tensor.numel;
  report.step = call.key->step;
  report.candidates = spec.names;
  report.chosen = report.candidates[d.choice];
  report.predicted_s = d.predicted_s;
  for (size_t i = 0; i < count; ++i) {
    report.compute_s.push_back(predict_compute_s(auto_shape(spec.candidates[i]), shared[i], level.ranks));
    report.payload_bytes.push_back(shared[i].payload_bytes);
  }
  report.left_out = d.left_out;
  report.alpha_s = link_.alpha_s;
  report.bytes_per_s = 1.0 / link_.seconds_per_byte;
  report.overlap_s = shared_overlap;
  if (changed && op.rank() == 0) {
    std::string times;
    for (size_t i = 0; i < count; ++i) {
      times += fmt::format("{}{} {}", i == 0 ? "" : ", ", spec.names[i],
                           d.predicted_s[i] >= 0 ? fmt::format("{:.3f} ms", d.predicted_s[i] * 1e3)
                                                 : std::string("left out"));
    }
    log(LogLevel::kInfo, "gradcomm: auto: key '{}' ({} elements) at step {}: {} (predicted {}; link {:.0f} us, "
        "{:.1f} MB/s; overlap {:.3f} ms)",
        call.key_name, call.tensor.numel, call.key->step, report.chosen, times, link_.alpha_s * 1e6,
        report.bytes_per_s / 1e6, shared_overlap * 1e3);
  }
  call.key->extra = record.serialize();
  std::lock_guard lock(report_mutex_);
  report_[call.key_name] = std::move(report);
}

AutoRecord AutoChooser::record_of(const Call& call) {
  AutoRecord record = AutoRecord::parse(call.key->extra).value_or(AutoRecord{});
  const AutoSpec& spec = *call.auto_spec;
  if (record.spec_hash != spec.hash || record.choice < 0 || static_cast<size_t>(record.choice) >= spec.candidates.size()) {
    record = AutoRecord{};
  }
  return record;
}

bool AutoChooser::review_due(Call& call, int ranks) {
  if (call.tensor.numel == 0) return false;  // nothing to send: the dense ring's empty call, no review
  KeyState& key = *call.key;
  const AutoSpec& spec = *call.auto_spec;
  AutoRecord record = record_of(call);
  note_overlap(call);
  // After load_state the record's choice holds until its review (costs are measured then).
  const bool due = record.choice < 0 || key.step >= record.next_review;
  if (due && ranks <= 1) {  // one rank: nothing travels, nothing to choose
    record = AutoRecord{spec.hash, 0, key.step + static_cast<uint64_t>(spec.review), key.step};
  }
  key.extra = record.serialize();
  return due && ranks > 1;
}

const CompressorSpec* AutoChooser::choice(const Call& call) const {
  if (call.tensor.numel == 0) return &kDenseSpec;
  return &call.auto_spec->candidates[static_cast<size_t>(record_of(call).choice)];
}

AutoKeyState& AutoChooser::state_of(KeyState& key) {
  if (!key.auto_state) key.auto_state = std::make_shared<AutoKeyState>();
  return *key.auto_state;
}

void AutoChooser::note_overlap(const Call& call) {
  AutoKeyState& o = state_of(*call.key);
  if (o.last) {
    const int64_t waited = o.last->first_wait_ns.load(std::memory_order_relaxed);
    const Clock::time_point until =
        waited != 0 ? Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(waited)))
                    : call.issued;  // never waited on before the key's next call: all of it
    o.overlap_sum_s += std::max(0.0, std::chrono::duration<double>(until - o.last_issued).count());
    o.overlap_count += 1;
  }
  o.last = call.work;
  o.last_issued = call.issued;
}

void AutoChooser::observe(const Call& call, const Stats& before, const Stats& after, int ranks) {
  if (ranks <= 1 || !link_known_ || call.tensor.numel == 0) return;
  const double wire = (after.total_s - before.total_s) - (after.encode_s - before.encode_s) -
                      (after.decode_s - before.decode_s) - (after.reduce_s - before.reduce_s);
  if (call.key == nullptr || !call.key->auto_state) return;
  const std::vector<CandidateCost>& costs = call.key->auto_state->costs;
  const size_t i = static_cast<size_t>(call.spec - call.auto_spec->candidates.data());
  if (i >= costs.size()) return;
  const int level_ranks = call.key->auto_state->level_ranks > 0 ? call.key->auto_state->level_ranks : ranks;
  const double predicted = predict_wire_s(auto_shape(*call.spec), costs[i].payload_bytes, link_, level_ranks);
  if (!(wire > 0) || !(predicted > 0)) return;
  drift_log_sum_ += std::log(wire / predicted);
  drift_count_ += 1;
}

void AutoChooser::set_test_override(double compute_scale, std::optional<LinkModel> link) {
  test_compute_scale_ = compute_scale;
  test_link_ = link;
  ++measure_generation_;  // measured again, scaled, at each key's next review
}

void AutoChooser::forget(std::span<const std::string> keys) {
  std::lock_guard lock(report_mutex_);
  for (const std::string& key : keys) report_.erase(key);
}

std::vector<AutoChoice> AutoChooser::report() const {
  std::lock_guard lock(report_mutex_);
  std::vector<AutoChoice> out;
  out.reserve(report_.size());
  for (const auto& [key, choice] : report_) out.push_back(choice);
  return out;
}

}  // namespace gradcomm::detail
