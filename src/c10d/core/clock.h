// Clock reads as int64_t nanoseconds, for code that stores or subtracts raw times (the shm
// backend's waits, the flight recorder's timestamps): one definition of each clock.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>

namespace c10d::core {

// Monotonic time (CLOCK_MONOTONIC): read straight from the vDSO, cheap enough for spin loops.
inline int64_t now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// Wall-clock time since the Unix epoch, for timestamps compared across processes and hosts.
inline int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace c10d::core
