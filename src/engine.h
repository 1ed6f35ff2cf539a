// Engine: the thread a communicator owns that runs its calls, one after another
// in issue order, and drives the transport in between.
//
//   caller threads                      engine thread
//   --------------                      -------------
//   validate, queue a Call,             loop: take the head call (or a fused group
//   return a Work          ----------->       of calls, fusion.h), run it inside an
//   Work::wait() blocks on                    Op, publish Stats, complete its Works;
//   the WorkState                             nothing queued: progress the transport
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
// Shutdown. stop() interrupts a running call (its Op sees stopping(), fails with
// InvalidArgument here and tells the peers), fails every queued call the same
// way, and joins. It never waits on a peer.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "call.h"
#include "fusion.h"

namespace gradcomm::detail {

class CommunicatorImpl;

class Engine {
 public:
  Engine(CommunicatorImpl& comm, FusionConfig fusion);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Numbers the call (its ticket), queues it, wakes the engine.
  std::shared_ptr<WorkState> submit(Call call);
  // The Doorbell: a caller waits on the call with `ticket`; a group that holds it
  // stops waiting for more members.
  void ring(uint64_t ticket);
  // Fails outstanding work and joins the thread; idempotent.
  void stop();
  bool stopping() const { return stopping_.load(std::memory_order_relaxed); }
  // A caller is blocked waiting on a call (Doorbell::waited_on): waits poll first.
  bool waited_on() const { return doorbell_->waited_on(); }
  const FusionConfig& fusion() const { return fusion_; }

 private:
  void loop();
  // One turn of the loop: run the head call or group, or sleep until there is one.
  void step(uint64_t generation, uint64_t flush);
  // Progresses the transport and sleeps until `until`, new work, a doorbell or I/O.
  // `seen_generation`: the queue's generation when the loop last looked.
  void idle(Clock::time_point until, uint64_t seen_generation);
  // The first calls of the queue (stable pointers: deque growth keeps elements in place).
  std::vector<Call*> head(size_t max);
  size_t queued();
  // Runs the head call alone.
  void run_one(Call& call);
  // Rank 0: runs the group of `members`; the others: learns the group from rank
  // 0's plan. Returns how many calls it consumed.
  size_t run_group(std::span<Call* const> view, const FusionClass& cls);
  // Pops `n` calls and completes their works (after Stats are published).
  void finish(size_t n, std::exception_ptr error);
  void fail_queued();

  CommunicatorImpl& comm_;
  const FusionConfig fusion_;
  std::shared_ptr<Doorbell> doorbell_;
  std::vector<uint8_t> fusion_buffer_;  // engine thread only; kept between groups
  Clock::time_point last_finish_{};     // engine thread only: when the last call a caller waited on ended

  std::mutex mutex_;
  std::deque<Call> queue_;
  uint64_t next_ticket_ = 1;
  uint64_t flush_ticket_ = 0;  // waits asked groups holding calls up to here to close
  uint64_t generation_ = 0;    // bumped by submit, ring and stop: the engine never sleeps through one
  bool stop_ = false;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace gradcomm::detail
