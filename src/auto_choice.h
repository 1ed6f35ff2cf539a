// `compressor=auto` on the engine (docs/does-compression-pay.md; the spec:
// compressors/auto_spec.h). Per key, the candidate whose predicted call time is least:
//
//   t(c) = compute(c) + max(0, wire(c) - overlap)
//
// wire at the job's measured α (seconds per message) and β (bytes per second), compute
// measured on this host, overlap the time the caller goes on computing after issuing the
// key's call before it waits on it (measured from the calls, below):
//
//   none       (N-1)/N reduce passes            + 2(N-1) (α + 4n / (N β))
//   codec ring encode + 2(N-1)/N decode passes  + 2(N-1) (α + B / (N β))
//   top-k      encode + N decodes               + 2(N-1) α + (N-1) B / β
//
// for n elements on N ranks, B the candidate's payload of the whole tensor. A candidate
// with error feedback adds one pass (the residual's fold). Compute is charged in full:
// where a rank's threads share its cores (a rank per core), the engine's encode takes
// its time from the training computation, while waiting on the wire does not, and hides
// behind it for as long as the caller computes before it waits. A caller that waits at
// once (a blocking call, a hook whose thread waits for it) has no overlap: t = compute +
// wire.
//
// Agreement. A key's choice is made at a review: an internal call numbered like any
// other ("auto-review" in its header), run by every rank at the same step of the key
// (the step is in every header, so ranks cannot drift apart unseen). It allreduces,
// taking the maximum, one vector of this rank's measurements: α and 1/β, each
// candidate's compute and payload bytes (the slowest rank's cost is the step's), and
// the calls' drift and the key's overlap (negated: the least drifted rank's, and the
// least overlap: the rank that waits first). Every rank then computes the
// choice from the same numbers, in the same order: the same choice, whatever its own
// clock said. The chosen candidate's spec then travels in each call's header, checked
// like any call's.
//
// Overlap: for each call of the key, the time from its issue to when the application
// first needed it (its first Work::wait by the application, or Work::needed: the DDP
// hook's helper thread waits as Waiter::kHelper and marks its step's calls needed at the
// last bucket; WorkState::first_wait_ns), read at the key's next call; a call nobody
// needed before then counts the interval between the two issues. The mean since the
// last review.
//
// Measuring. Compute costs: each candidate's encode and decode timed on a copy of the
// key's gradient at its first review (once per key name and size). α and β: a probe at
// the job's first review (small and 2 MiB allreduces inside the review call), and again
// when the calls' measured wire times have drifted from the model's prediction: their
// geometric mean over at least 16 calls (on every rank; the least drifted rank's), two
// judgements in a row more than 2x from the first judgement after the last probe.
//
// Near-ties. Predictions within 10 % of the best do not separate candidates (the clocks
// behind them are noisier than that): the current choice stays, else the earliest
// listed (the least lossy, in the default order) among them is taken.
//
// Switching: a candidate with error feedback inherits the residual as it is
// (it holds what was not yet sent, in the gradient's units, whichever codec dropped
// it); one without flushes it, adding it to the gradient of the first call after the
// switch, which then sends it (exactly for none, rounded for 16 bits).
//
// State. The choice, the step of the next review and its period live in the key's
// KeyState::extra (AutoRecord), so save_state/load_state carry them with the residual.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "env.h"
#include "gradcomm/communicator.h"
#include "state.h"
#include "wire.h"

namespace gradcomm::detail {

struct AutoSpec;        // compressors/auto_spec.h
struct CompressorSpec;  // compressors/spec.h

struct Call;
struct PricedLevel;  // auto_choice.cc: the level a choice is priced on
struct WorkState;
class HostCompression;
class Op;

// ---- the model (pure: tests/unit/test_auto_choice.cc) -------------------------------

enum class AutoShape : uint8_t { kDenseRing, kCodecRing, kAllgather };
AutoShape auto_shape(const CompressorSpec& spec);

struct LinkModel {
  double alpha_s = 30e-6;           // per message
  double seconds_per_byte = 8e-10;  // 1 / β
};

// One candidate on one key, in seconds per call of the whole tensor (this rank's, or
// after the review's reduction the slowest rank's).
struct CandidateCost {
  double encode_s = 0;  // none: one reduce pass; else encode (+ the residual's fold with ef)
  double decode_s = 0;  // one decode(-add) of a whole-tensor payload; none: 0
  double payload_bytes = 0;
};

double predict_compute_s(AutoShape shape, const CandidateCost& cost, int ranks);
double predict_wire_s(AutoShape shape, double payload_bytes, const LinkModel& link, int ranks);

struct AutoDecision {
  int choice = 0;
  std::vector<double> predicted_s;  // per candidate; negative: left out (see reason)
  std::vector<std::string> left_out;  // per candidate: why ("" when priced)
};

// The candidate with the least predicted time among those allowed (all for keys of at
// least spec.small elements, else those of 16 bits or more; none above max_ratio), but
// among those within 10 % of it: `current` (-1: none yet) if it is one, else the
// earliest listed. Pure: equal inputs give equal outputs.
AutoDecision decide_auto(const AutoSpec& spec, std::span<const CandidateCost> costs, const LinkModel& link,
                         int64_t numel, int ranks, int current, double overlap_s = 0.0);

// ---- the persisted part of a key's choice (KeyState::extra) -------------------------

struct AutoRecord {
  static constexpr uint32_t kMagic = 0x31414347;  // "GCA1"
  static constexpr size_t kBytes = 32;
  uint32_t spec_hash = 0;  // fnv1a32 of the AutoSpec's canonical form: a new spec starts over
  int32_t choice = -1;     // candidate index; -1: none yet
  uint64_t next_review = 0;  // the key's step of its next review
  uint64_t decided_at = 0;

  std::vector<uint8_t> serialize() const;
  // nullopt for bytes that are not a record (an empty extra: a key auto has not used).
  static std::optional<AutoRecord> parse(std::span<const uint8_t> bytes);
};

// ---- on the engine -------------------------------------------------------------------

// What auto measured of one key, beside its persisted AutoRecord: held by the key itself
// (KeyState::auto_state), so that it goes when the key goes (forget_keys: issue 42, a
// torch backend fed fresh tensors made a key per call, and these grew by ~1.5 KB each).
// Engine thread only.
struct AutoKeyState {
  // Each candidate's costs on this rank, measured at a review for this spec and size.
  uint32_t spec_hash = 0;
  int64_t numel = 0;
  uint64_t generation = 0;  // AutoChooser::measure_generation_ when measured
  std::vector<CandidateCost> costs;  // on the level's piece (auto_choice.cc, PricedLevel)
  int level_ranks = 0;               // the ranks of that level
  // Overlap: the key's previous call (to read when it was first waited on), and the
  // mean since the last review.
  std::shared_ptr<WorkState> last;
  Clock::time_point last_issued{};
  double overlap_sum_s = 0;
  int64_t overlap_count = 0;
};

class AutoChooser {
 public:
  // On the engine thread, before the call's header is made (call_runner.h runs these):
  //   review_due  whether the key's choice is due for a review, which then runs first as
  //               an internal numbered call of its own: review_header and, inside its
  //               Op, review (errors are that call's, every rank's view of it);
  //   choice      the spec the call runs with (the key's choice; the dense ring for an
  //               empty tensor).
  // review_due also notes the call's overlap; with one rank it decides without a review.
  bool review_due(Call& call, int ranks);
  WireHeader review_header(const Call& call, uint64_t seq) const;
  void review(Op& op, HostCompression& compression, Call& call);
  const CompressorSpec* choice(const Call& call) const;
  // After the call: its measured wire time against the model's (the drift).
  void observe(const Call& call, const Stats& before, const Stats& after, int ranks);
  // Test hook: from the next review on, this rank's measurements are multiplied by
  // `compute` (compute costs) and the link is taken as `link` instead of probed.
  void set_test_override(double compute_scale, std::optional<LinkModel> link);

  // The latest decision per key (any thread).
  std::vector<AutoChoice> report() const;
  // Drops the keys' reports (forget_keys, introspect.h: the keys' state goes with them).
  void forget(std::span<const std::string> keys);

 private:
  void note_overlap(const Call& call);
  // The key's record (KeyState::extra), or a fresh one when it is not this spec's.
  static AutoRecord record_of(const Call& call);
  // Each candidate's costs on `numel` elements of the key's gradient (the level's piece).
  std::vector<CandidateCost> measure(const AutoSpec& spec, const Call& call, HostCompression& compression, int rank,
                                     int64_t numel) const;
  LinkModel probe(Op& op) const;
  // The probe on the level compression runs on (auto_choice.cc, PricedLevel).
  LinkModel probe_level(Op& op, const PricedLevel& level) const;
  static AutoKeyState& state_of(KeyState& key);

  uint64_t measure_generation_ = 1;  // set_test_override: every key measures again
  bool link_known_ = false;
  LinkModel link_;
  double drift_log_sum_ = 0;
  int64_t drift_count_ = 0;
  double drift_baseline_ = 0;  // the first judged drift after a probe; 0: none yet
  int drift_moved_ = 0;        // judgements in a row more than 2x from the baseline
  double test_compute_scale_ = 1.0;
  std::optional<LinkModel> test_link_;

  mutable std::mutex report_mutex_;
  std::map<std::string, AutoChoice> report_;
};

}  // namespace gradcomm::detail
