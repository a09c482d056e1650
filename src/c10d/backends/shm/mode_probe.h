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
    int samples = 3;                // operations timed in each mode per probe
    int hold_ops = 64;              // operations between probes, at least ...
    int64_t hold_ns = 50'000'000;   // ... and at least this long
    int first_hold_ops = 8;         // before the first probe: the first operations of a kind
                                    // pay for cold caches and first touches in either mode
  };

  ModeProbe() : ModeProbe(Config{}) {}
  explicit ModeProbe(Config config)
      : config_(config),
        phase_(config.first_hold_ops > 0 ? Phase::kHold : Phase::kBaseline),
        hold_ops_(config.first_hold_ops) {}

  // The mode the next operation runs in: false or true.
  bool mode() const { return mode_; }

  // Whether the next operation must be timed: a probe runs, or the hold may be over (then
  // record() looks at the clock). Other operations are reported with skip().
  bool wants_time() const {
    return phase_ != Phase::kHold || count_ + 1 >= hold_ops_;
  }

  // An operation ran in the held mode without being timed.
  void skip() { ++count_; }

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
        if (++count_ < hold_ops_) return;
        if (now_ns < probe_at_) {  // look again after another hold_ops operations
          count_ = 0;
          return;
        }
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
        hold_ops_ = config_.hold_ops;
        probe_at_ = now_ns + config_.hold_ns;
        return;
    }
  }

 private:
  enum class Phase { kHold, kBaseline, kTrial };
  static constexpr double kNone = 1e300;
  Config config_;
  bool mode_ = false;
  Phase phase_;
  int hold_ops_;  // this hold's length in operations
  int count_ = 0;
  int64_t probe_at_ = 0;
  uint64_t key_ = 0;
  double best_[2] = {kNone, kNone};  // fastest cost seen: [0] the held mode, [1] the other
};

}  // namespace c10d::backends::shm
