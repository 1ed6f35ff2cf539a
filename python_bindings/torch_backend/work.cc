#include "work.h"

#include <fmt/format.h>
#include <pybind11/pybind11.h>

#include <ATen/core/ivalue.h>

#include <thread>

#include "gradcomm/errors.h"

namespace gradcomm::torch_backend {

namespace py = pybind11;

PyObject* PythonError::python_type() {
  try {
    // gradcomm.torch imports gradcomm, which defines the classes, before it loads
    // this module; the package keeps them for the interpreter's life.
    py::object cls = py::module_::import("gradcomm").attr(kind_.c_str());
    if (PyExceptionClass_Check(cls.ptr())) return cls.ptr();
  } catch (const py::error_already_set&) {
    // No such package or class: a plain RuntimeError still carries the message.
  }
  return PyExc_RuntimeError;
}

std::exception_ptr as_torch_error(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return std::make_exception_ptr(PythonError(error_code_name(e.code()), e.what()));
  } catch (...) {
    return error;
  }
}

void rethrow_as_torch_error() { std::rethrow_exception(as_torch_error(std::current_exception())); }

GradcommWork::GradcommWork(int rank, c10d::OpType type, const char* op_name, std::vector<at::Tensor> outputs,
                           std::vector<at::Tensor> keep, std::function<void()> finish, int issuer)
    : c10d::Work(rank, type),
      op_name_(op_name),
      outputs_(std::move(outputs)),
      keep_(std::move(keep)),
      finish_(std::move(finish)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
      issuer_(issuer) {}

void GradcommWork::set_works(std::vector<std::shared_ptr<gradcomm::Work>> works, std::exception_ptr error) {
  works_ = std::move(works);
  error_ = std::move(error);
  issued_.store(true, std::memory_order_release);
}

bool GradcommWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lock, [&] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
    throw std::runtime_error(fmt::format("gradcomm: {} did not complete within the {} ms given to Work.wait() "
                                         "(it is still running; wait again, or the peers are stuck)",
                                         op_name_, timeout.count()));
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

std::vector<at::Tensor> GradcommWork::result() { return outputs_; }

c10::intrusive_ptr<c10::ivalue::Future> GradcommWork::getFuture() {
  handed_out_.store(true, std::memory_order_release);
  return future_;
}

void GradcommWork::settle() {
  // Every call is waited on, even after one failed: the tensors in keep_ must
  // outlive all of them.
  for (auto& work : works_) {
    try {
      work->wait();
    } catch (...) {
      if (!error_) error_ = as_torch_error(std::current_exception());
    }
  }
  if (!error_ && finish_) {
    try {
      finish_();
    } catch (...) {
      error_ = as_torch_error(std::current_exception());
    }
  }
  works_.clear();
  keep_.clear();
  finish_ = nullptr;
  settled_.store(true, std::memory_order_release);
}

void GradcommWork::complete() {
  try {
    if (error_) {
      future_->setError(error_);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  } catch (...) {
    // The Future's callbacks report their own errors through the futures they
    // return; nothing here may stop the Work from completing.
  }
  returned_.store(true, std::memory_order_release);  // before finish() wakes wait(): a caller may issue next
  finish(error_);
}

namespace {
// The Completer state whose completion thread this is, if any: an op issued here is
// a callback's, and the Completer's destructor must not wait for this thread.
thread_local const void* t_completer_state = nullptr;
// The issuer of the work this completion thread is completing (its callbacks' ops are its).
thread_local int t_completing_issuer = 0;
}  // namespace

Completer::Completer(std::shared_ptr<CompletionListener> listener) : state_(std::make_shared<State>()) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->listener = std::move(listener);
  start_thread(state_, [state = state_] { wait_loop(state); });
  // One completion thread always, since make_runnable may fail to start more.
  start_thread(state_, [state = state_] { completion_loop(state); });
}

Completer::~Completer() {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->stop = true;
  state_->issued_cv.notify_all();
  // Dropped from a future callback: this thread is one of ours (the others may need
  // it to finish), so the threads drain the queues and exit on their own.
  if (t_completer_state == state_.get()) return;
  state_->exited_cv.wait(lock, [&] { return state_->threads == 0; });
}

void Completer::push(c10::intrusive_ptr<GradcommWork> work, bool top_level) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->issued.emplace_back(std::move(work), top_level);
  }
  state_->issued_cv.notify_one();
}

bool Completer::on_completion_thread() const { return t_completer_state == state_.get(); }

int Completer::completing_issuer() { return t_completing_issuer; }

void Completer::wake_at(std::chrono::steady_clock::time_point when) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->hold_deadline = when;
    state_->rearmed = true;
  }
  state_->issued_cv.notify_one();
}

void Completer::start_thread(const std::shared_ptr<State>& state, std::function<void()> run) {
  std::thread(std::move(run)).detach();  // throws std::system_error when no thread can be made
  ++state->threads;
}

void Completer::make_runnable(const std::shared_ptr<State>& state, c10::intrusive_ptr<GradcommWork> work,
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
    state->top_level_started = std::chrono::steady_clock::now();
  }
  state->runnable.emplace_back(std::move(work), top_level);
  state->runnable_cv.notify_one();
}

void Completer::release_top_level(const std::shared_ptr<State>& state) {
  while (!state->waiting.empty() &&
         (state->top_level_running == 0 || std::chrono::steady_clock::now() >= state->top_level_started + kStall)) {
    make_runnable(state, std::move(state->waiting.front()), true);
    state->waiting.pop_front();
  }
}

void Completer::wait_loop(std::shared_ptr<State> state) {
  std::unique_lock<std::mutex> lock(state->mutex);
  // It also holds the top-level works back, so it stays until they are out.
  const auto drained = [&] { return state->stop && state->issued.empty() && state->waiting.empty(); };
  const auto wake = [&] { return !state->issued.empty() || drained() || state->rearmed; };
  for (;;) {
    state->rearmed = false;
    // Held-up top-level works wake at their holder's end (issued_cv) or at kStall.
    const auto until = state->waiting.empty() ? state->hold_deadline
                                              : std::min(state->top_level_started + kStall, state->hold_deadline);
    if (until == std::chrono::steady_clock::time_point::max()) {
      state->issued_cv.wait(lock, wake);
    } else {
      state->issued_cv.wait_until(lock, until, wake);
    }
    if (!state->waiting.empty()) release_top_level(state);
    if (std::chrono::steady_clock::now() >= state->hold_deadline) {
      state->hold_deadline = std::chrono::steady_clock::time_point::max();
      const auto listener = state->listener;
      lock.unlock();
      listener->notify(/*deadline=*/true);
      lock.lock();
    }
    if (state->issued.empty()) {
      if (drained()) break;
      continue;
    }
    auto [work, top_level] = std::move(state->issued.front());
    state->issued.pop_front();
    lock.unlock();
    work->settle();
    lock.lock();
    if (top_level) {
      state->waiting.push_back(std::move(work));
      release_top_level(state);
    } else {
      make_runnable(state, std::move(work), false);  // its issuer may be waiting on it
    }
  }
  state->waiter_done = true;
  state->runnable_cv.notify_all();
  --state->threads;
  state->exited_cv.notify_all();
}

void Completer::completion_loop(std::shared_ptr<State> state) {
  t_completer_state = state.get();
  std::unique_lock<std::mutex> lock(state->mutex);
  for (;;) {
    ++state->idle;
    state->runnable_cv.wait(lock, [&] { return state->waiter_done || !state->runnable.empty(); });
    --state->idle;
    if (state->runnable.empty()) break;  // the waiter is done and nothing is left
    auto [work, top_level] = std::move(state->runnable.front());
    state->runnable.pop_front();
    lock.unlock();
    t_completing_issuer = work->issuer();
    work->complete();
    t_completing_issuer = 0;
    work.reset();  // and with it what the Future's callbacks held, before the lock is taken
    state->listener->notify(/*deadline=*/false);
    lock.lock();
    if (top_level) {
      --state->top_level_running;
      release_top_level(state);
      state->issued_cv.notify_one();  // the waiter may be held up by this one, or stopping
    }
  }
  --state->threads;
  state->exited_cv.notify_all();
}

}  // namespace gradcomm::torch_backend
