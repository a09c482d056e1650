// ShmBackend::Queue: the backend's operations in submission order (op_queue.cc runs them).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

#include "c10d/backends/shm/shm_backend.h"

namespace c10d::backends::shm {

// Operations run one at a time and in submission order: by the caller (synchronous ones with
// nothing queued before them), by the worker thread, or by a caller that waits for an
// asynchronous one still queued (QueuedWork). `running` says one of them is executing: whoever
// sets it has the Engine to itself until finished_one.
//
// Waking the sleeping worker for every asynchronous operation costs more than the operation
// (a futex wake-up of an idle vCPU, which also takes a core from the other ranks; see
// docs/design/shm.md#operation-queue), and usually the caller waits for it soon after and runs
// it itself. So while asynchronous operations are in use (kPollWindow since the last one) the
// worker polls the queue every kPoll instead of being woken: an operation nobody waits for
// still starts within kPoll. After that it sleeps until woken, and submit() wakes it then.
struct ShmBackend::Queue {
  static constexpr std::chrono::microseconds kPoll{1000};
  static constexpr std::chrono::milliseconds kPollWindow{200};

  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Task> tasks;          // guarded by mutex
  size_t pending = 0;              // queued or running operations; guarded by mutex
  uint64_t next_seq = 0;           // guarded by mutex
  bool running = false;            // guarded by mutex
  bool stopping = false;           // guarded by mutex
  bool deep_sleep = false;         // the worker waits to be woken; guarded by mutex
  std::weak_ptr<core::Work> last;  // the latest submitted operation; guarded by mutex
  std::chrono::steady_clock::time_point last_async{};  // guarded by mutex
};

}  // namespace c10d::backends::shm
