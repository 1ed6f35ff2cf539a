#include "work.h"

#include <fmt/format.h>

#include <ATen/core/ivalue.h>

#include "gradcomm/errors.h"

namespace gradcomm::torch_backend {

std::exception_ptr as_torch_error(std::exception_ptr error, bool at_issue) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    std::string text = fmt::format("gradcomm {}: {}", error_code_name(e.code()), e.what());
    // A wrong argument is a ValueError in Python (pybind11 maps std::invalid_argument),
    // the rest RuntimeError. A Work that failed is always a RuntimeError (the library
    // fails work outstanding at shutdown with InvalidArgument: not the caller's argument).
    if (at_issue && e.code() == ErrorCode::kInvalidArgument) {
      return std::make_exception_ptr(std::invalid_argument(text));
    }
    return std::make_exception_ptr(std::runtime_error(text));
  } catch (const std::exception&) {
    return error;  // c10::Error from a tensor copy, or our own runtime_error: already readable
  } catch (...) {
    return std::make_exception_ptr(std::runtime_error("gradcomm: an unknown exception (not a std::exception)"));
  }
}

void rethrow_as_torch_error() { std::rethrow_exception(as_torch_error(std::current_exception(), true)); }

GradcommWork::GradcommWork(int rank, c10d::OpType type, const char* op_name,
                           std::vector<std::shared_ptr<gradcomm::Work>> works, std::vector<at::Tensor> outputs,
                           std::vector<at::Tensor> keep,
                           std::function<void()> finish)
    : c10d::Work(rank, type),
      op_name_(op_name),
      works_(std::move(works)),
      outputs_(std::move(outputs)),
      keep_(std::move(keep)),
      finish_(std::move(finish)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

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

c10::intrusive_ptr<c10::ivalue::Future> GradcommWork::getFuture() { return future_; }

void GradcommWork::complete() {
  std::exception_ptr error;
  // Every call is waited on, even after one failed: the tensors in keep_ must
  // outlive all of them.
  for (auto& work : works_) {
    try {
      work->wait();
    } catch (...) {
      if (!error) error = as_torch_error(std::current_exception(), false);
    }
  }
  if (!error && finish_) {
    try {
      finish_();
    } catch (...) {
      error = as_torch_error(std::current_exception(), false);
    }
  }
  works_.clear();
  keep_.clear();
  finish_ = nullptr;
  try {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  } catch (...) {
    // The Future's callbacks report their own errors through the futures they
    // return; nothing here may stop the Work from completing.
  }
  finish(error);
}

Completer::Completer() : queue_(std::make_shared<Queue>()), thread_(&Completer::run, queue_) {}

Completer::~Completer() {
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->stop = true;
  }
  queue_->cv.notify_all();
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // dropped from a future callback: the thread exits once the queue is drained
  } else {
    thread_.join();
  }
}

void Completer::push(c10::intrusive_ptr<GradcommWork> work) {
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->works.push_back(std::move(work));
  }
  queue_->cv.notify_one();
}

void Completer::run(std::shared_ptr<Queue> queue) {
  for (;;) {
    c10::intrusive_ptr<GradcommWork> work;
    {
      std::unique_lock<std::mutex> lock(queue->mutex);
      queue->cv.wait(lock, [&] { return queue->stop || !queue->works.empty(); });
      if (queue->works.empty()) return;  // stopped and drained
      work = std::move(queue->works.front());
      queue->works.pop_front();
    }
    work->complete();
  }
}

}  // namespace gradcomm::torch_backend
