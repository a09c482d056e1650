// SpinLock: a lock for short critical sections on hot paths (a few stores into memory that is
// already in cache). Taking it is one atomic exchange and releasing it one plain store, where
// std::mutex costs two locked instructions and two library calls (see FlightRecorder, which
// every collective enters twice).
//
// A waiter spins a little and then yields its CPU in a loop, so a holder that was preempted, or
// one that does something long (a trace dump), still gets to run and let go. Not for sections
// that block or wait for other threads. Meets the Lockable requirements (std::lock_guard).
#pragma once

#include <atomic>

namespace c10d::core {

class SpinLock {
 public:
  void lock() noexcept {
    if (!held_.exchange(true, std::memory_order_acquire)) return;
    lock_contended();
  }
  bool try_lock() noexcept {
    return !held_.load(std::memory_order_relaxed) &&
           !held_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  void lock_contended() noexcept;
  std::atomic<bool> held_{false};
};

}  // namespace c10d::core
