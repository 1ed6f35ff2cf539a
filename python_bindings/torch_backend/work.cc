#include "work.h"

#include <fmt/format.h>
#include <pybind11/pybind11.h>

#include <ATen/core/ivalue.h>

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
// The issuer of the work this completion thread is completing (its callbacks' ops are its).
thread_local int t_completing_issuer = 0;

// A GradcommWork as an OrderedCompleter item.
class WorkItem final : public python::OrderedCompleter::Item {
 public:
  explicit WorkItem(c10::intrusive_ptr<GradcommWork> work) : work_(std::move(work)) {}
  void settle() override { work_->settle(); }
  void complete() override {
    t_completing_issuer = work_->issuer();
    work_->complete();
    t_completing_issuer = 0;
  }

 private:
  c10::intrusive_ptr<GradcommWork> work_;
};
}  // namespace

Completer::Completer(std::shared_ptr<CompletionListener> listener)
    : completer_([listener = std::move(listener)](bool deadline) { listener->notify(deadline); }) {}

void Completer::push(c10::intrusive_ptr<GradcommWork> work, bool top_level) {
  completer_.push(std::make_unique<WorkItem>(std::move(work)), top_level);
}

int Completer::completing_issuer() { return t_completing_issuer; }

}  // namespace gradcomm::torch_backend
