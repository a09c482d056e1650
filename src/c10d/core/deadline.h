// Timeouts as deadlines: one place that decides what "no timeout" means and how much time is
// left, so every blocking call computes it the same way.
#pragma once

#include <chrono>
#include <string>

namespace c10d::core {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// A timeout of zero or less means "wait without a deadline" (torch's kNoTimeout).
inline constexpr Millis kNoTimeout{0};

class Deadline {
 public:
  explicit Deadline(Millis timeout) : Deadline(timeout, Clock::now()) {}
  // Counting from `start` instead of now (a clock read the caller already made).
  Deadline(Millis timeout, Clock::time_point start)
      : infinite_(timeout <= Millis::zero()), at_(start + timeout) {}

  // A deadline that has passed already.
  static Deadline passed() {
    const Clock::time_point now = Clock::now();
    return Deadline(Millis(1), now - Millis(1));
  }

  bool infinite() const { return infinite_; }
  bool expired() const { return !infinite_ && Clock::now() >= at_; }
  Clock::time_point time_point() const { return infinite_ ? Clock::time_point::max() : at_; }

  // Time left, clamped at zero; Millis::max() when there is no deadline.
  Millis remaining() const {
    if (infinite_) return Millis::max();
    auto left = std::chrono::duration_cast<Millis>(at_ - Clock::now());
    return left < Millis::zero() ? Millis::zero() : left;
  }

 private:
  bool infinite_;
  Clock::time_point at_;
};

// "300000ms" style text used in every timeout message.
inline std::string format_timeout(Millis timeout) {
  if (timeout <= Millis::zero()) return "no timeout";
  return std::to_string(timeout.count()) + "ms";
}

}  // namespace c10d::core
