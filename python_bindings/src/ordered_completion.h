// OrderedCompleter: completes, one thread removed from the communicator's engine,
// the calls that a framework waits on through futures whose callbacks may issue
// further calls. Two users, one protocol: the "gradcomm" torch backend completes
// its c10d Works with it (torch_backend/work.h), and the DDP hook its torch
// futures (module.cc's complete_in_order, used by gradcomm/torch.py). It knows
// nothing of torch: an item is two steps, settle() and complete().
//
// Settling. The communicator's engine runs calls in issue order and completes them
// in that order, so one thread (the waiter) settles the items front to back and
// never waits longer than the call it is on; the user pushes an item once its calls
// are issued, in issue order (the torch backend under its issue lock), so the
// waiter's order is the engine's. settle() waits on the item's calls and runs any
// last local step (a copy out of a staging buffer). It never runs user code.
//
// Completing. complete() hands the result out: it marks a future, and marking a
// future runs its callbacks (DDP's reducer, a .then), and a callback may issue
// another call and wait on it (torch's powerSGD_hook does), which the waiter must
// be free to settle. So the waiter hands each settled item to a completion thread,
// which completes it (running its callbacks, as gloo's worker threads do).
//
// Which completion runs when. Calls that callbacks issue must be issued in the
// same order on every rank, so callbacks must not race one another:
//   - an item pushed from outside the completion threads (a "top-level" one) is
//     completed only once the previous top-level item's completion has returned,
//     callbacks and all, so callbacks run one item after another, in issue order;
//   - an item pushed by a callback is completed as soon as it settles, beside the
//     completion that pushed it, which may be waiting on it.
// So a callback that waits on a call it issued never blocks a thread that must
// complete that call, and every rank runs the same callbacks in the same order. A
// callback that waits on a later top-level item (pushed elsewhere) would wait
// forever under this rule; after kStall the next top-level item is completed beside
// it anyway: it then runs late, never not at all. Completion threads are a pool
// that grows when every thread is busy and keeps its threads for reuse, so it is as
// large as the deepest chain of blocked callbacks, plus one.
//
// The listener. A user that orders its own issuing around completions (the torch
// backend holds top-level ops until earlier callbacks return: issue_order.cc) is
// told, on a completer thread and without the completer's lock, after every
// completion returns (deadline false), and at a deadline it set with wake_at (true).
//
// Shutdown. The user first fails its outstanding calls (the torch backend destroys
// its communicator, which fails every outstanding gradcomm work at once, never
// waiting on a peer). Then the completer is destroyed: the waiter drains what is
// queued (each settle now returns at once), the completion threads complete what it
// hands them (a callback blocked on one of those calls gets its error and returns),
// and the destructor joins them all. A callback blocked on something else (another
// group, a lock) holds up shutdown as long as it blocks, as with gloo. Threads reach
// only the shared state and the items they hold, never the completer's owner, so if
// the last reference to the owner is dropped on one of them (a future callback
// holding it), that thread is detached instead of joined and exits once the queues
// are drained. A completer that is never destroyed (the DDP hook's, one per
// process) keeps its threads for the process's life.
//
// Drain. A completer that is never destroyed (the DDP hook's) still runs completions
// when the process ends. A completion that marks a torch future wakes its waiter
// before it has returned (torch then drops the future's callbacks, taking the GIL);
// if the waiter ends the program meanwhile, the completion takes the GIL during the
// interpreter's finalization, which ends the thread inside torch's noexcept code and
// aborts the process ("terminate called without an active exception"). So the
// owner's shutdown (gradcomm.shutdown(), also run at exit) fails the outstanding
// calls and then drains: waits, bounded, until every pushed item has completed.
//
// fork(): the child has none of the threads. A child must not touch the parent's
// completer (its lock may have been held at the fork); it leaks it and makes a new
// one (module.cc's forget_after_fork).
#pragma once

#include <chrono>
#include <functional>
#include <memory>

namespace gradcomm::python {

class OrderedCompleter {
 public:
  // One pushed result on its way out. Neither step may throw.
  class Item {
   public:
    virtual ~Item() = default;
    // On the waiter, in push order: waits on the item's calls, runs its local step.
    virtual void settle() = 0;
    // On a completion thread: hands the result out (may run user code that pushes
    // items and waits on them). The item is destroyed on that thread right after,
    // before the listener hears of it.
    virtual void complete() = 0;
  };
  // See "The listener" above; may be empty.
  using Listener = std::function<void(bool deadline)>;

  explicit OrderedCompleter(Listener listener = nullptr);
  ~OrderedCompleter();  // see "Shutdown" above
  OrderedCompleter(const OrderedCompleter&) = delete;
  OrderedCompleter& operator=(const OrderedCompleter&) = delete;

  // Queues an item whose calls the caller has just issued; `top_level`: pushed
  // outside the completion threads (or on such a caller's behalf: issue_order.cc).
  void push(std::unique_ptr<Item> item, bool top_level);
  // Whether the calling thread is one of this completer's completion threads (a
  // future callback runs there).
  bool on_completion_thread() const;
  // Calls the listener with deadline=true at `when` (or soon after: the waiter
  // checks between items); a later call replaces an earlier deadline.
  void wake_at(std::chrono::steady_clock::time_point when);
  // Waits, at most `timeout`, until every item pushed so far has completed and its
  // callbacks have returned; false if some had not (or when called on one of the
  // completion threads, which would wait on itself). For a process about to end,
  // after its calls were failed (see "Drain" above).
  bool drain(std::chrono::milliseconds timeout);

  // How long a top-level item's completion may hold up the next one (see above).
  static constexpr std::chrono::seconds kStall{5};

 private:
  struct State;  // shared with the threads, which may outlive the completer
  static void wait_loop(std::shared_ptr<State> state);
  static void completion_loop(std::shared_ptr<State> state);
  static void release_top_level(const std::shared_ptr<State>& state);
  static void make_runnable(const std::shared_ptr<State>& state, std::unique_ptr<Item> item, bool top_level);
  static void start_thread(const std::shared_ptr<State>& state, std::function<void()> run);

  std::shared_ptr<State> state_;
};

}  // namespace gradcomm::python
