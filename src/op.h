// Op: one collective call in flight on the engine thread (engine.h): its header,
// deadline and the wait loop. Every blocking wait of an algorithm goes through
// wait(), which drives the transport, watches the control channel for aborts,
// enforces the deadline, notices the communicator's destruction, and turns a
// failed request into an error naming the peer, the call and the step.
//
// Headers. Each rank sends its call's header to its right neighbour and checks
// its left neighbour's; if every adjacent pair agrees, all ranks agree. A fused
// group (fusion.h) is planned by rank 0: the other ranks open their Op with the
// header deferred, learn the group from rank 0's plan (receive_plan), and only
// then post the group's header.
#pragma once

#include <array>
#include <functional>
#include <vector>

#include "env.h"
#include "gradcomm/communicator.h"
#include "gradcomm/errors.h"
#include "transport/transport.h"
#include "wire.h"

namespace gradcomm::detail {

class CallContext;                  // call_context.h: all an Op sees of its communicator
enum class ScheduleMode : uint8_t;  // hierarchy.h
class NodeMap;      // topology.h
class NodeShm;      // node_shm.h
struct FusionPlan;

class Op {
 public:
  enum class HeaderMode : uint8_t { kPostNow, kDeferred };
  // `started`: when the call began (its deadline is the communicator's timeout after).
  Op(CallContext& comm, const WireHeader& header, HeaderMode mode = HeaderMode::kPostNow,
     Clock::time_point started = Clock::now());
  ~Op();
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  // Which ranks share a node, and whether a collective run at the top of this call (not
  // inside a View) goes over two levels (hierarchy.h).
  const NodeMap& nodes() const;
  bool two_levels() const;
  // How the codec-ring families run (GRADCOMM_SCHEDULE, hierarchy.h).
  ScheduleMode schedule_mode() const;

  // The node's shared segment when this call's group (the communicator, or the current
  // View) is exactly the ranks of this rank's node, in the node's order; else null.
  NodeShm* node_shm() const;
  // Raises an abort another rank sent for this call or an earlier one (as every wait does
  // first): a call on the segment may find its peers' data there and finish without ever
  // waiting, after they gave up on it.
  void check_aborts_now() { check_aborts(false); }
  // A round on the node's segment carried this call's header beside its digest, and every
  // rank's agreed (shm_collectives.cc): on a one-segment communicator that is the call's
  // header check (check_header then has nothing left to do). Elsewhere it changes nothing.
  void header_checked_on_segment() {
    if (segment_header_) header_checked_ = true;
  }

  // This rank and the ranks of the call, or, inside a View, of the view's group.
  int rank() const { return view_ != nullptr ? view_rank_ : rank_; }
  int size() const { return view_ != nullptr ? static_cast<int>(view_->size()) : size_; }
  const WireHeader& header() const { return header_; }

  // A collective over some of the ranks, inside this call (the two-level schedules,
  // hierarchy.h): while a View lives, rank() and size() are this rank's place in
  // `members` (which must hold it, in an order every member agrees on) and their count;
  // send() and recv() name peers by that place; and every unit is offset by
  // `unit_offset`, so that phases of one call between the same two ranks never share a
  // tag. Any collective of src/collectives/ runs unchanged inside one. Views nest: the
  // inner one's members are places in the outer one's.
  class View {
   public:
    View(Op& op, const std::vector<int>& members, uint32_t unit_offset);
    ~View();
    View(const View&) = delete;
    View& operator=(const View&) = delete;

   private:
    Op& op_;
    std::vector<int> members_;  // ranks of the communicator
    const std::vector<int>* outer_members_;
    int outer_rank_;
    uint32_t outer_offset_;
  };

  // The communicator rank of `peer` (a place in the current View, or a rank outside one):
  // what transports that do not go through send()/recv() address (NCCL groups).
  int comm_rank(int peer) const { return view_ != nullptr ? (*view_)[static_cast<size_t>(peer)] : peer; }

  // Data messages of this call; `unit` tells messages of one call apart (pipeline
  // step and chunk). Byte counts go to Stats.
  RequestPtr send(int peer, uint32_t unit, const void* data, size_t bytes);
  RequestPtr recv(int peer, uint32_t unit, void* data, size_t bytes);

  // Blocks until `request` completes; a receive must deliver exactly the bytes
  // posted (anything else is CorruptPayload). `what` names the step for errors.
  void wait(Request& request, const char* what);
  void wait_all(std::vector<RequestPtr>& requests, const char* what);

  // Drives the transport until `ready()` is true, with the deadline, aborts and
  // shutdown watched as in wait(); `what` names the wait for a TimeoutError.
  void wait_until(const std::function<bool()>& ready, const char* what);

  // One round of wait_until's checks without waiting, for waits that are not on the
  // transport (the node's shared segment): progress, aborts, refusal, destruction and the
  // deadline (a TimeoutError naming `what`, `peer`, the rank waited for, and the ranks that
  // do not answer).
  void check_in(const char* what, int peer);

  // A collective that ran on the node's shared segment and the bytes this rank wrote
  // into it, for Stats.
  void count_shm(uint64_t bytes);

  // Wire traffic that did not go through send()/recv() (NCCL groups), for Stats.
  void count_wire(uint64_t sent, uint64_t received, uint64_t messages);

  // Adds the scope's wall time to one phase of Stats: &Stats::reduce_s,
  // &Stats::encode_s or &Stats::decode_s.
  class PhaseTimer {
   public:
    PhaseTimer(Op& op, double Stats::*phase) : op_(op), phase_(phase), start_(Clock::now()) {}
    ~PhaseTimer();

   private:
    Op& op_;
    double Stats::*phase_;
    Clock::time_point start_;
  };

  // Checks the left neighbour's header (waiting for it if needed) and the right
  // neighbour's receipt of ours, and that rank 0's plan reached every rank.
  // Algorithms need not call it: wait() checks the header first, and the
  // communicator calls finish() after the algorithm.
  void finish();

  // Checks the left neighbour's header now, before any data of this call leaves:
  // for algorithms where a rank sends without first waiting on a receive (a
  // broadcast's root), so a mismatch it can see stops its data going out.
  void confirm_header() { check_header(); }

  // Fusion (fusion.h). Rank 0 sends its plan to every other rank; the others
  // wait for it (a deferred Op). While waiting, a header that arrives from the
  // left neighbour must be the same group's (it may be ahead of us), or the calls
  // disagree: MismatchError then, not a wait for a plan that will never come.
  void send_plan(const FusionPlan& plan);
  FusionPlan receive_plan();
  // A plan of several calls is agreed before it runs: every other rank replies with
  // how many of the planned calls it can take (a call of its own may not fit: a
  // local call or one on a member's memory sits between them, or its caller waits
  // and will issue no more), and rank 0 sends the least of them to all. Rank 0:
  // agree_plan(plan) gathers and returns the count; the others: agree_plan(plan, k).
  uint32_t agree_plan(const FusionPlan& plan);
  uint32_t agree_plan(const FusionPlan& plan, uint32_t takes);
  // Deferred Op: the group's header, once the plan has fixed it.
  void post_header(const WireHeader& header);

  // Throws `code` with the call's context after telling the other ranks.
  [[noreturn]] void fail(ErrorCode code, const std::string& what);

 private:
  void check_header();
  void spin_until_done(Request& request, const char* what);
  // The wait loop: progress, aborts, shutdown, deadline, sleep; `peer` (or -1)
  // names who we wait for in a TimeoutError.
  void spin(const std::function<bool()>& ready, const Request* request, const char* what, int peer);
  // Raises what ends a wait: an abort for this call (or any, once `failed`), a refusal.
  void check_aborts(bool failed);
  [[noreturn]] void fail_timeout(const char* what, int peer);
  [[noreturn]] void raise_abort(const ControlMessage& abort);
  [[noreturn]] void fail_destroyed();
  void check_early_header();
  // Fusion's plan-shaped messages: `plan` to ranks [first, last) on `tag`, from
  // `out` (kept until finish()); and one from `peer`, for the group at
  // `plan.first_seq`, checked to hold a count in [1, plan.count].
  void send_counts(const FusionPlan& plan, uint64_t tag, std::vector<uint8_t>& out, int first, int last);
  uint32_t receive_count(int peer, uint64_t tag, const FusionPlan& plan, const char* what);

  CallContext& comm_;
  WireHeader header_;
  int rank_, size_;
  const std::vector<int>* view_ = nullptr;  // the current View's members, or null
  int view_rank_ = 0;
  uint32_t unit_offset_ = 0;
  Deadline deadline_;
  std::array<uint8_t, WireHeader::kBytes> header_out_;  // written before it is sent
  std::array<uint8_t, WireHeader::kBytes> header_in_;   // read once received
  RequestPtr header_send_, header_recv_;
  bool header_checked_ = false;
  // CallContext::one_segment: the header is checked on the segment (a round of the call's
  // own, or one of its own rounds), never sent over the transport.
  bool segment_header_ = false;
  bool early_header_seen_ = false;
  std::vector<uint8_t> plan_out_;
  std::vector<uint8_t> agreed_out_;
  std::vector<RequestPtr> plan_sends_;
};

}  // namespace gradcomm::detail
