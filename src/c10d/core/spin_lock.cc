#include "c10d/core/spin_lock.h"

#include <sched.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace c10d::core {

void SpinLock::lock_contended() noexcept {
  // A few microseconds of spinning (256 pauses) cover a holder running on another CPU; past
  // that it is likely preempted or busy for long, and yielding lets it (or anything else) run.
  constexpr int kSpins = 256;
  for (;;) {
    for (int i = 0; i < kSpins; ++i) {
      if (try_lock()) return;
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
    }
    ::sched_yield();
  }
}

}  // namespace c10d::core
