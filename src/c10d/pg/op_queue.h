// OpQueue: a backend's operations, numbered and run one at a time in submission order. It owns
// what every backend's operations share: sequence numbers, the Work, running a synchronous
// call on the caller's thread, ordering it behind asynchronous work submitted before it,
// letting a waiter run a queued operation itself, finish_pending and shutdown. Backends supply
// the bodies and a few hooks (what runs around every body; how a running operation is cut
// short at shutdown). The rules, the same for every backend that uses it:
//   - an operation runs only after every operation submitted before it has finished;
//   - a synchronous one with nothing queued or running runs on the caller, without a hand-off;
//   - otherwise the worker thread runs it, or a thread that waits on its Work (and on the
//     Works before it) while nobody else runs one: a thread hand-off costs many times a small
//     operation;
//   - a thread waiting on an operation still queued at its deadline (counted from submission)
//     gets a timeout naming the operation that holds the queue, and the operation never runs;
//   - after stop(), submit() returns a failed Work ("the backend was shut down") and the
//     operations still queued fail ("... before it ran").
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "c10d/core/deadline.h"
#include "c10d/core/tensor.h"
#include "c10d/core/work.h"
#include "c10d/pg/options.h"

namespace c10d::pg {

// The operation a body runs: what the queue knows of it.
struct QueuedOp {
  const char* name = "";  // "allreduce"
  core::OpType type = core::OpType::kUnknown;
  uint64_t seq = 0;
  Millis timeout{0};  // resolved: never kUnsetTimeout
};

class OpQueue : public std::enable_shared_from_this<OpQueue> {
 public:
  // Runs one operation; its exception fails the operation's Work.
  using Body = std::function<void(const QueuedOp&)>;

  struct Hooks {
    // Around every body, on the thread that runs it: `before` may refuse the operation by
    // throwing; `after` runs only when the body returned.
    std::function<void(const QueuedOp&)> before;
    std::function<void()> after;
  };

  struct Config {
    std::string backend;  // "shm": Works are named "shm:allreduce#3"
    std::string label;    // errors begin "<label> allreduce (sequence 3, ...)"; "": backend
    int rank = 0;
    int size = 1;
    // While asynchronous operations are in use (kPollWindow since the last one), the worker
    // looks for work every kPoll instead of sleeping until woken: waking an idle vCPU costs
    // more than a small operation, and a waiter usually runs it first (shm).
    bool poll_while_async = false;
    Hooks hooks;

    // The common part: names and the group's shape, nothing else set.
    static Config of(std::string backend, std::string label, int rank, int size) {
      Config c;
      c.backend = std::move(backend);
      c.label = std::move(label);
      c.rank = rank;
      c.size = size;
      return c;
    }
  };
  static constexpr std::chrono::microseconds kPoll{1000};
  static constexpr std::chrono::milliseconds kPollWindow{200};

  explicit OpQueue(Config config);
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Numbers the operation and runs it by the rules above; `timeout` is the resolved one.
  // `outputs` become the Work's result.
  std::shared_ptr<core::Work> submit(core::OpType type, const char* name, Millis timeout,
                                     bool async, Body body, std::vector<core::Tensor> outputs);

  // The inline fast path's "run now": while it is held, the caller runs one synchronous
  // operation itself, without a Work, exactly as submit() would have on the caller (`before`
  // and `after` are the caller's to call). Empty (seq() is nullopt) when something is queued
  // or running or the queue is stopped: the caller then submits and waits instead.
  class RunNow {
   public:
    RunNow(OpQueue& queue, const char* name);
    ~RunNow();
    RunNow(const RunNow&) = delete;
    RunNow& operator=(const RunNow&) = delete;
    const std::optional<uint64_t>& seq() const { return seq_; }

   private:
    OpQueue& queue_;
    std::optional<uint64_t> seq_;
  };

  enum class State { kIdle, kBusy, kStopped };  // kBusy: an operation is queued or running
  // Runs `fn(state)` while no operation can start or be submitted.
  template <typename Fn>
  auto while_held(Fn&& fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    return fn(stopping_ ? State::kStopped : pending_ != 0 ? State::kBusy : State::kIdle);
  }

  // The number the next operation gets.
  uint64_t next_sequence() const;

  // Waits at most `timeout` (kNoTimeout: as long as it takes) for the operations submitted so
  // far to finish, running them on this thread when nobody else does; warns if they did not.
  void finish_pending(Millis timeout);
  // Later submissions fail and queued operations fail now. `mark(running)`, with whether an
  // operation's body still runs (one whose Work completed no longer counts), runs while no
  // operation can start (it must not block): a backend marks a running operation as cut
  // short there. False when already stopped.
  bool stop(const std::function<void(bool running)>& mark = {});
  // Waits until the worker thread has left (a running operation must end by itself, which the
  // backend arranges after stop()); from the worker itself it only lets it go. With a `grace`
  // (not kNoTimeout), a worker still there after it is let go, and an operation it still
  // runs fails ("shut down while it ran"): a backend whose operation may wait on a peer past
  // shutdown (Gloo, MPI) must not make its caller wait for it, and a worker destroying its
  // last task may need the GIL its caller holds; the worker touches only what it owns.
  void join(Millis grace = core::kNoTimeout);

 private:
  struct Task {
    QueuedOp op;
    Body body;
    std::shared_ptr<core::Work> work;
    std::vector<core::Tensor> outputs;
  };
  class QueuedWork;

  void run(Task& task) noexcept;
  // Bookkeeping after an operation ran, on whichever thread ran it.
  void finished_one();
  // For a thread about to wait on operation `seq`: runs queued operations on this thread, in
  // order, up to and including `seq`, whenever no other thread runs one, and fails `seq` if
  // it is still queued at `deadline`. Returns once `seq` is no longer queued.
  void run_until(uint64_t seq, const core::Deadline& deadline);
  static void worker_loop(std::shared_ptr<OpQueue> self);
  // "shm allreduce (sequence 3, rank 0 of 2)"
  std::string describe(const QueuedOp& op) const;

  const Config config_;
  // Never held while a task is destroyed: its body may hold Python objects, and a thread that
  // waits for this lock may hold the GIL (the inline path).
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> tasks_;  // guarded by mutex_
  size_t pending_ = 0;      // queued or running operations; guarded by mutex_
  uint64_t next_seq_ = 0;   // guarded by mutex_
  bool running_ = false;    // guarded by mutex_: someone runs an operation
  // Set with running_, cleared as the body returns, before its Work completes: after a
  // caller saw the Work complete, stop() no longer counts the operation as running.
  std::atomic<bool> in_body_{false};
  QueuedOp running_op_;             // guarded by mutex_: the one running (for messages)
  std::condition_variable turn_;    // an operation finished, or the queue stopped
  bool stopping_ = false;           // guarded by mutex_
  bool deep_sleep_ = false;         // guarded by mutex_: the worker waits to be woken
  std::weak_ptr<core::Work> last_;  // guarded by mutex_
  std::chrono::steady_clock::time_point last_async_{};  // guarded by mutex_
  std::thread worker_;            // started by the first queued operation; guarded by mutex_
  bool worker_left_ = false;      // guarded by mutex_
  std::condition_variable left_;  // worker_left_ became true
  std::shared_ptr<core::Work> worker_running_;  // guarded by mutex_: the worker's operation
};

}  // namespace c10d::pg
