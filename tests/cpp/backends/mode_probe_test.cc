#include "c10d/backends/shm/mode_probe.h"

#include <gtest/gtest.h>

namespace c10d::backends::shm {
namespace {

// Runs operations costing cost_of(mode) each, one ns apart, and returns the modes they ran in.
template <typename Cost>
std::vector<bool> run(ModeProbe& probe, int ops, Cost cost_of, int64_t& now) {
  std::vector<bool> modes;
  for (int i = 0; i < ops; ++i) {
    modes.push_back(probe.mode());
    probe.record(cost_of(probe.mode()), ++now);
  }
  return modes;
}

// Other modes within 1.5x of the best are timed in full (slower ones are left early).
ModeProbe::Config quick() { return {/*samples=*/3, /*hold_ops=*/10, /*hold_ns=*/0, 0, 0}; }

// A first probe (3 operations in mode 0, 4 in mode 1) that finds mode 1 faster.
bool settle_on_mode_1(ModeProbe& probe, int64_t& now) {
  run(
      probe, 7, [](bool m) { return m ? 1.0 : 1.25; }, now);
  return probe.mode() == 1;
}

TEST(ModeProbe, SwitchesToTheFasterModeAndHoldsIt) {
  ModeProbe probe(quick());
  int64_t now = 0;
  auto modes = run(
      probe, 7, [](bool m) { return m ? 1.0 : 1.25; }, now);
  // Three timed in the first mode, then four in the other (the first not judged).
  EXPECT_EQ(modes, (std::vector<bool>{false, false, false, true, true, true, true}));
  EXPECT_TRUE(probe.mode());
  modes = run(
      probe, 10, [](bool m) { return m ? 1.0 : 1.25; }, now);
  EXPECT_EQ(modes, std::vector<bool>(10, true));
}

TEST(ModeProbe, ReturnsWhenTheTrialLoses) {
  ModeProbe probe(quick());
  int64_t now = 0;
  run(
      probe, 7, [](bool m) { return m ? 2.5 : 2.0; }, now);
  EXPECT_FALSE(probe.mode());
  // A tie keeps the held mode too.
  ModeProbe tie(quick());
  run(
      tie, 7, [](bool) { return 1.0; }, now);
  EXPECT_FALSE(tie.mode());
}

TEST(ModeProbe, TheFirstOperationAfterASwitchIsNotJudged) {
  ModeProbe probe(quick());
  int64_t now = 0;
  int trial_ops = 0;
  run(
      probe, 7,
      [&](bool m) {
        if (!m) return 2.0;
        return ++trial_ops == 1 ? 0.5 : 3.0;  // only the unjudged one is cheap
      },
      now);
  EXPECT_FALSE(probe.mode());
}

TEST(ModeProbe, SettleOpsAfterASwitchAreNotJudged) {
  // A mode that starts slow for its first three operations (e.g. cold buffers) but is then
  // faster is kept with settle_ops = 3, and left at once with one.
  for (int settle : {1, 3}) {
    ModeProbe::Config config = quick();
    config.settle_ops = settle;
    ModeProbe probe(config);
    int64_t now = 0;
    int trial_ops = 0;
    const auto modes = run(
        probe, 3 + 3 + settle,
        [&](bool m) {
          if (!m) return 2.0;
          return ++trial_ops <= 3 ? 4.0 : 1.0;
        },
        now);
    EXPECT_EQ(probe.mode(), settle == 3) << "settle_ops " << settle;
    if (settle == 3) {  // three operations in mode 0, then 3 unjudged and 3 judged in mode 1
      EXPECT_EQ(modes,
                (std::vector<bool>{false, false, false, true, true, true, true, true, true}));
    }
  }
}

TEST(ModeProbe, ProbesAgainAfterTheHoldAndFollowsAChange) {
  ModeProbe probe(quick());
  int64_t now = 0;
  ASSERT_TRUE(settle_on_mode_1(probe, now));
  // Now the first mode is the faster one: after the hold (10 operations) the next probe
  // (3 in the held mode, 4 in the other) finds it.
  auto modes = run(
      probe, 17, [](bool m) { return m ? 1.25 : 1.0; }, now);
  EXPECT_EQ(std::count(modes.begin(), modes.begin() + 13, true), 13);
  EXPECT_FALSE(probe.mode());
}

TEST(ModeProbe, HoldsForAtLeastItsTime) {
  ModeProbe probe({3, 2, /*hold_ns=*/1000, 0, 0});
  int64_t now = 0;
  ASSERT_TRUE(settle_on_mode_1(probe, now));
  // Far more operations than hold_ops, all within hold_ns: no probe, so no switch.
  auto modes = run(
      probe, 500, [](bool m) { return m ? 1.25 : 1.0; }, now);
  EXPECT_EQ(modes, std::vector<bool>(500, true));
  now += 1000;
  run(
      probe, 8, [](bool m) { return m ? 1.25 : 1.0; }, now);
  EXPECT_FALSE(probe.mode());
}

TEST(ModeProbe, HeldOperationsNeedNoClockUntilTheHoldMayEnd) {
  ModeProbe probe({3, 10, /*hold_ns=*/1000, 0, 0});
  int64_t now = 0;
  ASSERT_TRUE(settle_on_mode_1(probe, now));
  // Nine untimed operations, then the tenth is timed to see whether the hold is over.
  for (int i = 0; i < 9; ++i) {
    ASSERT_FALSE(probe.wants_time()) << i;
    probe.skip();
  }
  ASSERT_TRUE(probe.wants_time());
  probe.record(2.0, ++now);  // too early: another nine untimed
  EXPECT_FALSE(probe.wants_time());
  for (int i = 0; i < 9; ++i) probe.skip();
  ASSERT_TRUE(probe.wants_time());
  now += 1000;
  probe.record(2.0, now);  // the hold is over: every operation of the probe is timed
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(probe.wants_time()) << i;
    probe.record(probe.mode() ? 1.25 : 1.0, ++now);
  }
  EXPECT_FALSE(probe.mode());
  EXPECT_FALSE(probe.wants_time());
}

TEST(ModeProbe, TheFirstOperationsOfAKindAreNotJudged) {
  ModeProbe probe({3, 10, 0, /*first_hold_ops=*/8, 0});
  int64_t now = 0;
  // Cold first operations in the held mode must not make the other mode look faster.
  for (int i = 0; i < 7; ++i) {
    ASSERT_FALSE(probe.wants_time()) << i;
    probe.skip();
  }
  ASSERT_TRUE(probe.wants_time());
  probe.record(50.0, ++now);  // the eighth ends the first hold
  auto modes = run(
      probe, 7, [](bool m) { return m ? 1.25 : 1.0; }, now);
  EXPECT_EQ(modes, (std::vector<bool>{false, false, false, true, true, true, true}));
  EXPECT_FALSE(probe.mode());
}

// hold() replaces what the last probe found until the next probe, which may find it again;
// a running probe ignores it.
TEST(ModeProbe, HoldKeepsAModeUntilTheNextProbe) {
  ModeProbe probe(quick());
  int64_t now = 0;
  ASSERT_TRUE(settle_on_mode_1(probe, now));
  probe.hold(0);
  EXPECT_EQ(probe.held(), 0);
  // 10 held operations in mode 0, then a probe (3 in mode 0, 4 in mode 1) finds mode 1 again.
  auto modes = run(
      probe, 17, [](bool m) { return m ? 1.0 : 1.25; }, now);
  EXPECT_EQ(std::count(modes.begin(), modes.begin() + 13, false), 13);
  EXPECT_TRUE(probe.mode());
  probe.hold(5);  // no such mode
  EXPECT_TRUE(probe.mode());
  ModeProbe probing({3, 10, 0, 0, 0});  // probes from its first operation
  probing.record(1.0, ++now);
  probing.hold(1);
  EXPECT_FALSE(probing.mode());
}

TEST(ModeProbe, TriesEveryModeAndKeepsTheFastest) {
  ModeProbe probe({3, 10, 0, 0, 0}, 4);
  int64_t now = 0;
  const double cost[4] = {1.3, 1.2, 1.0, 1.1};
  std::vector<int> modes;
  for (int i = 0; i < 3 + 3 * 4; ++i) {
    modes.push_back(probe.mode());
    probe.record(cost[probe.mode()], ++now);
  }
  // Three in the held mode, then four in each other mode (the first not judged).
  EXPECT_EQ(modes, (std::vector<int>{0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}));
  EXPECT_EQ(probe.mode(), 2);
  // The next probe starts from mode 2 and visits 0, 1 and 3.
  modes.clear();
  for (int i = 0; i < 10 + 3 + 3 * 4; ++i) {
    modes.push_back(probe.mode());
    probe.record(cost[probe.mode()], ++now);
  }
  EXPECT_EQ(std::vector<int>(modes.begin() + 10, modes.end()),
            (std::vector<int>{2, 2, 2, 0, 0, 0, 0, 1, 1, 1, 1, 3, 3, 3, 3}));
  EXPECT_EQ(probe.mode(), 2);
}

TEST(ModeProbe, CostsGoToTheModeAnOperationRanIn) {
  // A caller that follows mode() one operation late (as ranks agreeing on a mode do): every
  // cost must count for the mode the operation really ran in.
  ModeProbe probe({3, 10, 0, 0, 0}, 2);
  int64_t now = 0;
  int ran = probe.mode();
  for (int i = 0; i < 7; ++i) {
    probe.record(ran == 1 ? 1.0 : 1.25, ++now, 0, ran);
    ran = probe.mode() == 1 && i >= 3 ? 1 : 0;  // late by one
  }
  EXPECT_EQ(probe.mode(), 1);
  // Costs reported for the held mode during the other's visit do not make it look faster.
  ModeProbe other({3, 10, 0, 0, 0}, 2);
  for (int i = 0; i < 3; ++i) other.record(2.0, ++now, 0, 0);
  ASSERT_EQ(other.mode(), 1);
  other.record(5.0, ++now, 0, 0);  // still the old mode: 5.0 is mode 0's cost
  for (int i = 0; i < 3; ++i) other.record(3.0, ++now, 0, 1);
  EXPECT_EQ(other.mode(), 0);  // mode 1 (3.0) lost to mode 0's best (2.0)
}

TEST(ModeProbe, AFarSlowerModeIsLeftAfterOneJudgedOperation) {
  ModeProbe probe({3, 10, 0, 0, 0}, 4);
  int64_t now = 0;
  const double cost[4] = {1.0, 5.0, 1.2, 0.9};
  std::vector<int> modes;
  std::vector<int> ended;  // operations that ended a probe
  for (int i = 0; i < 3 + 2 + 4 + 4; ++i) {
    modes.push_back(probe.mode());
    if (probe.record(cost[probe.mode()], ++now)) ended.push_back(i);
  }
  EXPECT_EQ(ended, std::vector<int>{12});
  // Mode 1 (5x the best) gets the unjudged operation and one judged one only.
  EXPECT_EQ(modes, (std::vector<int>{0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}));
  EXPECT_EQ(probe.mode(), 3);
}

TEST(ModeProbe, HoldsTwentyTimesAsLongAsItsProbeTook) {
  ModeProbe probe({3, 1, /*hold_ns=*/0, 0, /*hold_per_probe=*/20});
  int64_t now = 0;
  for (int i = 0; i < 7; ++i) {  // a probe of 7 operations of 100 ns each
    now += 100;
    probe.record(probe.mode() ? 1.0 : 1.25, now);
  }
  ASSERT_EQ(probe.mode(), 1);
  // The probe took 700 ns (it started at construction): no new probe for 14 us.
  for (int i = 0; i < 100; ++i) {
    now += 100;
    probe.record(probe.mode() ? 1.25 : 1.0, now);
    ASSERT_EQ(probe.mode(), 1) << i;
  }
  for (int i = 0; i < 60; ++i) {
    now += 100;
    probe.record(probe.mode() ? 1.25 : 1.0, now);
  }
  EXPECT_EQ(probe.mode(), 0);  // probed again from 14.7 us and found mode 0
}

TEST(ModeProbe, AnUntriedProbeStartsFromAnAdoptedMode) {
  ModeProbe probe({3, 10, 0, /*first_hold_ops=*/8, 0});
  ASSERT_TRUE(probe.untried());
  probe.adopt(1);
  EXPECT_EQ(probe.mode(), 1);
  int64_t now = 0;
  for (int i = 0; i < 7; ++i) probe.skip();
  probe.record(1.0, ++now);
  // Its probe starts from mode 1 and keeps it when mode 0 is slower.
  auto modes = run(
      probe, 7, [](bool m) { return m ? 1.0 : 1.25; }, now);
  EXPECT_EQ(modes, (std::vector<bool>{true, true, true, false, false, false, false}));
  EXPECT_EQ(probe.mode(), 1);
  EXPECT_FALSE(probe.untried());
  probe.adopt(0);  // a tried probe keeps its own find
  EXPECT_EQ(probe.mode(), 1);
}

TEST(ModeProbe, AnotherKindOfOperationRestartsTheProbe) {
  ModeProbe probe(quick());
  int64_t now = 0;
  // Baseline on kind 1 (cost 2), then the trial's operations are of kind 2, cheap in either
  // mode: they must not be compared with kind 1's baseline.
  for (int i = 0; i < 3; ++i) probe.record(2.0, ++now, 1);
  ASSERT_TRUE(probe.mode());
  probe.record(0.1, ++now, 2);  // restarts: back to the held mode, a new baseline
  EXPECT_FALSE(probe.mode());
  for (int i = 0; i < 2; ++i) probe.record(0.1, ++now, 2);
  ASSERT_TRUE(probe.mode());  // kind 2's trial
  for (int i = 0; i < 4; ++i) probe.record(0.2, ++now, 2);
  EXPECT_FALSE(probe.mode());  // the trial lost on kind 2's own terms
}

TEST(ModeProbe, AKindIsFirstProbedOnlyOnceItsOperationsTookTheFirstHoldInAll) {
  ModeProbe::Config config{3, 10, 0, /*first_hold_ops=*/8, 0};
  config.first_hold_ns = 1000;
  ModeProbe probe(config);
  int64_t now = 0;
  // Operations of 100 ns; one in 8 is timed and stands for the 8. After 8 (800 ns) no probe
  // yet; after 16 (1600 ns) the probe starts.
  for (int i = 0; i < 16; ++i) {
    ASSERT_EQ(probe.mode(), 0) << i;
    ASSERT_TRUE(probe.untried()) << i;
    if (!probe.wants_time()) {
      probe.skip();
      continue;
    }
    ASSERT_TRUE(i == 7 || i == 15) << i;  // held operations read no clock
    probe.record(1.0, now += 100, 0, -1, 100);
  }
  auto modes = run(
      probe, 7, [](bool m) { return m ? 1.0 : 1.25; }, now);
  EXPECT_EQ(modes, (std::vector<bool>{false, false, false, true, true, true, true}));
  EXPECT_EQ(probe.mode(), 1);
  EXPECT_FALSE(probe.untried());
}

}  // namespace
}  // namespace c10d::backends::shm
