// ShmBackend's operation queue: operations run one at a time, in submission order, on the
// caller's thread or the worker's (see op_queue.h).
#include "c10d/backends/shm/op_queue.h"

#include <exception>
#include <string>
#include <thread>
#include <utility>

#include "c10d/backends/shm/engine.h"
#include "c10d/backends/shm/segment.h"
#include "c10d/core/env.h"
#include "c10d/core/exception.h"

namespace c10d::backends::shm {

using core::DistBackendError;
using core::DistTimeoutError;
using core::OpType;
using core::Tensor;
using core::detail::str_cat;
using pg::Millis;
using pg::WorkPtr;

// An operation's Work whose wait() runs the operation itself when it is still queued and no
// other operation runs, instead of blocking until the worker thread wakes up for it: a
// thread hand-off costs many times a small operation. Waits on its future (and on futures
// chained to it) do the same: while asynchronous operations are in use the worker only polls
// the queue (see Queue), and DDP's reducer waits on its buckets' futures (see
// docs/design/shm.md#operation-queue).
class ShmBackend::QueuedWork : public core::Work {
 public:
  QueuedWork(OpType type, std::string description, std::weak_ptr<Queue> queue,
             std::weak_ptr<Engine> engine, uint64_t seq, Millis op_timeout)
      : core::Work(type, std::move(description)) {
    get_future()->set_driver(
        [queue = std::move(queue), engine = std::move(engine), seq, op_timeout](Millis timeout) {
          // A waiter with a shorter timeout only waits: running the operation here would bind it
          // to the waiter's deadline, while it must keep running past it.
          if (timeout > core::kNoTimeout && timeout < op_timeout) return;
          const std::shared_ptr<Queue> q = queue.lock();
          const std::shared_ptr<Engine> e = engine.lock();
          if (q && e) run_queued_until(*q, *e, seq);
        });
  }
};

WorkPtr ShmBackend::submit(OpType type, const char* name, Millis timeout, bool async, Body body,
                           std::vector<Tensor> outputs) {
  Task task;
  task.name = name;
  task.type = type;
  task.body = std::move(body);
  task.outputs = std::move(outputs);
  task.timeout = effective_timeout(timeout);
  Queue& q = *queue_;
  bool inline_run = false;
  {
    std::unique_lock<std::mutex> lock(q.mutex);
    task.seq = q.next_seq++;
    task.work = std::make_shared<QueuedWork>(
        type, std::string("shm:") + name + "#" + std::to_string(task.seq), queue_, engine_,
        task.seq, task.timeout);
    if (q.stopping) {
      lock.unlock();
      task.work->finish_with_error(std::make_exception_ptr(
          DistBackendError(str_cat("shm ", name, " (sequence ", task.seq, ", rank ", rank(), " of ",
                                   size(), "): the backend was shut down"))));
      return task.work;
    }
    ++q.pending;
    q.last = task.work;
    if (!async && q.pending == 1) {
      // Nothing queued before it: run here, without a thread hand-off.
      inline_run = true;
      q.running = true;
    } else {
      if (!worker_.joinable()) worker_ = std::thread(worker_loop, queue_, engine_);
      if (async) q.last_async = std::chrono::steady_clock::now();
      const bool wake = q.deep_sleep;  // else the worker polls (see Queue)
      WorkPtr work = task.work;
      q.tasks.push_back(std::move(task));
      lock.unlock();
      if (wake) q.wake.notify_one();
      return work;
    }
  }
  if (inline_run) run_task(*engine_, task);
  finished_one(q);
  return task.work;
}

void ShmBackend::finished_one(Queue& q) {
  bool more;
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    --q.pending;
    q.running = false;
    more = !q.tasks.empty() && q.deep_sleep;
  }
  // Wake the worker only for work, and only when it does not poll (see Queue): a waiter
  // usually runs the next operation itself.
  if (more) q.wake.notify_one();
}

void ShmBackend::run_queued_until(Queue& q, Engine& engine, uint64_t seq) {
  for (;;) {
    Task task;
    {
      std::lock_guard<std::mutex> lock(q.mutex);
      if (q.running || q.stopping || q.tasks.empty() || q.tasks.front().seq > seq) return;
      task = std::move(q.tasks.front());
      q.tasks.pop_front();
      q.running = true;
    }
    run_task(engine, task);
    finished_one(q);
    if (task.seq == seq) return;
  }
}

void ShmBackend::run_task(Engine& engine, Task& task) noexcept {
  std::exception_ptr error;
  try {
    engine.begin(task.name, task.type, task.seq, task.timeout);
    task.body(engine);
    engine.end();
  } catch (...) {
    error = std::current_exception();
  }
  try {
    if (error) {
      task.work->finish_with_error(error);
    } else {
      task.work->finish(std::move(task.outputs));
    }
  } catch (...) {
    // shutdown() failed it already
  }
}

void ShmBackend::worker_loop(std::shared_ptr<Queue> queue, std::shared_ptr<Engine> engine) {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(queue->mutex);
      for (;;) {
        if (queue->stopping) return;  // shutdown() failed what was queued
        if (!queue->tasks.empty() && !queue->running) break;
        if (std::chrono::steady_clock::now() - queue->last_async < Queue::kPollWindow) {
          queue->wake.wait_for(lock, Queue::kPoll);
        } else {
          queue->deep_sleep = true;
          queue->wake.wait(lock);
          queue->deep_sleep = false;
        }
      }
      task = std::move(queue->tasks.front());
      queue->tasks.pop_front();
      queue->running = true;
    }
    run_task(*engine, task);
    finished_one(*queue);
  }
}

void ShmBackend::finish_pending(Millis timeout) {
  // Operations run in order, so waiting for the last one submitted (queued or running)
  // waits for all.
  Queue& q = *queue_;
  WorkPtr last;
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    if (!q.stopping) last = q.last.lock();
  }
  if (!last || last->is_completed()) return;
  try {
    last->wait(timeout);
  } catch (const DistTimeoutError&) {
    if (last->is_completed()) return;  // the operation's own timeout: its error says so
    core::log(core::LogLevel::kWarning,
              str_cat("shm rank ", rank(), " of ", size(), ": operations up to ",
                      last->description(), " did not finish within ", core::format_timeout(timeout),
                      " while the backend shut down; they fail"));
  } catch (...) {
    // Its error is the caller's to see; what is still queued is dropped by shutdown().
  }
}

void ShmBackend::shutdown() {
  std::lock_guard<std::mutex> shutdown_lock(shutdown_mutex_);
  Queue& q = *queue_;
  std::deque<Task> dropped;
  std::thread worker;
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    if (q.stopping) return;
    q.stopping = true;
    dropped.swap(q.tasks);
    q.pending -= dropped.size();
    worker = std::move(worker_);
    // An operation cut short here fails (Engine::fail marks it too, but only once it notices):
    // peers still reading this rank's buffers must know before this returns.
    if (q.running) {
      segment_->header(rank())->abandoned.store(1, std::memory_order_seq_cst);
    }
  }
  engine_->aborted.store(true);
  // Peers blocked on this rank fail at once instead of at their timeout.
  segment_->header(rank())->closed.store(1, std::memory_order_release);
  q.wake.notify_all();
  for (Task& task : dropped) {
    try {
      task.work->finish_with_error(std::make_exception_ptr(
          DistBackendError(str_cat("shm ", task.name, " (sequence ", task.seq, ", rank ", rank(),
                                   " of ", size(), "): the backend was shut down before it ran"))));
    } catch (...) {
    }
  }
  // A running operation notices `aborted` within a few milliseconds.
  if (worker.joinable()) worker.join();
  // Adopted arrays keep their shared pages (and so the segment) until they are freed: moving
  // them back now would lose what other threads write into them meanwhile (alias.h).
}

}  // namespace c10d::backends::shm
