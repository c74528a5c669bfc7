// The periodic stall's cost with the slower steps after it (runtime/stalls/step_outliers.h, the
// tail), and the figures periodic_stall and checkpoint share (advisors/stalls/stall_model.h): one
// number per quantity in one epoch.
#include "torchpilot/advisors/stalls/stall_model.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "advice_test_util.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/reports/journal_stats.h"
#include "torchpilot/runtime/stalls/step_outliers.h"

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1000 * 1000;
using test::contains;
using test::evidence;

StepRecord record(int64_t step, int64_t in_epoch, Nanos ns) {
  StepRecord r;
  r.step = step;
  r.step_in_epoch = in_epoch;
  r.begin_ns = step * 1000 * kMs;
  r.end_ns = r.begin_ns + ns;
  return r;
}

// 500 steps of 10 ms; every 50 steps (25, 75, ...) a 100 ms stall, and the `tail` steps after
// each take `tail_ms`. Returns the epoch's summary with its outliers section.
EpochSummary stalled_epoch(int tail, Nanos tail_ms) {
  StallTracker t(3.0);
  EpochSummary e;
  for (int64_t i = 0; i < 500; ++i) {
    const int64_t d = (i - 25) % 50;
    const Nanos ns = i >= 25 && d == 0                ? 100 * kMs
                     : i >= 25 && d >= 1 && d <= tail ? tail_ms * kMs
                                                      : 10 * kMs;
    t.add(record(i, i, ns));
    e.wall_ns += ns;
  }
  e.steps = 500;
  e.sections.set(t.summarize(e, {}));
  return e;
}

// Issue 40: a GAN saving two models every 200 steps was estimated +2.1% where removing the saves
// measured +9..18%: the slower steps after each save were not counted. Here each stall's 90 ms
// above the median is followed by 10 steps 10 ms slower than the steps far from stalls: removing
// the stalls gives 6.9 s -> 5.0 s, +38%; the stalled steps alone said 0.9 / 6.0 = +15%.
TEST(StallTailTest, TheSlowerStepsAfterAStallCountInItsCost) {
  const EpochSummary e = stalled_epoch(10, 20);
  const OutlierStats* o = e.sections.get<OutlierStats>();
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->period, 50);
  EXPECT_EQ(o->periodic_count, 10);
  EXPECT_EQ(o->tail_steps, 10);
  EXPECT_EQ(o->tail_baseline_ns, 10 * kMs);
  EXPECT_EQ(o->periodic_tail_excess_ns, 10 * 100 * kMs);
  const auto a = advise_periodic_stall(e, AdvisorsConfig{});
  ASSERT_TRUE(a.has_value());
  EXPECT_NEAR(a->expected_gain, 6.9 / 5.0 - 1, 1e-9);
  EXPECT_EQ(*evidence(*a, "tail_steps"), 10.0);
  EXPECT_NEAR(*evidence(*a, "tail_excess_per_stall"), 100.0, 1e-9);
  EXPECT_TRUE(contains(a->action,
                       "the 10 steps after each, 100 ms above the steps far from the "
                       "stalls (10 ms)"))
      << a->action;
}

// Steps back to the baseline at once: no tail, the stalled steps' excess alone.
TEST(StallTailTest, NoTailWhenTheStepsAfterAreOrdinary) {
  const EpochSummary e = stalled_epoch(0, 10);
  const OutlierStats* o = e.sections.get<OutlierStats>();
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->tail_steps, 0);
  EXPECT_EQ(o->periodic_tail_excess_ns, 0);
  const auto a = advise_periodic_stall(e, AdvisorsConfig{});
  ASSERT_TRUE(a.has_value());
  EXPECT_NEAR(a->expected_gain, 0.9 / 5.0, 1e-9);
  EXPECT_FALSE(contains(a->action, "steps after each")) << a->action;
}

// A tail longer than half the period is cut there (the rest would be the baseline): bounded.
TEST(StallTailTest, TheTailIsBoundedByHalfThePeriod) {
  const EpochSummary e = stalled_epoch(40, 20);
  const OutlierStats* o = e.sections.get<OutlierStats>();
  ASSERT_NE(o, nullptr);
  EXPECT_LE(o->tail_steps, 25);
}

// One epoch where both advisors speak: a checkpoint stall every 20 steps of 8 ms, 30 ms above the
// median each, and a run journal with 2 failures (MTBF 600 s) and checkpoints every 100 s.
EpochSummary checkpointing_epoch() {
  EpochSummary s;
  s.steps = 100;
  s.wall_ns = 1000 * kMs;
  OutlierStats o;
  o.count = o.periodic_count = 5;
  o.period = 20;
  o.median_ns = 8 * kMs;
  o.periodic_excess_ns = 150 * kMs;
  o.periodic_share = 0.15;
  o.phase = "checkpoint";
  o.phase_share = 0.9;
  s.sections.set(o);
  RunJournalStats j;
  j.runs = 3;
  j.failures = 2;
  j.checkpoints = 12;
  j.wall_s = 1200;
  j.mtbf_s = 600;
  j.checkpoint_interval_s = 100;
  s.sections.set(j);
  return s;
}

// Issue 40: periodic_stall gave Young's interval 5.17 s while checkpoint said "at least every
// 2 s", both from one failure. Both now state Young's interval sqrt(2 x 0.03 s x 600 s) = 6 s.
TEST(SharedFiguresTest, YoungsIntervalIsTheSameInBothAdvisors) {
  const EpochSummary s = checkpointing_epoch();
  const auto stall = advise_periodic_stall(s, AdvisorsConfig{});
  const auto checkpoint = advise_checkpoint(s, AdvisorsConfig{});
  ASSERT_TRUE(stall.has_value());
  ASSERT_TRUE(checkpoint.has_value());
  ASSERT_TRUE(evidence(*stall, "young_interval").has_value()) << stall->action;
  ASSERT_TRUE(evidence(*checkpoint, "young_interval").has_value()) << checkpoint->action;
  EXPECT_NEAR(*evidence(*stall, "young_interval"), 6.0, 1e-9);
  EXPECT_EQ(*evidence(*stall, "young_interval"), *evidence(*checkpoint, "young_interval"));
  EXPECT_TRUE(contains(stall->action, "= 6 s")) << stall->action;
  EXPECT_TRUE(contains(checkpoint->action, "checkpoint about every 6 s")) << checkpoint->action;
  // Without the stall's cost, no Young's interval anywhere; the checkpoint advisor's own target.
  EpochSummary no_cost = s;
  no_cost.sections.set(OutlierStats{});
  EXPECT_FALSE(advise_periodic_stall(no_cost, AdvisorsConfig{}).has_value());
  const auto plain = advise_checkpoint(no_cost, AdvisorsConfig{});
  ASSERT_TRUE(plain.has_value());
  EXPECT_FALSE(evidence(*plain, "young_interval").has_value());
  EXPECT_TRUE(contains(plain->action, "at least every 30 s")) << plain->action;
}

// Issue 40: a stall every 40 steps was reported as every 120 where every third one fell on an
// epoch's first step. The period the tracker finds is the one both advisors state.
TEST(SharedFiguresTest, TheStallPeriodIsTheSameInBothAdvisors) {
  StallTracker t(3.0);
  EpochSummary e;
  int64_t first = 0;
  for (int64_t i = 0; i < 720; ++i) {
    if (i % 120 == 0) {  // an epoch of 120 steps ends
      if (i > 0) {
        e.steps = i - first;
        t.summarize(e, {});
        e = EpochSummary();
      }
      first = i;
    }
    const Nanos ns = i > 0 && i % 40 == 0 ? 60 * kMs : 10 * kMs;
    t.add(record(i, i - first, ns));
    e.wall_ns += ns;
  }
  e.steps = 720 - first;
  OutlierStats o = t.summarize(e, {});
  o.phase = "checkpoint";  // as a trainer's pilot.phase("checkpoint") makes it
  o.phase_share = 0.9;
  e.sections.set(o);
  RunJournalStats j;
  j.failures = 2;
  j.wall_s = 1200;
  j.mtbf_s = 600;
  j.checkpoints = 12;
  j.checkpoint_interval_s = 100;
  e.sections.set(j);
  const auto stall = advise_periodic_stall(e, AdvisorsConfig{});
  const auto checkpoint = advise_checkpoint(e, AdvisorsConfig{});
  ASSERT_TRUE(stall.has_value());
  ASSERT_TRUE(checkpoint.has_value());
  EXPECT_EQ(*evidence(*stall, "period"), 40.0);
  ASSERT_TRUE(evidence(*checkpoint, "stall_period").has_value()) << checkpoint->action;
  EXPECT_EQ(*evidence(*checkpoint, "stall_period"), 40.0);
  EXPECT_TRUE(contains(checkpoint->action, "every 40 steps")) << checkpoint->action;
}

}  // namespace
}  // namespace torchpilot
