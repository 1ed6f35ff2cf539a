#include "ordered_completion.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

namespace gradcomm::python {

using Clock = std::chrono::steady_clock;

// Shared by the completer and its threads, which outlive it when it is destroyed
// on one of them. The threads are detached; `threads` counts those still running.
struct OrderedCompleter::State {
  std::mutex mutex;
  std::condition_variable issued_cv;    // the waiter: an item was pushed, stop, or a top-level completion ended
  std::condition_variable runnable_cv;  // completion threads: an item may complete, or the waiter is done
  std::condition_variable exited_cv;    // the destructor: a thread exited
  std::condition_variable drained_cv;   // drain(): in_flight reached 0
  std::deque<std::pair<std::unique_ptr<Item>, bool>> issued;    // to settle, in push order; top-level?
  std::deque<std::unique_ptr<Item>> waiting;                    // settled top-level items held up by an earlier one
  std::deque<std::pair<std::unique_ptr<Item>, bool>> runnable;  // to complete; top-level?
  size_t top_level_running = 0;
  size_t in_flight = 0;  // pushed and not yet completed (complete(), the item's end, the listener)
  Clock::time_point top_level_started;  // of the last one made runnable
  Clock::time_point hold_deadline = Clock::time_point::max();
  bool rearmed = false;  // wake_at moved hold_deadline: the waiter recomputes its wait
  Listener listener;     // set before the threads start, then only read
  size_t threads = 0;    // running: the waiter and the completion threads
  size_t idle = 0;       // completion threads waiting for a runnable item
  bool stop = false;
  bool waiter_done = false;  // stopped and drained: nothing more will become runnable
};

namespace {
// The completer state whose completion thread this is, if any: an item pushed here
// is a callback's, and the completer's destructor must not wait for this thread.
thread_local const void* t_completer_state = nullptr;
}  // namespace

OrderedCompleter::OrderedCompleter(Listener listener) : state_(std::make_shared<State>()) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->listener = std::move(listener);
  start_thread(state_, [state = state_] { wait_loop(state); });
  // One completion thread always, since make_runnable may fail to start more.
  start_thread(state_, [state = state_] { completion_loop(state); });
}

OrderedCompleter::~OrderedCompleter() {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->stop = true;
  state_->issued_cv.notify_all();
  // Dropped from a future callback: this thread is one of ours (the others may need
  // it to finish), so the threads drain the queues and exit on their own.
  if (t_completer_state == state_.get()) return;
  state_->exited_cv.wait(lock, [&] { return state_->threads == 0; });
}

void OrderedCompleter::push(std::unique_ptr<Item> item, bool top_level) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->issued.emplace_back(std::move(item), top_level);
    ++state_->in_flight;
  }
  state_->issued_cv.notify_one();
}

bool OrderedCompleter::on_completion_thread() const { return t_completer_state == state_.get(); }

bool OrderedCompleter::drain(std::chrono::milliseconds timeout) {
  if (on_completion_thread()) return false;
  std::unique_lock<std::mutex> lock(state_->mutex);
  return state_->drained_cv.wait_for(lock, timeout, [&] { return state_->in_flight == 0; });
}

void OrderedCompleter::wake_at(Clock::time_point when) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->hold_deadline = when;
    state_->rearmed = true;
  }
  state_->issued_cv.notify_one();
}

// Starts a detached thread running `run`, counted in state->threads. Caller holds state->mutex.
void OrderedCompleter::start_thread(const std::shared_ptr<State>& state, std::function<void()> run) {
  std::thread(std::move(run)).detach();  // throws std::system_error when no thread can be made
  ++state->threads;
}

// Queues an item for a completion thread, starting one when none is idle (when none
// can be started, one of those running takes it once it is free). Caller holds state->mutex.
void OrderedCompleter::make_runnable(const std::shared_ptr<State>& state, std::unique_ptr<Item> item,
                                     bool top_level) {
  if (state->idle <= state->runnable.size()) {
    try {
      start_thread(state, [state] { completion_loop(state); });
    } catch (const std::system_error&) {
      // One of the running completion threads takes it when it is free.
    }
  }
  if (top_level) {
    ++state->top_level_running;
    state->top_level_started = Clock::now();
  }
  state->runnable.emplace_back(std::move(item), top_level);
  state->runnable_cv.notify_one();
}

// Makes the waiting top-level items runnable that may run now. Caller holds state->mutex.
void OrderedCompleter::release_top_level(const std::shared_ptr<State>& state) {
  while (!state->waiting.empty() &&
         (state->top_level_running == 0 || Clock::now() >= state->top_level_started + kStall)) {
    make_runnable(state, std::move(state->waiting.front()), true);
    state->waiting.pop_front();
  }
}

void OrderedCompleter::wait_loop(std::shared_ptr<State> state) {
  std::unique_lock<std::mutex> lock(state->mutex);
  // It also holds the top-level items back, so it stays until they are out.
  const auto drained = [&] { return state->stop && state->issued.empty() && state->waiting.empty(); };
  const auto wake = [&] { return !state->issued.empty() || drained() || state->rearmed; };
  for (;;) {
    state->rearmed = false;
    // Held-up top-level items wake at their holder's end (issued_cv) or at kStall.
    const auto until = state->waiting.empty() ? state->hold_deadline
                                              : std::min(state->top_level_started + kStall, state->hold_deadline);
    if (until == Clock::time_point::max()) {
      state->issued_cv.wait(lock, wake);
    } else {
      state->issued_cv.wait_until(lock, until, wake);
    }
    if (!state->waiting.empty()) release_top_level(state);
    if (Clock::now() >= state->hold_deadline) {
      state->hold_deadline = Clock::time_point::max();
      lock.unlock();
      if (state->listener) state->listener(/*deadline=*/true);
      lock.lock();
    }
    if (state->issued.empty()) {
      if (drained()) break;
      continue;
    }
    auto [item, top_level] = std::move(state->issued.front());
    state->issued.pop_front();
    lock.unlock();
    item->settle();
    lock.lock();
    if (top_level) {
      state->waiting.push_back(std::move(item));
      release_top_level(state);
    } else {
      make_runnable(state, std::move(item), false);  // its issuer may be waiting on it
    }
  }
  state->waiter_done = true;
  state->runnable_cv.notify_all();
  --state->threads;
  state->exited_cv.notify_all();
}

void OrderedCompleter::completion_loop(std::shared_ptr<State> state) {
  t_completer_state = state.get();
  std::unique_lock<std::mutex> lock(state->mutex);
  for (;;) {
    ++state->idle;
    state->runnable_cv.wait(lock, [&] { return state->waiter_done || !state->runnable.empty(); });
    --state->idle;
    if (state->runnable.empty()) break;  // the waiter is done and nothing is left
    auto [item, top_level] = std::move(state->runnable.front());
    state->runnable.pop_front();
    lock.unlock();
    item->complete();
    item.reset();  // and with it what the future's callbacks held, before the lock is taken
    if (state->listener) state->listener(/*deadline=*/false);
    lock.lock();
    if (--state->in_flight == 0) state->drained_cv.notify_all();
    if (top_level) {
      --state->top_level_running;
      release_top_level(state);
      state->issued_cv.notify_one();  // the waiter may be held up by this one, or stopping
    }
  }
  --state->threads;
  state->exited_cv.notify_all();
}

}  // namespace gradcomm::python
