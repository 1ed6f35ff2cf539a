// CallRunner: the one place a numbered call runs. The engine (engine.h) owns the
// queue and the thread and decides *when* the head call, or a fused group of calls
// (fusion.h), runs; the communicator (comm_impl.h) owns the state: keys, stats, the
// compression, the device path. The runner does the rest, in one order for every kind
// of call:
//
//   number it         the call's sequence number (the runner holds the counter)
//   prepare it        open the device path at the first CUDA call (a numbered call of
//                     its own); compressor=auto: its review when due (a numbered call
//                     of its own, scheduled here before the call, never inside it),
//                     then its choice
//   run it            inside an Op (op.h): the header check, then the algorithm
//                     (dispatch, call_dispatch.cc), or a fused group's plan and its
//                     members side by side (run_fused)
//   advance it        each bound key takes one step (advance_keys: the only place a
//                     key's step moves), then Stats::ops and auto's observation
//
// Outside the compressed procedure (compressed_allreduce.h), the runner is also the
// only code that touches a key's residual: a fused group packs its members' residuals
// side by side (and a dense member's is folded into its gradient), and a choice of
// auto without error feedback sends what the residual kept.
//
// Failure. Whatever escapes a call's Op marks the communicator failed and tells the
// other ranks (run_numbered); no key advances for a call that failed.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <vector>

#include "call.h"
#include "fusion.h"
#include "op.h"
#include "wire.h"

namespace gradcomm::detail {

class CallContext;
class CommunicatorImpl;

// What a fused group needs from the engine's queue while rank 0's plan is agreed.
class GroupQueue {
 public:
  // The first `max` calls queued (stable pointers).
  virtual std::vector<Call*> head(size_t max) = 0;
  // Not rank 0: how many of the `planned` calls of rank 0's plan this rank can take
  // now, or 0 while it should wait for its caller to issue more (Op::agree_plan).
  virtual uint32_t can_take(uint32_t planned, const FusionClass& cls, uint64_t first_ticket) = 0;

 protected:
  ~GroupQueue() = default;
};

class CallRunner {
 public:
  explicit CallRunner(CommunicatorImpl& comm);
  CallRunner(const CallRunner&) = delete;
  CallRunner& operator=(const CallRunner&) = delete;

  // What the engine sees of its communicator.
  CallContext& context();
  bool usable() const;   // no failure recorded yet
  void publish_stats();  // makes the Stats of the calls completed so far visible (any thread)
  // The sequence number the next call gets (user calls count from 1; creation's barrier is 0).
  uint64_t next_seq() const { return next_seq_; }

  // What a run consumed from the head of the queue, and how it ended (null: well).
  // The engine completes that many calls' works with `error`.
  struct Ran {
    size_t calls = 1;
    std::exception_ptr error;
  };
  // Runs one queued call alone: a collective in its own Op, or a local function.
  Ran run_one(Call& call);
  // Runs the group at the head of `view`, all of class `cls`: rank 0 plans how many
  // and tells the others, who take as many of their own queued calls (fusion.h).
  Ran run_group(std::span<Call* const> view, const FusionClass& cls, int64_t fusion_bytes, GroupQueue& queue);
  // An internal numbered call (allgatherv, creation's barrier, the device setup): runs
  // `body` inside an Op of `header` (its seq: next_seq(), or 0 for creation's barrier)
  // and accounts it: sequence numbers, time, and on failure the communicator failed on
  // every rank, rethrown. `body` returns how many sequence numbers it used (0: none).
  void run_numbered(const WireHeader& header, Op::HeaderMode mode, const std::function<size_t(Op&)>& body);

 private:
  // The header a call puts on the wire, numbered `seq` (reads the key's step).
  WireHeader header_for(const Call& call, uint64_t seq) const;
  // The algorithm of one call inside its Op, after its header matched (call_dispatch.cc).
  void dispatch(Op& op, Call& call);
  // A fused group's members side by side in the engine's buffer, one collective.
  void run_fused(Op& op, std::span<Call* const> members, const FusionClass& cls);
  // run_one's collective part (throws).
  void run_collective(Call& call);
  // compressor=auto, before the call's header is made: the review when due, the choice.
  void choose_auto(Call& call);
  // The first CUDA call's numbered setup of the device path.
  void open_device(int device);
  // Every call of `members` that ran to completion: its bound key takes one step.
  static void advance_keys(std::span<Call* const> members);

  CommunicatorImpl& comm_;
  uint64_t next_seq_ = 1;
  std::vector<uint8_t> fusion_buffer_;  // kept between groups
};

}  // namespace gradcomm::detail
