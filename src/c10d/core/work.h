// Future and Work: how asynchronous operations report completion, results and errors.
// Both are thread-safe: one thread completes them while any number wait on them.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "c10d/core/deadline.h"
#include "c10d/core/tensor.h"

namespace c10d::core {

// What a Future resolves to: tensors (collective results) and/or an opaque object (e.g. the
// Python value returned by a then() callback, kept alive by the shared_ptr's deleter).
struct FutureValue {
  std::vector<Tensor> tensors;
  std::shared_ptr<void> object;
};

class Future : public std::enable_shared_from_this<Future> {
 public:
  using Callback = std::function<void(Future&)>;

  bool completed() const;
  bool has_error() const;
  std::exception_ptr error() const;

  // Blocks until completion; rethrows the stored error. A timeout of kNoTimeout waits forever,
  // otherwise an unfinished future throws DistTimeoutError naming `what`.
  void wait(Millis timeout = kNoTimeout, std::string_view what = "future") const;
  // wait() then the value.
  const FutureValue& value() const;
  // The value without waiting; throws if not completed or failed.
  const FutureValue& value_now() const;

  // Exactly one of these completes the future; later calls throw. Callbacks run on the
  // calling thread, outside the lock, in registration order.
  void mark_completed(FutureValue value);
  void set_error(std::exception_ptr error);

  // Runs `callback` when complete (immediately, on this thread, if already complete).
  void add_callback(Callback callback);
  // Runs `observer` with the outcome (the error, or null) as the future completes, before
  // wait() returns to anyone: for bookkeeping that a waiter may read right after (the flight
  // recorder). Observers must be quick and must not wait on this future.
  void add_observer(std::function<void(std::exception_ptr)> observer);
  // A child future completed with `fn(*this)`'s result; an exception from fn, or this future's
  // error, becomes the child's error.
  std::shared_ptr<Future> then(std::function<FutureValue(Future&)> fn);

  // For a future that completes only once someone runs its operation (queued for a
  // backend's worker thread, which a waiter may run itself): wait() calls `driver` with its
  // timeout before it blocks, and the futures then() makes from this one inherit it. Set
  // before the future is shared.
  void set_driver(std::function<void(Millis)> driver) { driver_ = std::move(driver); }

 private:
  void finish(FutureValue value, std::exception_ptr error);

  mutable std::mutex mutex_;
  mutable std::condition_variable done_cv_;
  bool completed_ = false;           // guarded by mutex_
  FutureValue value_;                // written once before completed_ is set
  std::exception_ptr error_;         // written once before completed_ is set
  std::vector<Callback> callbacks_;  // guarded by mutex_
  std::vector<std::function<void(std::exception_ptr)>> observers_;  // guarded by mutex_
  bool finishing_ = false;              // guarded by mutex_: outcome set, observers run
  std::function<void(Millis)> driver_;  // set before sharing (set_driver)
};

// The kinds of operation a Work can stand for (names as in torch's OpType).
enum class OpType : uint8_t {
  kBroadcast,
  kAllreduce,
  kAllreduceCoalesced,
  kReduce,
  kAllgather,
  kAllgatherBase,
  kAllgatherCoalesced,
  kGather,
  kScatter,
  kReduceScatter,
  kAlltoallBase,
  kAlltoall,
  kSend,
  kRecv,
  kRecvAnySource,
  kBarrier,
  kReduceScatterBase,
  kCoalesced,
  kAllreduceSparse,
  kUnknown,
};
std::string_view op_type_name(OpType op);  // "ALLREDUCE", "_ALLGATHER_BASE", ...

// An operation in flight. Completion goes through its Future, so wait(), get_future() and
// callbacks all see the same outcome.
class Work {
 public:
  explicit Work(OpType op = OpType::kUnknown, std::string description = {}, int source_rank = -1);
  virtual ~Work() = default;

  static std::shared_ptr<Work> from_future(std::shared_ptr<Future> future,
                                           OpType op = OpType::kUnknown,
                                           std::string description = {});

  OpType op_type() const { return op_; }
  const std::string& description() const { return description_; }
  bool is_completed() const { return future_->completed(); }
  // No error so far: true while pending too, as in torch (whose is_success() only reports
  // whether an exception was recorded); is_completed() says whether it finished.
  bool is_success() const { return !future_->has_error(); }
  std::exception_ptr exception() const { return future_->error(); }
  // The sender of a receive (the actual one for a receive from any source, -1 until it
  // completed).
  int source_rank() const;
  std::vector<Tensor> result() const { return future_->value().tensors; }
  std::shared_ptr<Future> get_future() const { return future_; }
  // The future as users get it (Python's get_future()). An operation that advances only
  // inside wait() (progresses_in_wait: sends and receives) throws NotSupported until it
  // completed: its future would never complete by itself, and waiting on it would hang.
  // (A thread that waits for it instead released the work's Python arrays as the
  // interpreter shut down, which aborts the process.)
  static std::shared_ptr<Future> future_of(const std::shared_ptr<Work>& work);
  virtual bool progresses_in_wait() const { return false; }

  // Blocks until done and rethrows the operation's error. With a timeout, an unfinished
  // operation throws DistTimeoutError naming it (the operation itself keeps running).
  // Returns true, as torch's Work::wait does.
  virtual bool wait(Millis timeout = kNoTimeout);
  // Requests cancellation; backends that can stop an operation override this.
  virtual void abort() {}

  // Called by the backend that runs the operation.
  void finish(std::vector<Tensor> outputs = {});
  void finish_with_error(std::exception_ptr error);
  void set_source_rank(int rank);

 protected:
  Work(OpType op, std::string description, std::shared_ptr<Future> future);

 private:
  OpType op_;
  std::string description_;
  std::shared_ptr<Future> future_;
  mutable std::mutex mutex_;
  int source_rank_ = -1;  // guarded by mutex_
};

}  // namespace c10d::core
