// OpQueue: operations run one at a time, in submission order, on the caller's thread, the
// worker's, or a waiter's (see op_queue.h).
#include "c10d/pg/op_queue.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "c10d/core/blocking.h"
#include "c10d/core/env.h"
#include "c10d/core/exception.h"

namespace c10d::pg {

using core::DistBackendError;
using core::DistTimeoutError;
using core::detail::str_cat;

// A queued operation's Work: waiting on it (or on a future chained to it) runs the operation
// on the waiting thread when it is still queued and nobody else runs one, and ends the wait
// at the operation's deadline if it is still queued then.
class OpQueue::QueuedWork : public core::Work {
 public:
  QueuedWork(core::OpType type, std::string description, std::weak_ptr<OpQueue> queue, uint64_t seq,
             Millis op_timeout)
      : core::Work(type, std::move(description)) {
    get_future()->set_driver([queue = std::move(queue), seq, op_timeout,
                              deadline = core::Deadline(op_timeout)](Millis timeout) {
      // A waiter with a shorter timeout only waits: running the operation here would bind it
      // to the waiter's deadline, while it must keep running past it.
      if (timeout > core::kNoTimeout && timeout < op_timeout) return;
      if (const std::shared_ptr<OpQueue> q = queue.lock()) q->run_until(seq, deadline);
    });
  }
};

namespace {

OpQueue::Config labelled(OpQueue::Config config) {
  if (config.label.empty()) config.label = config.backend;
  return config;
}

}  // namespace

OpQueue::OpQueue(Config config) : config_(labelled(std::move(config))) {}

OpQueue::~OpQueue() {
  // stop() and join() ran (the owner's shutdown); a worker still here outlives nothing of ours.
  if (worker_.joinable()) worker_.detach();
}

std::string OpQueue::describe(const QueuedOp& op) const {
  return str_cat(config_.label, " ", op.name, " (sequence ", op.seq, ", rank ", config_.rank,
                 " of ", config_.size, ")");
}

uint64_t OpQueue::next_sequence() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_seq_;
}

std::shared_ptr<core::Work> OpQueue::submit(core::OpType type, const char* name, Millis timeout,
                                            bool async, Body body,
                                            std::vector<core::Tensor> outputs) {
  Task task;
  task.op.name = name;
  task.op.type = type;
  task.op.timeout = timeout;
  task.body = std::move(body);
  task.outputs = std::move(outputs);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    task.op.seq = next_seq_++;
    // Plain concatenation: this runs on every operation's critical path.
    task.work = std::make_shared<QueuedWork>(
        type, config_.backend + ":" + name + "#" + std::to_string(task.op.seq), weak_from_this(),
        task.op.seq, timeout);
    if (stopping_) {
      lock.unlock();
      task.work->finish_with_error(std::make_exception_ptr(
          DistBackendError(str_cat(describe(task.op), ": the backend was shut down"))));
      return task.work;
    }
    ++pending_;
    last_ = task.work;
    if (async || pending_ != 1) {
      if (!worker_.joinable()) worker_ = std::thread(worker_loop, shared_from_this());
      if (async) last_async_ = std::chrono::steady_clock::now();
      const bool wake = deep_sleep_ || !config_.poll_while_async;
      std::shared_ptr<core::Work> work = task.work;
      tasks_.push_back(std::move(task));
      lock.unlock();
      if (wake) wake_.notify_one();
      return work;
    }
    running_ = true;  // nothing before it: run here, without a thread hand-off
    in_body_.store(true, std::memory_order_relaxed);
    running_op_ = task.op;
  }
  run(task);
  finished_one();
  return task.work;
}

OpQueue::RunNow::RunNow(OpQueue& queue, const char* name) : queue_(queue) {
  std::lock_guard<std::mutex> lock(queue.mutex_);
  if (queue.stopping_ || queue.pending_ != 0) return;
  seq_ = queue.next_seq_++;
  ++queue.pending_;
  queue.running_ = true;
  queue.in_body_.store(true, std::memory_order_relaxed);
  queue.running_op_.name = name;
  queue.running_op_.seq = *seq_;
}

OpQueue::RunNow::~RunNow() {
  if (!seq_) return;
  queue_.in_body_.store(false, std::memory_order_release);
  queue_.finished_one();
}

void OpQueue::run(Task& task) noexcept {
  std::exception_ptr error;
  try {
    if (config_.hooks.before) config_.hooks.before(task.op);
    task.body(task.op);
    if (config_.hooks.after) config_.hooks.after();
  } catch (...) {
    error = std::current_exception();
  }
  in_body_.store(false, std::memory_order_release);
  try {
    if (error) {
      task.work->finish_with_error(error);
    } else {
      task.work->finish(std::move(task.outputs));
    }
  } catch (...) {
    // completed already
  }
}

void OpQueue::finished_one() {
  bool more;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --pending_;
    running_ = false;
    more = !tasks_.empty() && (deep_sleep_ || !config_.poll_while_async);
  }
  turn_.notify_all();
  // Wake the worker only for work, and only when it does not poll: a waiter usually runs the
  // next operation itself.
  if (more) wake_.notify_one();
}

void OpQueue::run_until(uint64_t seq, const core::Deadline& deadline) {
  const auto is_seq = [seq](const Task& t) {
    return t.op.seq == seq;
  };
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    auto queued = std::find_if(tasks_.begin(), tasks_.end(), is_seq);
    if (queued == tasks_.end() || stopping_) return;  // ran, runs, or failed at stop()
    if (!running_ && tasks_.front().op.seq <= seq) {
      bool mine;
      {
        // Destroyed before the lock is taken again: a body may hold Python objects, whose
        // release needs the GIL, which a thread waiting for the lock may hold.
        Task task = std::move(tasks_.front());
        tasks_.pop_front();
        running_ = true;
        in_body_.store(true, std::memory_order_relaxed);
        running_op_ = task.op;
        lock.unlock();
        run(task);
        finished_one();
        mine = task.op.seq == seq;
      }
      if (mine) return;
      lock.lock();
      continue;
    }
    if (deadline.infinite()) {
      turn_.wait(lock);
      continue;
    }
    if (turn_.wait_until(lock, deadline.time_point()) == std::cv_status::no_timeout ||
        !deadline.expired()) {
      continue;
    }
    queued = std::find_if(tasks_.begin(), tasks_.end(), is_seq);
    if (queued == tasks_.end() || stopping_) return;
    // Still waiting for its turn at its deadline: it will not run (its peers time out on it).
    Task task = std::move(*queued);
    tasks_.erase(queued);
    --pending_;
    const std::string holder =
        running_ ? str_cat(running_op_.name, ", sequence ", running_op_.seq) : "none";
    lock.unlock();
    try {
      task.work->finish_with_error(std::make_exception_ptr(DistTimeoutError(
          str_cat(describe(task.op), ": timed out after ", core::format_timeout(task.op.timeout),
                  " waiting for the operations submitted before it (running: ", holder, ")"))));
    } catch (...) {
    }
    return;
  }
}

void OpQueue::worker_loop(std::shared_ptr<OpQueue> self) {
  OpQueue& q = *self;
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(q.mutex_);
      for (;;) {
        if (q.stopping_) {  // stop() failed what was queued
          q.worker_left_ = true;
          q.left_.notify_all();
          return;
        }
        if (!q.tasks_.empty() && !q.running_) break;
        if (q.config_.poll_while_async &&
            std::chrono::steady_clock::now() - q.last_async_ < kPollWindow) {
          q.wake_.wait_for(lock, kPoll);
        } else {
          q.deep_sleep_ = true;
          q.wake_.wait(lock);
          q.deep_sleep_ = false;
        }
      }
      task = std::move(q.tasks_.front());
      q.tasks_.pop_front();
      q.running_ = true;
      q.in_body_.store(true, std::memory_order_relaxed);
      q.running_op_ = task.op;
      q.worker_running_ = task.work;
    }
    q.run(task);
    {
      std::lock_guard<std::mutex> lock(q.mutex_);
      q.worker_running_.reset();
    }
    q.finished_one();
  }
}

void OpQueue::finish_pending(Millis timeout) {
  // Operations run in order, so waiting for the last one submitted waits for all.
  std::shared_ptr<core::Work> last;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) last = last_.lock();
  }
  if (!last || last->is_completed()) return;
  try {
    last->wait(timeout);
  } catch (const DistTimeoutError&) {
    if (last->is_completed()) return;  // the operation's own timeout: its error says so
    core::log(core::LogLevel::kWarning,
              str_cat(config_.label, " rank ", config_.rank, " of ", config_.size,
                      ": operations up to ", last->description(), " did not finish within ",
                      core::format_timeout(timeout), " while the backend shut down; they fail"));
  } catch (...) {
    // Its error is the caller's to see; what is still queued fails at stop().
  }
}

bool OpQueue::stop(const std::function<void(bool running)>& mark) {
  std::deque<Task> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return false;
    stopping_ = true;
    dropped.swap(tasks_);
    pending_ -= dropped.size();
    if (mark) mark(running_ && in_body_.load(std::memory_order_acquire));
  }
  wake_.notify_all();
  turn_.notify_all();
  for (Task& task : dropped) {
    try {
      task.work->finish_with_error(std::make_exception_ptr(DistBackendError(
          str_cat(describe(task.op), ": the backend was shut down before it ran"))));
    } catch (...) {
    }
  }
  return true;
}

void OpQueue::join(Millis grace) {
  std::thread worker;
  std::shared_ptr<core::Work> abandoned;
  bool let_go = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    worker = std::move(worker_);
    if (!worker.joinable()) return;
    if (worker.get_id() != std::this_thread::get_id() && grace != core::kNoTimeout &&
        !left_.wait_for(lock, grace, [&] { return worker_left_; })) {
      abandoned = worker_running_;
      // Still there after the grace, running an operation or destroying its last task (whose
      // arrays may need the GIL this caller holds): either way it is let go, not waited for.
      let_go = true;
    }
  }
  if (worker.get_id() == std::this_thread::get_id() || let_go) {
    worker.detach();
  } else {
    worker.join();
  }
  if (!abandoned) return;
  try {
    abandoned->finish_with_error(std::make_exception_ptr(DistBackendError(
        str_cat(config_.label, " ", abandoned->description(), " on rank ", config_.rank, " of ",
                config_.size, ": the backend was shut down while it ran"))));
  } catch (...) {
    // It completed in the meantime.
  }
}

}  // namespace c10d::pg
