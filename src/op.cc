#include "op.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <stdexcept>

#include "call_context.h"
#include "collectives/collectives.h"
#include "fusion.h"
#include "node_shm.h"
#include "spin.h"

namespace gradcomm::detail {

namespace {
constexpr auto kMaxSleep = std::chrono::microseconds(20'000);

// How long a timed-out wait gives the other ranks to answer a liveness check.
constexpr auto kSilentWait = std::chrono::milliseconds(2000);

int left_of(int rank, int size) { return (rank + size - 1) % size; }

// The rank a wait timed out on may itself wait on another: with a stopped rank in a
// ring, every rank times out on its left neighbour, and all but one name a healthy
// rank (issue 42). So a timeout asks every rank whether it still answers
// (Transport::find_silent) and names those that do not.
std::string silent_ranks(Transport& transport) {
  std::string out;
  for (const Transport::Silent& s : transport.find_silent(kSilentWait)) {
    out += fmt::format("; rank {} is stalled: {}", s.rank, s.why);
  }
  return out;
}
int right_of(int rank, int size) { return (rank + 1) % size; }

// Headers travel on their own tag without the sequence number, so a rank that
// skipped a call is caught by comparison instead of waiting on unmatched tags;
// rank 0's fusion plans likewise, on a second sub-tag.
constexpr uint64_t kHeaderTag = make_tag(TagKind::kHeader, 0, 0);
constexpr uint64_t kPlanTag = make_tag(TagKind::kHeader, 0, 1);
constexpr uint64_t kTakesTag = make_tag(TagKind::kHeader, 0, 2);   // rank r -> 0: how many it can take
constexpr uint64_t kAgreedTag = make_tag(TagKind::kHeader, 0, 3);  // rank 0 -> all: how many run
}  // namespace

Op::Op(CallContext& comm, const WireHeader& header, HeaderMode mode, Clock::time_point started)
    : comm_(comm),
      header_(header),
      rank_(comm.rank()),
      size_(comm.size()),
      deadline_{started + comm.timeout()} {
  if (size_ == 1) {
    header_checked_ = true;
    return;
  }
  if (comm.one_segment()) {
    // Every rank shares the segment: the call's rounds there carry its header, and a
    // call that has none checks it with a round of its own (check_header). No messages.
    segment_header_ = true;
    return;
  }
  header_recv_ = comm_.transport().irecv(left_of(rank_, size_), kHeaderTag, header_in_.data(), header_in_.size());
  if (mode == HeaderMode::kPostNow) post_header(header_);
}

Op::~Op() = default;

const NodeMap& Op::nodes() const { return comm_.nodes(); }
bool Op::two_levels() const { return view_ == nullptr && comm_.two_levels(); }
ScheduleMode Op::schedule_mode() const { return comm_.schedule_mode(); }

void Op::post_header(const WireHeader& header) {
  header_ = header;
  if (size_ == 1) return;
  if (segment_header_) {
    header_checked_ = false;  // rounds run with the provisional header do not count
    return;
  }
  header_out_ = header_.serialize();
  header_send_ = comm_.transport().isend(right_of(rank_, size_), kHeaderTag, header_out_.data(), header_out_.size());
  auto& stats = comm_.mutable_stats();
  stats.bytes_sent += header_out_.size();
  stats.messages_sent += 1;
}

RequestPtr Op::send(int peer, uint32_t unit, const void* data, size_t bytes) {
  auto& stats = comm_.mutable_stats();
  stats.bytes_sent += bytes;
  stats.messages_sent += 1;
  return comm_.transport().isend(comm_rank(peer), make_tag(TagKind::kData, header_.seq, unit + unit_offset_), data,
                                 bytes);
}

RequestPtr Op::recv(int peer, uint32_t unit, void* data, size_t bytes) {
  // Counted when posted, like sends: a receive that then fails ends the communicator anyway.
  comm_.mutable_stats().bytes_received += bytes;
  return comm_.transport().irecv(comm_rank(peer), make_tag(TagKind::kData, header_.seq, unit + unit_offset_), data,
                                 bytes);
}

Op::View::View(Op& op, const std::vector<int>& members, uint32_t unit_offset)
    : op_(op), outer_members_(op.view_), outer_rank_(op.view_rank_), outer_offset_(op.unit_offset_) {
  members_.reserve(members.size());
  int place = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == op.rank()) place = static_cast<int>(i);
    members_.push_back(op.comm_rank(members[i]));
  }
  if (place < 0) throw std::logic_error("Op::View: this rank is not among the view's members");
  op.view_ = &members_;
  op.view_rank_ = place;
  op.unit_offset_ = outer_offset_ + unit_offset;
}

Op::View::~View() {
  op_.view_ = outer_members_;
  op_.view_rank_ = outer_rank_;
  op_.unit_offset_ = outer_offset_;
}

// An abort names the call that failed on its origin rank. A call before that
// one may still complete here (every rank was in it), so only the named call, or
// a call whose own exchange fails, raises it: errors land on the call they concern.
void Op::spin(const std::function<bool()>& ready, const Request* request, const char* what, int peer) {
  Transport& transport = comm_.transport();
  // While a caller waits on the engine, polls (yielding the core each time) for
  // spin_before_sleep() without progress before it sleeps in wait_for_event() (src/spin.h).
  Clock::time_point last_moved = Clock::now();
  while (true) {
    const bool moved = transport.progress();
    const bool done = ready();
    check_aborts(request != nullptr && !request->pending() && request->state() != RequestState::kDone);
    if (done) return;
    if (comm_.stopping()) fail_destroyed();
    if (deadline_.expired()) fail_timeout(what, peer);
    if (moved) {
      last_moved = Clock::now();
    } else if (Clock::now() - last_moved < spin_before_sleep() && comm_.waited_on()) {
      sched_yield();
    } else {
      transport.wait_for_event(std::min<std::chrono::microseconds>(kMaxSleep, deadline_.remaining()));
    }
  }
}

void Op::check_aborts(bool failed) {
  auto& abort = comm_.pending_abort();
  while (auto incoming = comm_.transport().poll_abort()) {
    if (!abort) abort = std::move(*incoming);
  }
  if (abort && (abort->seq <= header_.seq || failed)) raise_abort(*abort);
  // Checked before a wait's `done`: a refusal aborts every call in flight, even one whose
  // data has just arrived. Otherwise a call running when another thread was refused could
  // complete, paired with whatever the peer issued after learning of the refusal (a single
  // atomic load while none was refused).
  if (comm_.refused()) {
    if (auto refusal = comm_.refusal()) fail(ErrorCode::kInvalidArgument, *refusal);
  }
}

void Op::fail_timeout(const char* what, int peer) {
  const std::string whom = peer >= 0 ? fmt::format("rank {}", peer) : std::string("the other ranks");
  fail(ErrorCode::kTimeout, fmt::format("timed out after {:.1f} s waiting for {} ({}){}",
                                        std::chrono::duration<double>(comm_.timeout()).count(), whom, what,
                                        silent_ranks(comm_.transport())));
}

void Op::check_in(const char* what, int peer) {
  comm_.transport().progress();
  check_aborts(false);
  if (comm_.stopping()) fail_destroyed();
  if (deadline_.expired()) fail_timeout(what, peer);
}

NodeShm* Op::node_shm() const {
  NodeShm* shm = comm_.node_shm();
  if (shm == nullptr) return nullptr;
  if (view_ == nullptr) return static_cast<int>(shm->members().size()) == size_ ? shm : nullptr;
  return *view_ == shm->members() ? shm : nullptr;
}

void Op::spin_until_done(Request& request, const char* what) {
  spin([&] { return !request.pending(); }, &request, what, request.peer());
  switch (request.state()) {
    case RequestState::kDone:
      break;
    case RequestState::kPeerFailed:
      fail(ErrorCode::kPeerFailure,
           fmt::format("rank {} failed or disconnected ({}): {}", request.peer(), what, request.error()));
    case RequestState::kTruncated:
      fail(ErrorCode::kCorruptPayload, fmt::format("rank {} sent a longer message than this call expects ({}): {}",
                                                   request.peer(), what, request.error()));
    default:
      fail(ErrorCode::kTransport,
           fmt::format("transport error with rank {} ({}): {}", request.peer(), what, request.error()));
  }
  if (request.bytes() != request.posted_bytes()) {
    fail(ErrorCode::kCorruptPayload, fmt::format("rank {} sent {} bytes where this call expects {} ({})",
                                                 request.peer(), request.bytes(), request.posted_bytes(), what));
  }
}

void Op::wait_until(const std::function<bool()>& ready, const char* what) { spin(ready, nullptr, what, -1); }

// Another rank failed first: raise its error here. The notice is relayed, as it
// came, to every other rank before this one can leave: a peer may see this rank's
// departure before the origin's own notice reaches it (they travel on different
// connections), and must then still find the notice first (ucx_wire.h: receipts).
void Op::raise_abort(const ControlMessage& abort) {
  const std::string message = fmt::format("rank {}: {} aborted: rank {} reported: {}", rank_, header_.describe(),
                                          abort.origin, abort.text);
  const ErrorCode code = abort.code;
  comm_.mark_failed(code, message);
  comm_.transport().send_abort(abort);
  comm_.transport().abandon_pending(kAbandonGrace);
  throw_error(code, message);
}

// The communicator is being destroyed with this call outstanding: the caller's
// error is a usage error here; the other ranks lose a peer, and are told so.
void Op::fail_destroyed() {
  const std::string message = fmt::format("rank {}: {}: the communicator was destroyed with this call outstanding "
                                          "(wait() on every call before destroying it)",
                                          rank_, header_.describe());
  comm_.mark_failed(ErrorCode::kInvalidArgument, message);
  comm_.tell_peers_destroyed(header_.seq);
  throw InvalidArgument(message);
}

void Op::check_header() {
  if (header_checked_) return;
  header_checked_ = true;  // set first: failures below must not re-enter
  if (segment_header_) {
    shm_check_header(*this, *comm_.node_shm());
    return;
  }
  spin_until_done(*header_recv_, "call header");
  comm_.mutable_stats().bytes_received += header_in_.size();
  const int left = left_of(rank_, size_);
  auto theirs = WireHeader::parse(header_in_.data(), header_in_.size());
  if (!theirs) {
    fail(ErrorCode::kCorruptPayload, fmt::format("rank {} sent a malformed call header", left));
  }
  if (!theirs->agrees_with(header_)) {
    fail(ErrorCode::kMismatch,
         fmt::format("mismatched collective calls: rank {} called {}; rank {} called {} (they differ in {})", rank_,
                     header_.describe(), left, theirs->describe(), header_.differences(*theirs)));
  }
}

void Op::wait(Request& request, const char* what) {
  check_header();
  spin_until_done(request, what);
}

void Op::wait_all(std::vector<RequestPtr>& requests, const char* what) {
  for (auto& request : requests) {
    if (request) wait(*request, what);
  }
}

void Op::count_shm(uint64_t bytes) {
  auto& stats = comm_.mutable_stats();
  stats.node_shm_ops += 1;
  stats.node_shm_bytes += bytes;
}

void Op::count_wire(uint64_t sent, uint64_t received, uint64_t messages) {
  auto& stats = comm_.mutable_stats();
  stats.bytes_sent += sent;
  stats.bytes_received += received;
  stats.messages_sent += messages;
}

void Op::finish() {
  check_header();
  if (header_send_) spin_until_done(*header_send_, "call header to the right neighbour");
  for (auto& plan : plan_sends_) spin_until_done(*plan, "fusion plan");
}

void Op::send_plan(const FusionPlan& plan) { send_counts(plan, kPlanTag, plan_out_, 1, size_); }

void Op::send_counts(const FusionPlan& plan, uint64_t tag, std::vector<uint8_t>& out, int first, int last) {
  const auto bytes = plan.serialize();
  out.assign(bytes.begin(), bytes.end());
  for (int peer = first; peer < last; ++peer) {
    plan_sends_.push_back(comm_.transport().isend(peer, tag, out.data(), out.size()));
  }
  count_wire(out.size() * static_cast<uint64_t>(last - first), 0, static_cast<uint64_t>(last - first));
}

// While the plan is awaited the left neighbour's header may arrive: rank 0 (or a
// rank that got its plan first) has started. It must open the group that starts
// at our call; anything else means the ranks called different things.
void Op::check_early_header() {
  if (early_header_seen_ || header_recv_ == nullptr || header_recv_->pending()) return;
  early_header_seen_ = true;
  if (header_recv_->state() != RequestState::kDone) return;  // spin_until_done reports it in check_header
  auto theirs = WireHeader::parse(header_in_.data(), header_in_.size());
  if (theirs && theirs->fused > 0 && theirs->seq == header_.seq) return;
  const int left = left_of(rank_, size_);
  fail(ErrorCode::kMismatch,
       fmt::format("mismatched collective calls: rank {} called {} (a fused group's first call, waiting for rank 0's "
                   "plan); rank {} called {}",
                   rank_, header_.describe(), left, theirs ? theirs->describe() : std::string("a malformed header")));
}

FusionPlan Op::receive_plan() {
  std::array<uint8_t, FusionPlan::kBytes + 1> in{};  // one spare byte: a longer message is a truncation
  RequestPtr request = comm_.transport().irecv(0, kPlanTag, in.data(), FusionPlan::kBytes);
  spin(
      [&] {
        check_early_header();
        return !request->pending();
      },
      request.get(), "fusion plan", 0);
  spin_until_done(*request, "fusion plan");
  comm_.mutable_stats().bytes_received += FusionPlan::kBytes;
  auto plan = FusionPlan::parse(in.data(), request->bytes());
  if (!plan) fail(ErrorCode::kCorruptPayload, "rank 0 sent a malformed fusion plan");
  if (plan->first_seq != header_.seq) {
    fail(ErrorCode::kMismatch, fmt::format("mismatched collective calls: rank 0 fused calls #{}-#{}, while this "
                                           "rank's next call is {}",
                                           plan->first_seq, plan->first_seq + plan->count - 1, header_.describe()));
  }
  return *plan;
}

uint32_t Op::receive_count(int peer, uint64_t tag, const FusionPlan& plan, const char* what) {
  std::array<uint8_t, FusionPlan::kBytes + 1> in{};  // one spare byte: a longer message is a truncation
  RequestPtr request = comm_.transport().irecv(peer, tag, in.data(), FusionPlan::kBytes);
  spin_until_done(*request, what);
  comm_.mutable_stats().bytes_received += FusionPlan::kBytes;
  auto got = FusionPlan::parse(in.data(), request->bytes());
  if (!got || got->first_seq != plan.first_seq || got->count > plan.count) {
    fail(ErrorCode::kCorruptPayload,
         fmt::format("rank {} sent a malformed {} for the fused group at call #{}", peer, what, plan.first_seq));
  }
  return got->count;
}

uint32_t Op::agree_plan(const FusionPlan& plan) {
  uint32_t agreed = plan.count;
  for (int peer = 1; peer < size_; ++peer) {
    agreed = std::min(agreed, receive_count(peer, kTakesTag, plan, "fusion reply"));
  }
  send_counts(FusionPlan{plan.first_seq, agreed}, kAgreedTag, agreed_out_, 1, size_);
  return agreed;
}

uint32_t Op::agree_plan(const FusionPlan& plan, uint32_t takes) {
  send_counts(FusionPlan{plan.first_seq, takes}, kTakesTag, agreed_out_, 0, 1);
  return receive_count(0, kAgreedTag, plan, "agreed fusion plan");
}

void Op::fail(ErrorCode code, const std::string& what) {
  const std::string message = fmt::format("rank {}: {}: {}", rank_, header_.describe(), what);
  comm_.fail_and_tell(code, message, header_.seq);
  throw_error(code, message);
}

Op::PhaseTimer::~PhaseTimer() {
  op_.comm_.mutable_stats().*phase_ += std::chrono::duration<double>(Clock::now() - start_).count();
}

}  // namespace gradcomm::detail
