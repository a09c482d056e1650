// ModeProbe: picks the faster of two ways to run repeated operations by timing whole
// operations in each, again and again, since which one wins can change while a job runs.
// A probe compares operations of one kind (`key`, e.g. a size): one of another kind in the
// middle of a probe starts it again from that operation.
#pragma once

#include <algorithm>
#include <cstdint>

namespace c10d::backends::shm {

class ModeProbe {
 public:
  // Operations of every kind are compared per unit of work (e.g. ns per byte), so the
  // caller reports `cost` already divided by the work done.
  struct Config {
    int samples = 3;           // operations timed in each mode per probe
    int hold_ops = 64;         // operations between probes, at least ...
    int64_t hold_ns = 50'000'000;  // ... and at least this long
  };

  ModeProbe() : ModeProbe(Config{}) {}
  explicit ModeProbe(Config config) : config_(config) {}

  // The mode the next operation runs in: false or true.
  bool mode() const { return mode_; }

  // One operation of kind `key` ran in mode() at `cost` per unit of work and ended at `now_ns`.
  void record(double cost, int64_t now_ns, uint64_t key = 0) {
    const bool starting = phase_ == Phase::kBaseline && count_ == 0;
    if (phase_ != Phase::kHold && !starting && key != key_) {
      if (phase_ == Phase::kTrial) mode_ = !mode_;  // back to the held mode
      phase_ = Phase::kBaseline;
      count_ = 0;
      best_[0] = best_[1] = kNone;
    }
    key_ = key;
    switch (phase_) {
      case Phase::kHold:
        if (++count_ < config_.hold_ops || now_ns < probe_at_) return;
        phase_ = Phase::kBaseline;
        count_ = 0;
        best_[0] = best_[1] = kNone;
        return;
      case Phase::kBaseline:
        best_[0] = std::min(best_[0], cost);
        if (++count_ < config_.samples) return;
        phase_ = Phase::kTrial;
        count_ = 0;
        mode_ = !mode_;
        return;
      case Phase::kTrial:
        // The first operation in the other mode pays for the switch (e.g. cache lines left
        // where the old mode put them), so it is not judged.
        if (count_ > 0) best_[1] = std::min(best_[1], cost);
        if (++count_ <= config_.samples) return;
        if (!(best_[1] < best_[0])) mode_ = !mode_;  // the trial lost: back
        phase_ = Phase::kHold;
        count_ = 0;
        probe_at_ = now_ns + config_.hold_ns;
        return;
    }
  }

 private:
  enum class Phase { kHold, kBaseline, kTrial };
  static constexpr double kNone = 1e300;
  Config config_;
  bool mode_ = false;
  Phase phase_ = Phase::kBaseline;  // the first probe starts at once
  int count_ = 0;
  int64_t probe_at_ = 0;
  uint64_t key_ = 0;
  double best_[2] = {kNone, kNone};  // fastest cost seen: [0] the held mode, [1] the other
};

}  // namespace c10d::backends::shm
