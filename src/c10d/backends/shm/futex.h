// Wait primitives of the shm backend: spin hints, shared futexes on the FutexWords of the
// segment headers, and how a blocked rank waits (WaitPolicy). The clock is core::now_ns.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "c10d/backends/shm/segment.h"
#include "c10d/backends/shm/tuning.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace c10d::backends::shm::detail {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Asks for the cache line at `p` in a writable state ahead of a store (PREFETCHW; a no-op on
// x86 CPUs without it, whose decoders take that opcode as a NOP).
inline void prefetch_for_write(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1, 3);
#endif
}

// Shared futexes (no FUTEX_PRIVATE_FLAG): the words live in memory mapped by several processes.
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Sets the word (release) and wakes sleepers, if any.
inline void post(FutexWord& w, uint32_t value) {
  w.value.store(value, std::memory_order_seq_cst);
  if (w.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&w.value);
}

// Wakes the sleepers on `w`, if any, once the caller has published what they wait for. A
// spinning waiter costs nothing (an increment would take the line it polls); a sleeper counts
// itself in `waiters`, then looks for the state again before it sleeps (P2PEngine::wait): the
// two fences make one of them see the other.
inline void notify(FutexWord& w) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (w.waiters.load(std::memory_order_relaxed) != 0) {
    w.value.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(&w.value);
  }
}

// Wrap-around safe "a >= b" for step numbers.
inline bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

// How a blocked rank waits: it spins (cheapest wake-up while every rank has a core), then
// yields the core in a loop (a rank sharing the core, or a busy machine, gets to run while we
// stay runnable), and only then sleeps on the futex. When ranks outnumber cores spinning only
// steals time from the rank being waited for, so there is no spin phase (see
// docs/design/shm.md#wait-policy).
struct WaitPolicy {
  int blind_spins;  // spins before the first clock read (StepChannel::await_step)
  int64_t spin_ns;
  int64_t yield_ns;
};

inline WaitPolicy wait_policy(size_t per_core) {
  if (per_core <= 1) return {kBlindSpins, 200'000, 2'000'000};
  return {0, 0, 500'000};
}

}  // namespace c10d::backends::shm::detail
