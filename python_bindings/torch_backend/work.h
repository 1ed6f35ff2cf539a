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
// Completion thread. One per process group (the Completer), not one per op: the
// communicator's engine runs calls in issue order and completes them in that
// order, so a single thread that waits on the works front to back never waits
// longer than the op it is on. The process group pushes a work while it holds its
// issue lock, so the Completer's queue order is the engine's order. For each work
// it: waits on the gradcomm works, runs the local step, marks the Future (its
// callbacks, e.g. DDP's reducer, run here, as they do on gloo's worker threads),
// then completes the c10d::Work, which wakes wait(). Future before Work: a caller
// that returns from wait() finds the Future already done.
//
// Errors. A gradcomm error (MismatchError, PeerFailure, TimeoutError, ...) fails the
// Work and the Future with a std::runtime_error whose text starts with
// "gradcomm <Kind>:", so Python sees a RuntimeError that names the kind and the
// library's message (rank, op, sequence number, expected vs found). At issue time
// InvalidArgument becomes a std::invalid_argument (Python's ValueError), as the
// process group's own argument checks are.
//
// Shutdown. The process group destroys its communicator first: that fails every
// outstanding gradcomm work at once (never waiting on a peer). Then the Completer
// is stopped: its thread drains what is queued (each wait now returns at once)
// and exits, and the destructor joins it. The thread reaches only its shared
// queue and the works it holds references to, never the process group, so if the
// last reference to the group is dropped on the thread itself (a future callback
// holding it), the thread is detached instead of joined.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gradcomm/communicator.h"

namespace gradcomm::torch_backend {

class GradcommWork : public c10d::Work {
 public:
  // `works`: the gradcomm calls, in issue order. `outputs`: what result() and the
  // Future give (the op's output tensors). `keep`: tensors the calls read or write
  // (inputs, staging buffers), held until completion. `finish`: the local step, run
  // after every call succeeded (may be empty).
  GradcommWork(int rank, c10d::OpType type, const char* op_name,
               std::vector<std::shared_ptr<gradcomm::Work>> works, std::vector<at::Tensor> outputs,
               std::vector<at::Tensor> keep, std::function<void()> finish);

  // Blocks until completion (or `timeout` when given: then a RuntimeError naming
  // the op and the timeout; the op goes on). Rethrows the op's error.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  std::vector<at::Tensor> result() override;
  // Completes with a list of the output tensors (c10d's convention for collectives).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // The Completer's side: waits on the gradcomm works, runs the local step and
  // completes Future and Work. Never throws.
  void complete();

 private:
  const std::string op_name_;
  std::vector<std::shared_ptr<gradcomm::Work>> works_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  std::function<void()> finish_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A gradcomm (or any) exception as the error torch sees: "gradcomm <Kind>:
// <message>"; `at_issue`: raised while issuing (InvalidArgument is then a ValueError).
std::exception_ptr as_torch_error(std::exception_ptr error, bool at_issue);
// Rethrows the current exception that way, at issue (call inside a catch block).
[[noreturn]] void rethrow_as_torch_error();

class Completer {
 public:
  Completer();
  ~Completer();  // stops after draining the queue; joins (or detaches on its own thread)
  Completer(const Completer&) = delete;
  Completer& operator=(const Completer&) = delete;

  void push(c10::intrusive_ptr<GradcommWork> work);

 private:
  struct Queue {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<c10::intrusive_ptr<GradcommWork>> works;
    bool stop = false;
  };
  static void run(std::shared_ptr<Queue> queue);

  std::shared_ptr<Queue> queue_;
  std::thread thread_;
};

}  // namespace gradcomm::torch_backend
