// GradcommWork: the c10d::Work a ProcessGroupGradcomm op returns, and the
// Completer that finishes it.
//
// An op issues one or more gradcomm *_async calls and gets their gradcomm::Works.
// Some ops have a last local step once the wire part is done (copy a gathered
// buffer into the caller's list of tensors, copy this rank's chunk of a
// reduce-scatter out, copy a contiguous staging tensor back into a strided one);
// c10d's contract is that the output tensors and the Future are final when the
// Work completes, so that step must run before completion, off the caller's thread.
//
// Completion. Each process group has a Completer: its ops are items of an
// OrderedCompleter (../src/ordered_completion.h, which explains the protocol: one
// waiter settles them in issue order, completion threads complete them, top-level
// ops one after another, a callback's ops at once, kStall). The process group
// pushes a work while it holds its issue lock, so the waiter's order is the
// engine's. settle() waits on the op's gradcomm works and runs the local step;
// complete() marks the Future (running its callbacks) and then completes the
// c10d::Work, which wakes wait(). Future before Work: a caller that returns from
// wait() finds the Future already done.
//
// Which op is issued when: collectives that callbacks issue would race those that
// other threads issue meanwhile (DDP's backward issuing its next buckets while a
// PowerSGD callback issues its P and Q allreduces). The process group orders them
// (issue_order.cc): a top-level op waits, unissued, until the callbacks of earlier
// ops whose Futures were handed out have returned, so a callback's ops follow the
// op it was attached to on every rank. The Completer tells it when a completion
// returns (CompletionListener) and wakes it at a hold's deadline (wake_at).
//
// Errors. A gradcomm error (MismatchError, PeerFailure, TimeoutError, ...) fails the
// Work and the Future as a PythonError (below): Python sees the library's class
// (gradcomm.MismatchError, ...) and its message (rank, op, sequence number,
// expected vs found) from Work.wait(), Future.wait() and DDP's backward alike.
//
// Shutdown. The process group destroys its communicator first: that fails every
// outstanding gradcomm work at once (never waiting on a peer). Then the Completer
// is destroyed, which drains and joins its threads (ordered_completion.h,
// "Shutdown"); they reach only the works they hold and the listener, which the
// group empties first, never the group itself.
#pragma once

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gradcomm/communicator.h"
#include "ordered_completion.h"

namespace gradcomm::torch_backend {

class GradcommWork : public c10d::Work {
 public:
  // `works`: the gradcomm calls, in issue order. `outputs`: what result() and the
  // Future give (the op's output tensors). `keep`: tensors the calls read or write
  // (inputs, staging buffers), held until completion. `finish`: the local step, run
  // after every call succeeded (may be empty).
  // `issuer`: the thread whose program order the op belongs to (issue_order.cc). The
  // works are set when the op is issued (set_works), which may be after construction.
  GradcommWork(int rank, c10d::OpType type, const char* op_name, std::vector<at::Tensor> outputs,
               std::vector<at::Tensor> keep, std::function<void()> finish, int issuer);

  // The gradcomm calls the op issued, and the error that stopped it issuing the rest
  // (then the op fails with it; the calls issued are still waited on). Before push.
  void set_works(std::vector<std::shared_ptr<gradcomm::Work>> works, std::exception_ptr error);

  // Blocks until completion (or `timeout` when given: then a RuntimeError naming
  // the op and the timeout; the op goes on). Rethrows the op's error.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  std::vector<at::Tensor> result() override;
  // Completes with a list of the output tensors (c10d's convention for collectives).
  // Handing it out is what lets a callback be attached (issue_order.cc).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  int issuer() const { return issuer_; }
  const std::string& op_name() const { return op_name_; }
  bool future_handed_out() const { return handed_out_.load(std::memory_order_acquire); }
  bool issued() const { return issued_.load(std::memory_order_acquire); }     // set_works ran
  bool settled() const { return settled_.load(std::memory_order_acquire); }   // the engine is done with it
  bool returned() const { return returned_.load(std::memory_order_acquire); }  // its callbacks returned

  // The Completer's two steps. settle() (the waiter): waits on the gradcomm works
  // and runs the local step. complete() (a completion thread): marks the Future,
  // running its callbacks, then completes the Work. Neither throws.
  void settle();
  void complete();

 private:
  const std::string op_name_;
  std::vector<std::shared_ptr<gradcomm::Work>> works_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  std::function<void()> finish_;
  std::exception_ptr error_;  // settle()'s outcome, for complete()
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  const int issuer_;
  std::atomic<bool> handed_out_{false};
  std::atomic<bool> issued_{false};
  std::atomic<bool> settled_{false};
  std::atomic<bool> returned_{false};
};

// The process group's ear on its Completer (issue_order.cc): called after every
// completion returns (deadline false) and when a hold's deadline passes (true).
// The group empties `call` (under `mutex`) before it goes, so a completion thread
// that outlives the group calls nothing.
struct CompletionListener {
  std::mutex mutex;
  std::function<void(bool deadline)> call;
  void notify(bool deadline) {
    std::lock_guard<std::mutex> lock(mutex);
    if (call) call(deadline);
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex);
    call = nullptr;
  }
};

// A gradcomm error on its way to Python. torch::PyTorchError, so torch's own
// handlers (HANDLE_TH_ERRORS: loss.backward() rethrowing a DDP bucket's failed
// Future) raise it as python_type(); for the pybind11 paths (Work.wait(),
// Future.wait(), the ops themselves) module.cc registers a translator that does the
// same. Either way Python sees gradcomm.<kind> (gradcomm.MismatchError, ...; every
// one a RuntimeError) with the library's message.
class PythonError : public torch::PyTorchError {
 public:
  // `kind`: the class's name in the gradcomm package (error_code_name's names).
  PythonError(std::string kind, const std::string& message)
      : torch::PyTorchError(message), kind_(std::move(kind)) {}
  // gradcomm.<kind>, or RuntimeError if the package has no such class. Needs the GIL.
  PyObject* python_type() override;

 private:
  std::string kind_;
};

// A gradcomm::Error as a PythonError of its kind; any other exception unchanged
// (c10::Error from a tensor copy, the process group's own argument errors).
std::exception_ptr as_torch_error(std::exception_ptr error);
// Rethrows the current exception that way (call inside a catch block).
[[noreturn]] void rethrow_as_torch_error();

// The process group's OrderedCompleter, whose items are its GradcommWorks.
class Completer {
 public:
  explicit Completer(std::shared_ptr<CompletionListener> listener);

  // Queues a work the caller has just issued; `top_level`: issued outside the
  // completion threads, or held and issued on the caller's behalf (issue_order.cc).
  void push(c10::intrusive_ptr<GradcommWork> work, bool top_level);
  // Whether the calling thread is one of this Completer's completion threads (a
  // future callback runs there), and the issuer of the work it is completing.
  bool on_completion_thread() const { return completer_.on_completion_thread(); }
  static int completing_issuer();
  // Calls the listener with deadline=true at `when` (or soon after); a later call
  // replaces an earlier deadline.
  void wake_at(std::chrono::steady_clock::time_point when) { completer_.wake_at(when); }

 private:
  python::OrderedCompleter completer_;
};

}  // namespace gradcomm::torch_backend
