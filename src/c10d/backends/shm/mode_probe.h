// ModeProbe: picks the fastest of a few ways (modes) to run repeated operations by timing
// whole operations in each, again and again, since which one wins can change while a job
// runs. A probe compares operations of one kind (`key`, e.g. a size): one of another kind in
// the middle of a probe starts it again from that operation.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace c10d::backends::shm {

class ModeProbe {
 public:
  static constexpr int kMaxModes = 4;

  // Operations of every kind are compared per unit of work (e.g. ns per byte), so the
  // caller reports `cost` already divided by the work done.
  struct Config {
    // Operations timed in each mode per probe.
    int samples = 3;
    // A hold (the time between probes) lasts at least hold_ops operations, hold_ns and
    // hold_per_probe times as long as the probe before it: probes then take at most ~5% of
    // the time, however long the operations are.
    int hold_ops = 64;
    int64_t hold_ns = 50'000'000;
    // Operations before the first probe: the first of a kind pay for cold caches and first
    // touches in any mode.
    int first_hold_ops = 8;
    int64_t hold_per_probe = 20;
    // Nor before the operations of the kind took this long in all (estimated from the one
    // timed at the end of each first_hold_ops): a probe's operations in the slower modes cost
    // as much as it can save over a kind that runs only briefly (a benchmark's row: a few
    // operations, every one measured).
    int64_t first_hold_ns = 0;
    // Operations after a change of mode that are not judged.
    int settle_ops = 1;
  };

  ModeProbe() : ModeProbe(Config{}) {}
  explicit ModeProbe(Config config, int modes = 2)
      : config_(config), modes_(std::clamp(modes, 1, kMaxModes)) {
    hold_ops_ = config.first_hold_ops;
    if (hold_ops_ <= 0) start_probe(0);
  }

  int modes() const { return modes_; }

  // Whether this probe has not finished a probe yet (its held mode is only the initial one).
  bool untried() const { return untried_; }

  // Starts an untried probe from `mode` (e.g. what a similar probe found) instead of mode 0.
  void adopt(int mode) {
    if (!untried_ || probing_ || mode < 0 || mode >= modes_) return;
    held_ = mode_ = last_ran_ = mode;
  }

  // The mode kept between probes.
  int held() const { return held_; }

  // Keeps `mode` until the next probe, e.g. when what the last probe found no longer holds.
  // Ignored during a probe, which finds out itself.
  void hold(int mode) {
    if (probing_ || mode < 0 || mode >= modes_) return;
    held_ = mode_ = mode;
  }

  // The mode the next operation should run in, 0 to modes() - 1.
  int mode() const { return mode_; }

  // Whether the next operation must be timed: a probe runs, or the hold may be over (then
  // record() looks at the clock). Other operations are reported with skip().
  bool wants_time() const { return probing_ || count_ + 1 >= hold_ops_; }

  // An operation ran in the held mode without being timed.
  void skip() { ++count_; }

  // One operation of kind `key` ran in mode `ran` (mode() unless the caller could not follow
  // it at once) at `cost` per unit of work, took `duration_ns` and ended at `now_ns`. Returns
  // whether it ended a probe (mode() is then the probe's find).
  bool record(double cost, int64_t now_ns, uint64_t key = 0, int ran = -1,
              int64_t duration_ns = 0) {
    if (ran < 0 || ran >= modes_) ran = mode_;
    // The first operations after a change of mode pay for the switch (e.g. cache lines left
    // where the old mode put them), so they are not judged.
    since_switch_ = ran != last_ran_ ? 0 : since_switch_ + 1;
    const bool switched = since_switch_ < config_.settle_ops;
    last_ran_ = ran;
    if (probing_ && (visit_ > 0 || count_ > 0) && key != key_) start_probe(now_ns);
    key_ = key;
    if (!probing_) {
      if (++count_ < hold_ops_) return false;
      const int ops = count_;
      count_ = 0;
      if (untried_ && spent_ns_ < config_.first_hold_ns) {
        // The one timed operation stands for the hold's others: held operations read no clock.
        spent_ns_ += duration_ns * ops;
        if (spent_ns_ < config_.first_hold_ns) return false;
      } else if (now_ns < probe_at_) {
        return false;  // look again after hold_ops operations
      }
      start_probe(now_ns);
      return false;
    }
    // A mode far slower than the best so far is left after one judged operation: trying a
    // bad mode is the cost of probing, so it must stay short.
    bool abandon = false;
    if (!switched) {
      abandon = visit_ > 0 && cost > kAbandon * *std::min_element(best_.begin(), best_.end());
      best_[ran] = std::min(best_[ran], cost);
    }
    if (++count_ < config_.samples + (visit_ > 0 ? config_.settle_ops : 0) && !abandon) {
      return false;
    }
    count_ = 0;
    if (++visit_ < modes_) {
      mode_ = visit_ - 1 < held_ ? visit_ - 1 : visit_;  // the other modes in turn
      return false;
    }
    for (int m = 0; m < modes_; ++m) {
      if (best_[m] < best_[held_]) held_ = m;  // only a strictly faster mode replaces it
    }
    mode_ = held_;
    probing_ = false;
    untried_ = false;
    hold_ops_ = config_.hold_ops;
    const int64_t probed = now_ns - probe_start_;
    probe_at_ = now_ns + std::max(config_.hold_ns, config_.hold_per_probe * probed);
    return true;
  }

 private:
  // A probe visits the held mode first, then every other one.
  void start_probe(int64_t now_ns) {
    probe_start_ = now_ns;
    probing_ = true;
    visit_ = 0;
    count_ = 0;
    mode_ = held_;
    best_.fill(kNone);
  }

  static constexpr double kNone = 1e300;
  static constexpr double kAbandon = 1.5;
  Config config_;
  int modes_;
  int held_ = 0;  // the mode between probes
  int mode_ = 0;
  bool probing_ = false;
  bool untried_ = true;
  int visit_ = 0;  // the probe's visit: 0 the held mode, then the others
  int count_ = 0;  // operations in this visit, or in this hold
  int hold_ops_ = 0;
  int64_t probe_at_ = 0;
  int64_t probe_start_ = 0;
  int64_t spent_ns_ = 0;  // time the kind's operations took before its first probe
  uint64_t key_ = 0;
  int last_ran_ = 0;
  int since_switch_ = 0;                  // operations since the mode changed
  std::array<double, kMaxModes> best_{};  // fastest cost seen per mode (set by start_probe)
};

}  // namespace c10d::backends::shm
