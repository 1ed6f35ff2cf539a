// Engine: the thread a communicator owns that runs its calls, one after another
// in issue order, and drives the transport in between.
//
//   caller threads                      engine thread
//   --------------                      -------------
//   validate, queue a Call,             loop: take the head call (or a fused group
//   return a Work          ----------->       of calls, fusion.h), have the runner
//   Work::wait() blocks on                    run it (call_runner.h), publish Stats,
//   the WorkState                             complete its Works;
//                                             nothing queued: progress the transport
//                                             and sleep on it until new work or I/O
//
// Why a thread. Collectives run while the caller computes (a training step's
// backward pass overlaps its gradients' allreduces), and the transport keeps
// moving between calls: a send that completed locally while its bytes still sat
// in UCX's queue drains even when the caller has returned and blocks elsewhere,
// so a rank can never starve its peers of a call's last bytes.
//
// Wake-ups. The engine sleeps in Transport::wait_for_event; a new call, a wait
// on an open fusion group (the Doorbell) and shutdown interrupt() it.
//
// Issuing threads. Ranks pair calls by issue order, so that order must be one
// program order on every rank. Threads that issue concurrently make it a race
// whose outcome differs between ranks, and calls of the same shape then pair
// across threads without a word. So a collective issued on one thread while
// collectives another thread issued are still outstanding (queued or running) is
// refused, and the communicator is aborted on every rank (docs/fault-model.md,
// "Issuing threads"). Handing over from one thread to another after waiting on
// the first thread's calls is fine; so are local calls from any thread. A caller
// that orders its threads itself (the torch backend: a future callback's calls
// follow the op whose callback issued them) names one issuer for all of them
// (IssueAs, introspect.h) and refuses truly concurrent issuers on its own (refuse()).
//
// Calls on the caller's thread. On a communicator whose ranks all share one node's
// segment (CallContext::one_segment), a small dense blocking call (an allreduce without a
// compressor, a broadcast, a barrier; at most GRADCOMM_SHM_INLINE_BYTES, default 64 KiB)
// issued while nothing is queued runs to its end inside submit(), on the issuing thread,
// which would only wait for it otherwise. (An async call always queues: it returns at
// once and overlaps with what its caller does next, and threads that issue concurrently
// see each other's calls outstanding, as "Issuing threads" below needs.) The
// hand-over to the engine and back (two thread wake-ups, most of a small call's time on
// shared cores; bench/results/shm-2026-11-29.md) is then gone. Order holds: the queue is
// empty, and the engine starts nothing while such a call runs (inline_). Both sides use
// the runner and the transport only while holding drive_; on such a communicator the
// engine sleeps on a condition variable, not on the transport, so a caller never waits
// for it to wake. Every rank decides alone: the call runs the same steps either way.
//
// Shutdown. stop() interrupts a running call (its Op sees stopping(), fails with
// InvalidArgument here and tells the peers), fails every queued call the same
// way, and joins. It never waits on a peer.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "call.h"
#include "call_runner.h"
#include "fusion.h"

namespace gradcomm::detail {

// The issuer submit() records for calls made on this thread: the thread's id
// (this_thread_issuer, gettid), or the one an IssueAs (introspect.h) set for the
// time being (issuer_override; 0: none set).
int this_thread_issuer();
int& issuer_override();

class CallContext;

class Engine final : private GroupQueue {
 public:
  // `runner`: all the engine sees of its communicator (call_runner.h).
  Engine(CallRunner& runner, FusionConfig fusion);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Numbers the call (its ticket), queues it, wakes the engine. `blocking`:
  // the caller waits for it right away, so it may run here instead ("Calls on the
  // caller's thread"): then null is returned, or its error thrown.
  std::shared_ptr<WorkState> submit(Call&& call, bool blocking = false);
  // The Doorbell: a caller waits on the call with `ticket`; a group that holds it
  // stops waiting for more members.
  void ring(uint64_t ticket);
  // Fails outstanding work and joins the thread; idempotent.
  void stop();
  // Why a call was refused (submit: concurrent issuing threads), once one was.
  std::optional<std::string> refusal() const;
  bool refused() const { return refused_.load(std::memory_order_acquire); }
  // Refuses every later call and aborts the communicator on every rank with `why`,
  // as a refused concurrent issue does (a caller that checks its issuers itself).
  void refuse(const std::string& why);
  bool stopping() const { return stopping_.load(std::memory_order_relaxed); }
  // GRADCOMM_SHM_INLINE_BYTES: the largest call that may run on its caller's thread
  // ("Calls on the caller's thread" above; 0: none). Read once per process.
  static int64_t inline_bytes();
  // A caller is blocked waiting on a call (Doorbell::waited_on): waits poll first.
  bool waited_on() const { return doorbell_->waited_on(); }
  const FusionConfig& fusion() const { return fusion_; }
  // CPU time the engine thread has used so far, in seconds (its thread CPU clock; the
  // final figure once it ended). Thread-safe. Stats::engine_cpu_s.
  double cpu_seconds() const;

 private:
  void loop();
  // One turn of the loop: run the head call or group, or sleep until there is one.
  void step(uint64_t generation, uint64_t flush);
  // Progresses the transport and sleeps until `until`, new work, a doorbell or I/O.
  // `seen_generation`: the queue's generation when the loop last looked.
  void idle(Clock::time_point until, uint64_t seen_generation);
  // GroupQueue: the first calls of the queue (stable pointers: deque growth keeps
  // elements in place), and what a fused group may take of them.
  std::vector<Call*> head(size_t max) override;
  uint32_t can_take(uint32_t planned, const FusionClass& cls, uint64_t first_ticket) override;
  size_t queued();
  // Pops `n` calls and completes their works (after Stats are published).
  void finish(size_t n, std::exception_ptr error);
  // Under mutex_: the head call leaves the queue (keeps the issuer's count).
  Call pop_front_locked();
  // Under mutex_: the refusal of `call` if another thread's collectives are
  // outstanding (see "Issuing threads" above).
  std::optional<std::string> concurrent_issue_locked(const Call& call) const;
  void fail_queued();
  // Whether `call` may run on its caller's thread ("Calls on the caller's thread").
  bool may_run_inline(const Call& call) const;
  // Runs `call`, which submit() kept out of the queue, here; throws its error.
  void run_inline(Call& call);
  // A blocking call that may run inline and finds nothing queued: takes its ticket and
  // runs it (true). False, touching nothing, when anything needs submit()'s full path.
  bool try_run_blocking(Call& call);
  // Wakes the engine: new work, a doorbell, a refusal or stop (after generation_ moved).
  void wake();

  CallRunner& runner_;
  CallContext& comm_;
  const FusionConfig fusion_;
  std::shared_ptr<Doorbell> doorbell_;
  Clock::time_point last_finish_{};     // engine thread only: when the last call a caller waited on ended

  const bool one_segment_;  // CallContext::one_segment: calls may run inline; the engine sleeps on cv_
  const int64_t inline_limit_;  // inline_bytes() on such a communicator (read at creation), else 0
  // Held by whoever uses the runner or the transport: the engine while it runs calls and
  // progresses, a caller while its call runs inline. Never held while sleeping.
  std::mutex drive_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;  // generation_ moved, or inline_ cleared
  bool inline_ = false;         // a caller runs a call inline: the engine starts nothing
  std::deque<Call> queue_;
  int issuer_ = 0;               // the thread (tid) whose collectives are outstanding
  size_t issuer_outstanding_ = 0;  // how many of them are queued or running
  std::string refusal_;          // set once, by the first refused call
  std::atomic<bool> refused_{false};
  uint64_t next_ticket_ = 1;
  uint64_t flush_ticket_ = 0;  // waits asked groups holding calls up to here to close
  uint64_t generation_ = 0;    // bumped by submit, ring and stop: the engine never sleeps through one
  bool stop_ = false;
  std::atomic<bool> stopping_{false};
  clockid_t cpu_clock_{};                 // the engine thread's CPU clock, while it runs
  std::atomic<int64_t> final_cpu_ns_{-1};  // its CPU time once it ended, else -1
  std::thread thread_;
};

}  // namespace gradcomm::detail
