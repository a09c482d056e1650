#include "c10d/core/work.h"

#include "c10d/core/exception.h"

namespace c10d::core {

bool Future::completed() const {
  std::lock_guard lock(mutex_);
  return completed_;
}

bool Future::has_error() const {
  std::lock_guard lock(mutex_);
  return completed_ && error_ != nullptr;
}

std::exception_ptr Future::error() const {
  std::lock_guard lock(mutex_);
  return completed_ ? error_ : nullptr;
}

void Future::wait(Millis timeout, std::string_view what) const {
  if (driver_ && !completed()) driver_(timeout);
  std::unique_lock lock(mutex_);
  Deadline deadline(timeout);
  if (deadline.infinite()) {
    done_cv_.wait(lock, [&] { return completed_; });
  } else if (!done_cv_.wait_until(lock, deadline.time_point(), [&] { return completed_; })) {
    throw DistTimeoutError(
        detail::str_cat("Timed out after ", format_timeout(timeout), " waiting for ", what));
  }
  if (error_) std::rethrow_exception(error_);
}

const FutureValue& Future::value() const {
  wait();
  return value_;
}

const FutureValue& Future::value_now() const {
  std::lock_guard lock(mutex_);
  C10D_CHECK(completed_, "Future::value_now: the future is not completed yet");
  if (error_) std::rethrow_exception(error_);
  return value_;
}

void Future::mark_completed(FutureValue value) { finish(std::move(value), nullptr); }

void Future::set_error(std::exception_ptr error) {
  C10D_CHECK(error != nullptr, "Future::set_error needs an exception");
  finish({}, std::move(error));
}

void Future::finish(FutureValue value, std::exception_ptr error) {
  std::vector<std::function<void(std::exception_ptr)>> observers;
  {
    std::lock_guard lock(mutex_);
    C10D_CHECK(!completed_ && !finishing_, "this future was already completed");
    value_ = std::move(value);
    error_ = std::move(error);
    finishing_ = true;
    observers.swap(observers_);
  }
  for (auto& observer : observers) observer(error_);
  std::vector<Callback> callbacks;
  {
    std::lock_guard lock(mutex_);
    completed_ = true;
    callbacks.swap(callbacks_);
  }
  done_cv_.notify_all();
  for (auto& callback : callbacks) callback(*this);
}

void Future::add_observer(std::function<void(std::exception_ptr)> observer) {
  std::exception_ptr outcome;
  {
    std::lock_guard lock(mutex_);
    if (!finishing_) {
      observers_.push_back(std::move(observer));
      return;
    }
    outcome = error_;
  }
  observer(outcome);
}

void Future::add_callback(Callback callback) {
  {
    std::lock_guard lock(mutex_);
    if (!completed_) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback(*this);
}

std::shared_ptr<Future> Future::then(std::function<FutureValue(Future&)> fn) {
  auto child = std::make_shared<Future>();
  child->driver_ = driver_;
  add_callback([child, fn = std::move(fn)](Future& parent) {
    if (parent.has_error()) {
      child->set_error(parent.error());
      return;
    }
    FutureValue result;
    try {
      result = fn(parent);
    } catch (...) {
      child->set_error(std::current_exception());
      return;
    }
    child->mark_completed(std::move(result));
  });
  return child;
}

std::string_view op_type_name(OpType op) {
  static constexpr std::string_view kNames[] = {
      "BROADCAST",
      "ALLREDUCE",
      "ALLREDUCE_COALESCED",
      "REDUCE",
      "ALLGATHER",
      "_ALLGATHER_BASE",
      "ALLGATHER_COALESCED",
      "GATHER",
      "SCATTER",
      "REDUCE_SCATTER",
      "ALLTOALL_BASE",
      "ALLTOALL",
      "SEND",
      "RECV",
      "RECVANYSOURCE",
      "BARRIER",
      "_REDUCE_SCATTER_BASE",
      "COALESCED",
      "_ALLREDUCE_SPARSE",
      "UNKNOWN",
  };
  auto index = static_cast<size_t>(op);
  return index < std::size(kNames) ? kNames[index] : "UNKNOWN";
}

Work::Work(OpType op, std::string description, int source_rank)
    : Work(op, std::move(description), std::make_shared<Future>()) {
  source_rank_ = source_rank;
}

Work::Work(OpType op, std::string description, std::shared_ptr<Future> future)
    : op_(op), description_(std::move(description)), future_(std::move(future)) {
  if (description_.empty()) description_ = std::string(op_type_name(op_));
}

std::shared_ptr<Work> Work::from_future(std::shared_ptr<Future> future, OpType op,
                                        std::string description) {
  C10D_CHECK_ARG(future != nullptr, "Work::from_future: the future is None");
  return std::shared_ptr<Work>(new Work(op, std::move(description), std::move(future)));
}

std::shared_ptr<Future> Work::future_of(const std::shared_ptr<Work>& work) {
  C10D_CHECK_ARG(work != nullptr, "Work::future_of: no work");
  if (work->progresses_in_wait() && !work->is_completed()) {
    throw NotSupported(detail::str_cat(
        "get_future() of ", work->description(),
        ", which advances only in wait(): call "
        "wait() first (torch.distributed does not support get_future for point-to-point "
        "operations either)"));
  }
  return work->future_;
}

int Work::source_rank() const {
  std::lock_guard lock(mutex_);
  // A receive from any source knows its sender once it completed: -1 until then, as in torch.
  if (op_ == OpType::kRecvAnySource) return source_rank_;
  C10D_CHECK(source_rank_ >= 0, "source_rank is only available for receives (", description_, ")");
  return source_rank_;
}

void Work::set_source_rank(int rank) {
  std::lock_guard lock(mutex_);
  source_rank_ = rank;
}

bool Work::wait(Millis timeout) {
  try {
    future_->wait(timeout, description_);
  } catch (const DistTimeoutError& e) {
    // Finished meanwhile (or failed with its own timeout): its outcome, not the wait's.
    if (future_->completed()) return future_->wait(), true;
    throw DistTimeoutError(
        detail::str_cat(e.what(),
                        " (the operation is still running and may still write into its outputs; "
                        "wait again before reusing them)"));
  }
  return true;
}

void Work::finish(std::vector<Tensor> outputs) {
  future_->mark_completed(FutureValue{std::move(outputs), nullptr});
}

void Work::finish_with_error(std::exception_ptr error) { future_->set_error(std::move(error)); }

}  // namespace c10d::core
