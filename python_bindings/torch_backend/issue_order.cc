// Issue order: the one rule by which the gradcomm process group orders the ops that
// its threads and its future callbacks issue, so that every rank issues them alike.
//
// Ranks pair calls by issue order. Ops come from three places: the thread that runs
// the program (or autograd's, for DDP), future callbacks on the Completer's
// completion threads (work.h: torch's powerSGD_hook issues its P and Q allreduces
// in `.then()` callbacks), and a callback that torch's then() runs on the caller's
// thread because the Future was already done. With NCCL a CUDA op's Future is done
// once the op is enqueued, so its callbacks run at once, and their ops follow it
// before the program issues its next one. Here an op completes later, on another
// thread; left alone, a callback's ops would race the program's next ops, and the
// race ends differently on each rank (DDP with several buckets and powerSGD_hook:
// the callbacks of bucket 1 against the allreduce of bucket 2). So:
//
//   1. An op a callback issues (on a completion thread) is issued at once. It
//      belongs to the program order of the op whose completion runs the callback.
//   2. Any other op (top-level) is issued at once, unless an earlier op whose
//      Future was handed out (getFuture: only then can a callback be attached) has
//      not yet returned from its completion, callbacks and all, or an earlier op is
//      held. Then it is held, and issued (in order, from the completion thread that
//      ends the hold) as soon as none is. So a callback's ops follow the op it was
//      attached to and precede every later top-level op on every rank, whether the
//      op was done before the program issued its next one or not: NCCL's order.
//      Ops whose Futures nobody asked for hold nothing (plain async calls and
//      waits, fusion of small calls unchanged).
//   3. A top-level op on one thread while another thread's ops (or their
//      callbacks') are open is two threads issuing at once: where those ops are
//      all settled (the engine is done with them) and only their completions are
//      still running, the new op waits until they return (a thread woken by a
//      Future may run ahead of that Future's remaining callbacks); where any is
//      held, queued or running, the op is refused and the communicator aborted on
//      every rank (InvalidArgument naming both threads), as src/engine.h does for
//      the library's own callers. Calls are never paired across threads.
//
// A hold ends at the latest after the group's timeout: an op held that long (its
// predecessor's callback waits on it, which this rule makes it wait for forever)
// fails, and with it the communicator on every rank, with a message that says so.
// The engine's own concurrent-issuer check sees every op of one program order as
// one issuer's (detail::IssueAs); rule 3 stands in for it. docs/fault-model.md,
// "PyTorch: futures, callbacks and the optimizer", states the rule for users.
#include <fmt/format.h>

#include <algorithm>

#include "gradcomm/errors.h"
#include "introspect.h"  // IssueAs, refuse_calls, thread_issuer
#include "process_group.h"

namespace gradcomm::torch_backend {
c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::start(c10d::OpType type, const char* op, Issue issue,
                                                           std::vector<at::Tensor> outputs,
                                                           std::vector<at::Tensor> keep,
                                                           std::function<void()> finish) {
  std::unique_lock<std::mutex> lock(issue_mutex_);
  const auto shut = [&] {
    if (comm_) return;
    throw std::runtime_error(fmt::format("gradcomm: {} on a process group that was shut down (destroyed, or the "
                                         "interpreter is exiting)",
                                         op));
  };
  shut();
  const bool callback = completer_->on_completion_thread();
  const int issuer = callback ? Completer::completing_issuer() : detail::thread_issuer();
  if (!callback) {
    one_issuer(lock, issuer, op);
    shut();
  }
  if (coalescing_.active) coalescing_.outputs.insert(coalescing_.outputs.end(), outputs.begin(), outputs.end());
  Held held{c10::make_intrusive<GradcommWork>(getRank(), type, op, std::move(outputs), std::move(keep),
                                              std::move(finish), issuer),
            std::move(issue), coalescing_.active ? coalescing_.calls : nullptr};
  c10::intrusive_ptr<GradcommWork> work = held.work;
  open_.push_back(work);
  if (!callback && (!held_.empty() || holding())) {  // rule 2
    if (held_.empty()) {
      held_since_ = std::chrono::steady_clock::now();
      completer_->wake_at(held_since_ + hold_limit_);
    }
    held_.push_back(std::move(held));
    return work;
  }
  issue_now(held, /*top_level=*/!callback, /*rethrow=*/true);
  return work;
}

void ProcessGroupGradcomm::issue_now(Held& op, bool top_level, bool rethrow) {
  Calls works;
  std::exception_ptr error;
  {
    detail::IssueAs as(op.work->issuer());
    try {
      op.issue(works);
    } catch (...) {
      // Calls issued before the failing one are in flight: the work waits on them and
      // keeps its tensors until they are done; then it fails with this error.
      error = as_torch_error(std::current_exception());
    }
  }
  if (op.coalesce_into) op.coalesce_into->insert(op.coalesce_into->end(), works.begin(), works.end());
  op.work->set_works(std::move(works), error);
  op.issue = nullptr;  // and what it captured
  completer_->push(op.work, top_level);
  if (error && rethrow) std::rethrow_exception(error);
}

bool ProcessGroupGradcomm::holding() const {
  return std::any_of(open_.begin(), open_.end(),
                     [](const auto& w) { return w->issued() && w->future_handed_out() && !w->returned(); });
}

void ProcessGroupGradcomm::prune_open() {
  std::erase_if(open_, [](const auto& w) { return w->returned(); });
}

void ProcessGroupGradcomm::one_issuer(std::unique_lock<std::mutex>& lock, int issuer, const char* op) {
  const auto deadline = std::chrono::steady_clock::now() + hold_limit_;
  for (;;) {
    prune_open();
    size_t others = 0, in_flight = 0;
    int other = 0;
    for (const auto& w : open_) {
      if (w->issuer() == issuer) continue;
      ++others;
      other = w->issuer();
      if (!w->settled()) ++in_flight;
    }
    if (others == 0) return;
    if (in_flight > 0) {
      refuse(fmt::format("{} issued on thread {} while {} op(s) that thread {} issued (or their future callbacks) "
                         "are outstanding: ranks pair calls by issue order, and threads issuing concurrently make "
                         "that order differ between ranks (calls of one shape would pair across threads, with wrong "
                         "results). Wait on one thread's ops before another thread issues, or issue every op from "
                         "one thread (future callbacks may issue: their ops follow the op they are attached to). "
                         "The op is refused and the communicator aborted on every rank",
                         op, issuer, in_flight, other));
    }
    // Settled, only their completions (callbacks) still running: they return shortly.
    if (returned_cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      prune_open();
      if (std::none_of(open_.begin(), open_.end(), [&](const auto& w) { return w->issuer() != issuer; })) return;
      refuse(fmt::format("{} issued on thread {} waited {} ms for the future callbacks of thread {}'s ops to "
                         "return, and they did not (a callback blocked on a later op?); the op is refused and the "
                         "communicator aborted on every rank",
                         op, issuer, hold_limit_.count(), other));
    }
    if (!comm_) return;  // shut down meanwhile: start() says so
  }
}

void ProcessGroupGradcomm::refuse(const std::string& why) {
  detail::refuse_calls(*comm_, why);
  std::rethrow_exception(as_torch_error(std::make_exception_ptr(InvalidArgument(
      fmt::format("rank {}: {}", getRank(), why)))));
}

void ProcessGroupGradcomm::on_completion(bool deadline) {
  std::lock_guard<std::mutex> lock(issue_mutex_);
  returned_cv_.notify_all();
  if (!comm_) return;
  prune_open();
  const auto now = std::chrono::steady_clock::now();
  if (deadline && !held_.empty() && holding() && now >= held_since_ + hold_limit_) {
    const std::string why = fmt::format(
        "{} was held {} ms, the group's timeout, behind an earlier op whose future callbacks have not returned: "
        "an op issued outside a callback waits until the callbacks of earlier ops (whose futures were asked for) "
        "return, so that their ops come first on every rank; a callback that waits on a later op waits forever. "
        "The held ops fail, and the communicator is aborted on every rank",
        held_.front().work->op_name(), hold_limit_.count());
    detail::refuse_calls(*comm_, why);
    const auto error = as_torch_error(std::make_exception_ptr(InvalidArgument(
        fmt::format("rank {}: {}", getRank(), why))));
    for (Held& op : held_) {
      op.work->set_works({}, error);
      completer_->push(op.work, /*top_level=*/true);
    }
    held_.clear();
    return;
  }
  while (!held_.empty() && !holding()) {
    Held op = std::move(held_.front());
    held_.pop_front();
    issue_now(op, /*top_level=*/true, /*rethrow=*/false);
    held_since_ = now;
  }
  if (!held_.empty() && deadline) completer_->wake_at(held_since_ + hold_limit_);
}

}  // namespace gradcomm::torch_backend
