// The GPU monitor's window scheduling alone: when detailed windows open and close, which steps are
// traced, and the tail before a closed window's records are final.
#include "torchpilot/runtime/gpu/gpu_window_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1000000;

GpuConfig quiet_config(int64_t first_step = 1000000) {  // by default, windows only where asked
  GpuConfig c;
  c.trace_first_step = first_step;
  c.trace_steps = 2;
  c.trace_anomaly_factor = 0;
  return c;
}

// Drives the planner the way the monitor does; the trace start succeeds unless `start_ok` is off.
struct Driver {
  GpuWindowPlanner planner;
  Nanos now = 0;
  int64_t step = 0, step_in_epoch = 0;
  bool warm = true;
  bool start_ok = true;
  bool busy = false;            // a failed start is another client holding the trace for now
  bool stop_at_once = true;     // false: the GPU runs behind, the test calls trace_stopped()
  std::vector<int64_t> starts;  // steps a window opened at (or tried to)
  std::vector<int64_t> traced;  // steps reported traced
  std::vector<Nanos> ends;      // by step
  GpuWindowPlanner::StepEndActions last;

  explicit Driver(const GpuConfig& c) : planner(c) {}

  GpuWindowPlanner::StepEndActions step_ms(Nanos ms = 10) {
    if (planner.begin_step(now) > 0) {
      starts.push_back(step);
      planner.trace_started(start_ok, !start_ok && busy);
    }
    const Nanos begin = now;
    now += ms * kMs;
    last = planner.end_step(step, step_in_epoch, begin, now, warm);
    if (last.stop_trace && stop_at_once) {
      // The monitor without step markers: stop and flush at once.
      planner.trace_stopped();
      last.flush = true;
    }
    if (last.traced) traced.push_back(step);
    ends.push_back(now);
    ++step;
    ++step_in_epoch;
    return last;
  }
  void steps(int n, Nanos ms = 10) {
    for (int i = 0; i < n; ++i) step_ms(ms);
  }
  GpuWindowPlanner::EpochEndActions end_epoch() {
    step_in_epoch = 0;
    return planner.end_epoch();
  }
  // `n` epochs of `steps_each` steps of 10 ms.
  void epochs(int n, int steps_each) {
    for (int epoch = 0; epoch < n; ++epoch) {
      steps(steps_each);
      end_epoch();
    }
  }
};

using Steps = std::vector<int64_t>;

TEST(GpuWindowPlannerTest, FirstWindowOpensAtTraceFirstStep) {
  Driver r(quiet_config(3));
  r.steps(2);
  EXPECT_TRUE(r.starts.empty());
  r.step_ms();  // step 2's end arms the window ...
  EXPECT_TRUE(r.starts.empty());
  EXPECT_FALSE(r.planner.tracing());
  EXPECT_EQ(r.planner.begin_step(r.now), 2);  // ... and it opens when step 3 begins
  r.planner.trace_started(true);
  EXPECT_TRUE(r.planner.tracing());
  const auto a = r.planner.end_step(3, 3, r.now, r.now + 10 * kMs, true);
  EXPECT_TRUE(a.traced);
  EXPECT_FALSE(a.stop_trace);
}

TEST(GpuWindowPlannerTest, TheFirstTracedStepIsTracedFromItsBeginAndTheRestFromTheirs) {
  Driver r(quiet_config(1));
  r.step_ms();
  // The step's scope begins 5 ms after the boundary its record starts at.
  ASSERT_EQ(r.planner.begin_step(r.now + 5 * kMs), 2);
  r.planner.trace_started(true);
  auto a = r.planner.end_step(1, 1, r.now, r.now + 20 * kMs, true);
  EXPECT_TRUE(a.traced);
  EXPECT_EQ(a.trace_from, r.now + 5 * kMs);
  EXPECT_EQ(r.planner.begin_step(r.now + 20 * kMs), 0);
  a = r.planner.end_step(2, 2, r.now + 20 * kMs, r.now + 30 * kMs, true);
  EXPECT_TRUE(a.traced);
  EXPECT_EQ(a.trace_from, r.now + 20 * kMs);
}

TEST(GpuWindowPlannerTest, TailFlushesThenReleasesAndRecordsBecomeFinal) {
  Driver r(quiet_config(1));
  r.steps(2);  // step 1 traced
  EXPECT_EQ(r.traced, Steps{1});
  EXPECT_TRUE(r.planner.tracing());
  EXPECT_FALSE(r.planner.records_final(r.ends[1]));

  auto a = r.step_ms();  // step 2: the window's last
  EXPECT_TRUE(a.traced);
  EXPECT_TRUE(a.stop_trace);
  EXPECT_TRUE(a.flush);
  EXPECT_FALSE(a.release);
  EXPECT_FALSE(r.planner.tracing());
  EXPECT_TRUE(r.planner.trace_attached());
  EXPECT_FALSE(r.planner.records_final(r.ends[2]));

  r.planner.request_window(3);  // accepted during the tail, opens once the trace is released
  a = r.step_ms();              // step 3: the tail's last
  EXPECT_FALSE(a.traced);
  EXPECT_FALSE(a.stop_trace);
  EXPECT_TRUE(a.flush);
  EXPECT_TRUE(a.release);
  EXPECT_FALSE(r.planner.trace_attached());
  EXPECT_TRUE(r.planner.records_final(r.ends[1]));
  EXPECT_TRUE(r.planner.records_final(r.ends[2]));
  EXPECT_FALSE(r.planner.records_final(r.ends[3])) << "after the cutoff: not from this window";

  a = r.step_ms();  // step 4: nothing left to do; arms the requested window
  EXPECT_FALSE(a.flush || a.release || a.stop_trace || a.traced);
  r.steps(4);
  EXPECT_EQ(r.starts, (Steps{1, 5}));
  EXPECT_EQ(r.traced, (Steps{1, 2, 5, 6, 7}));
}

TEST(GpuWindowPlannerTest, RequestedWindowOpensAtTheStepAfterTheNextEnd) {
  Driver r(quiet_config());
  r.steps(5);
  r.planner.request_window(0);  // ignored
  r.steps(2);
  EXPECT_TRUE(r.starts.empty());
  r.planner.request_window(3);
  r.step_ms();  // step 7's end arms it
  EXPECT_TRUE(r.starts.empty());
  r.steps(10);
  EXPECT_EQ(r.starts, Steps{8});
  EXPECT_EQ(r.traced, (Steps{8, 9, 10}));
}

TEST(GpuWindowPlannerTest, RequestWhileAWindowRunsIsIgnored) {
  Driver r(quiet_config());
  r.planner.request_window(3);
  r.steps(2);  // step 0 arms, step 1 traced
  ASSERT_TRUE(r.planner.tracing());
  r.planner.request_window(2);
  r.steps(20);
  EXPECT_EQ(r.starts, Steps{1});
  EXPECT_EQ(r.traced, (Steps{1, 2, 3}));
}

TEST(GpuWindowPlannerTest, WindowRepeatsEveryNEpochsAtTheSameStepInTheEpoch) {
  GpuConfig c = quiet_config(2);
  c.trace_every_epochs = 2;
  Driver r(c);
  std::vector<Steps> traced_in_epoch;
  for (int epoch = 0; epoch < 5; ++epoch) {
    r.traced.clear();
    r.steps(8);
    r.end_epoch();
    Steps in_epoch;
    for (int64_t s : r.traced) in_epoch.push_back(s % 8);
    traced_in_epoch.push_back(in_epoch);
  }
  EXPECT_EQ(traced_in_epoch, (std::vector<Steps>{{2, 3}, {}, {2, 3}, {}, {2, 3}}));
  EXPECT_EQ(r.starts, (Steps{2, 18, 34}));
}

TEST(GpuWindowPlannerTest, WindowRepeatsEveryEpoch) {
  GpuConfig c = quiet_config(5);
  c.trace_every_epochs = 1;
  c.trace_steps = 3;
  Driver r(c);
  r.epochs(3, 10);
  EXPECT_EQ(r.starts, (Steps{5, 15, 25}));
}

TEST(GpuWindowPlannerTest, NoRepeatWithoutTraceEveryEpochs) {
  Driver r(quiet_config(2));
  r.epochs(3, 8);
  EXPECT_EQ(r.starts, Steps{2});
}

TEST(GpuWindowPlannerTest, FirstWindowWaitsForWarmup) {
  Driver r(quiet_config(0));
  r.warm = false;
  r.steps(5);
  EXPECT_TRUE(r.starts.empty());
  r.warm = true;
  r.steps(4);  // step 5's end arms it: step 6 opens it
  EXPECT_EQ(r.starts, Steps{6});
  EXPECT_EQ(r.traced, (Steps{6, 7}));
}

GpuConfig anomaly_config(int64_t first_step = 1000000) {
  GpuConfig c = quiet_config(first_step);
  c.trace_anomaly_factor = 3;
  return c;
}

TEST(GpuWindowPlannerTest, SlowStepsOpenAnAnomalyWindowOncePerEpoch) {
  Driver r(anomaly_config());
  r.steps(GpuWindowPlanner::kAnomalyHistory);  // the median is known from here
  r.step_ms(25);                               // 2.5x: not slow enough
  r.step_ms(50);  // 5x, but one slow step alone is gone before a window could see it
  r.step_ms();
  EXPECT_TRUE(r.starts.empty());
  r.step_ms(50);  // step 67
  r.step_ms(50);  // step 68: the second in a row arms a window ...
  EXPECT_TRUE(r.starts.empty());
  EXPECT_NE(r.planner.anomaly_reason().find("steps 67-68"), std::string::npos)
      << r.planner.anomaly_reason();
  r.step_ms();  // ... open when the next step begins
  EXPECT_EQ(r.starts, Steps{69});
  r.steps(10);  // window, tail, quiet steps, and some counted ones
  r.step_ms(50);
  r.step_ms(50);
  r.steps(5);
  EXPECT_EQ(r.starts, Steps{69}) << "one anomaly window per epoch";
  r.end_epoch();
  r.steps(2);  // the new epoch's first steps never trigger
  r.step_ms(50);
  r.step_ms(50);
  r.steps(1);
  EXPECT_EQ(r.starts, (Steps{69, 91}));
}

TEST(GpuWindowPlannerTest, SlowStepsWithAKnownCauseOpenNoWindow) {
  Driver r(anomaly_config());
  r.steps(GpuWindowPlanner::kAnomalyHistory);
  // An epoch's first steps (a loader restarting its workers).
  r.end_epoch();
  r.step_ms(500);
  r.step_ms(500);
  r.steps(3);
  // Steps slow by their data wait or by torchpilot's own time: their own work is normal.
  auto slow_with = [&](GpuWindowPlanner::StepFacts f) {
    if (r.planner.begin_step(r.now) > 0) r.starts.push_back(r.step);
    const Nanos b = r.now;
    r.now += 50 * kMs;
    r.planner.end_step(r.step, r.step_in_epoch, b, r.now, true, f);
    ++r.step;
    ++r.step_in_epoch;
  };
  slow_with({45 * kMs, 0, false});
  slow_with({45 * kMs, 0, false});
  slow_with({0, 45 * kMs, false});
  slow_with({0, 45 * kMs, false});
  // A stall at its known period.
  slow_with({0, 0, true});
  slow_with({0, 0, true});
  // Steps a window's release slowed (it runs off the training thread for ~0.35 s).
  slow_with({0, 0, false, true});
  slow_with({0, 0, false, true});
  r.steps(3);
  EXPECT_TRUE(r.starts.empty());
  // The same steps without a known cause open one.
  slow_with({0, 0, false});
  slow_with({0, 0, false});
  r.steps(1);
  EXPECT_EQ(r.starts.size(), 1u);
}

TEST(GpuWindowPlannerTest, OptionalWindowsAskTheBudget) {
  GpuConfig c = anomaly_config(2);
  c.trace_every_epochs = 1;
  Driver r(c);
  std::vector<std::string> asked;
  bool allow = false;
  r.planner.allow_optional = [&](const char* kind, int steps) {
    asked.push_back(kind);
    return allow ? steps : 0;
  };
  // The first window asks too, and waits (reported once) until the budget has room.
  int first_deferred = 0;
  for (int i = 0; i < 5; ++i) first_deferred += r.step_ms().deferred ? 1 : 0;
  EXPECT_TRUE(r.starts.empty());
  EXPECT_EQ(first_deferred, 1);
  ASSERT_FALSE(asked.empty());
  EXPECT_EQ(asked[0], "first");
  allow = true;
  r.steps(GpuWindowPlanner::kAnomalyHistory + 8);  // the window's steps are not in the median
  EXPECT_EQ(r.starts, Steps{6}) << "the first window, once it fits";
  allow = false;
  asked.clear();
  r.step_ms(50);
  const auto a = r.step_ms(50);
  EXPECT_TRUE(a.deferred);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], "anomaly");
  r.steps(2);
  EXPECT_EQ(r.starts, Steps{6}) << "an anomaly that does not fit is skipped";
  r.end_epoch();
  int deferred = 0;
  for (int i = 0; i < 10; ++i) deferred += r.step_ms().deferred ? 1 : 0;
  EXPECT_EQ(r.starts, Steps{6}) << "the repeat waits";
  EXPECT_EQ(deferred, 1) << "a waiting repeat is reported once";
  allow = true;
  r.steps(2);
  EXPECT_EQ(r.starts.size(), 2u) << "... until it fits";
}

TEST(GpuWindowPlannerTest, AWindowTheBudgetCannotHoldWholeTracesFewerSteps) {
  GpuConfig c = quiet_config(2);
  c.trace_steps = 10;
  Driver r(c);
  int room = 0;  // the steps the budget has room for
  r.planner.allow_optional = [&](const char*, int steps) { return std::min(room, steps); };
  r.steps(4);
  EXPECT_TRUE(r.starts.empty()) << "no room: the window waits";
  room = 4;
  r.steps(8);
  ASSERT_EQ(r.starts, Steps{5}) << "armed at step 4's end";
  EXPECT_EQ(r.traced, (Steps{5, 6, 7, 8})) << "the steps there was room for";
  // An answer above what was asked for is held to trace_steps.
  Driver big(c);
  big.planner.allow_optional = [](const char*, int) { return 1000; };
  big.steps(20);
  EXPECT_EQ(big.traced.size(), 10u);
}

TEST(GpuWindowPlannerTest, NoAnomalyWindowBeforeTheMedianIsKnown) {
  Driver r(anomaly_config());
  r.steps(GpuWindowPlanner::kAnomalyHistory - 1);
  r.step_ms(100);  // the 64th step time fills the history: it is not judged against it
  r.steps(3);
  EXPECT_TRUE(r.starts.empty());
}

TEST(GpuWindowPlannerTest, NoAnomalyWindowDuringWarmup) {
  Driver r(anomaly_config());
  r.warm = false;
  r.steps(70);
  r.step_ms(50);
  r.steps(3);
  EXPECT_TRUE(r.starts.empty());
  r.warm = true;  // the steps timed during the warm-up count for the median
  r.step_ms(50);
  r.step_ms(50);
  r.step_ms();
  EXPECT_EQ(r.starts, Steps{76});
}

TEST(GpuWindowPlannerTest, NoAnomalyWindowFromTracedTailOrQuietSteps) {
  Driver r(anomaly_config(70));
  r.steps(70);  // steps 0-69: the median is known
  ASSERT_TRUE(r.starts.empty());
  r.step_ms(50);  // step 70: traced (the trace itself slows steps)
  r.step_ms(50);  // step 71: traced, the window's last (stopped, first flush)
  r.step_ms(50);  // step 72: tail (flush, released)
  ASSERT_TRUE(r.last.release);
  EXPECT_EQ(r.starts, Steps{70});
  EXPECT_EQ(r.traced, (Steps{70, 71}));
  r.end_epoch();  // a new epoch: its anomaly window is unused
  r.step_ms(50);  // step 73: quiet after the release (the release itself makes a slow step)
  r.step_ms(50);  // step 74: quiet
  r.step_ms(50);  // step 75: quiet
  r.step_ms();
  EXPECT_EQ(r.starts, Steps{70});
  r.step_ms(50);  // steps 77-78: count
  r.step_ms(50);
  r.step_ms();
  EXPECT_EQ(r.starts, (Steps{70, 79}));
}

TEST(GpuWindowPlannerTest, MedianIsOfUntracedSteps) {
  // Slow traced, tail and quiet steps stay out of the median: a later slow step still stands out.
  GpuConfig c = anomaly_config(0);
  c.trace_steps = 40;
  Driver r(c);
  r.steps(1);
  // The window, the step end after it (the tail's last), the quiet steps: all slow.
  r.steps(40 + GpuWindowPlanner::kTailSteps - 1 + 3, 100);
  ASSERT_EQ(r.starts, Steps{1});
  r.steps(GpuWindowPlanner::kAnomalyHistory);
  r.step_ms(50);
  r.step_ms(50);
  r.step_ms();
  EXPECT_EQ(r.starts, (Steps{1, 111}));
}

TEST(GpuWindowPlannerTest, AClosedWindowIsStoppedOnlyWhenTheMonitorSaysTheGpuRanIt) {
  Driver r(quiet_config(1));
  r.stop_at_once = false;
  r.steps(3);  // steps 1-2 traced; step 2 closes the window
  ASSERT_TRUE(r.last.stop_trace);
  EXPECT_TRUE(r.planner.stopping());
  EXPECT_TRUE(r.planner.trace_attached());
  r.planner.request_window(2);
  for (int i = 0; i < 5; ++i) {
    // The GPU has not reached step 2's end yet: no tail, no release, no new window.
    const auto a = r.step_ms();
    EXPECT_FALSE(a.flush || a.release || a.stop_trace || a.traced);
    EXPECT_FALSE(r.planner.records_final(r.ends[2]));
  }
  r.planner.trace_stopped();  // the monitor stopped and flushed
  EXPECT_FALSE(r.planner.stopping());
  EXPECT_FALSE(r.planner.records_final(r.ends[2]));
  const auto a = r.step_ms();  // the tail's last step end
  EXPECT_TRUE(a.flush);
  EXPECT_TRUE(a.release);
  EXPECT_TRUE(r.planner.records_final(r.ends[2]));
  EXPECT_FALSE(r.planner.records_final(r.ends[3])) << "after the window's last step";
  r.steps(4);
  EXPECT_EQ(r.starts, (Steps{1, 10}));
}

TEST(GpuWindowPlannerTest, EpochEndStopsAWindowWaitingForTheGpu) {
  Driver r(quiet_config(1));
  r.stop_at_once = false;
  r.steps(4);  // steps 1-2 traced; the stop waits
  ASSERT_TRUE(r.planner.stopping());
  const auto e = r.end_epoch();  // the monitor waits (bounded) for the GPU, then stops
  EXPECT_TRUE(e.stop_trace);
  EXPECT_TRUE(e.release);
  EXPECT_FALSE(r.planner.stopping());
  EXPECT_FALSE(r.planner.trace_attached());
  EXPECT_TRUE(r.planner.records_final(r.ends[2]));
}

TEST(GpuWindowPlannerTest, EpochEndClosesTheWindowAndReleasesTheTrace) {
  GpuConfig c = quiet_config(2);
  c.trace_steps = 10;
  Driver r(c);
  r.steps(5);  // steps 2-4 traced
  ASSERT_TRUE(r.planner.tracing());
  EXPECT_FALSE(r.planner.records_final(r.ends[4]));
  const auto e = r.end_epoch();
  EXPECT_TRUE(e.stop_trace);
  EXPECT_TRUE(e.release);
  EXPECT_FALSE(r.planner.tracing());
  EXPECT_FALSE(r.planner.trace_attached());
  EXPECT_TRUE(r.planner.records_final(r.ends[4]));
  const auto a = r.step_ms();
  EXPECT_FALSE(a.traced || a.flush || a.release || a.stop_trace);
  EXPECT_EQ(r.traced, (Steps{2, 3, 4}));
}

TEST(GpuWindowPlannerTest, EpochEndDuringTheTailReleasesWithoutStopping) {
  Driver r(quiet_config(2));
  r.steps(4);  // steps 2-3 traced; the tail has one step end left
  ASSERT_TRUE(r.planner.trace_attached());
  ASSERT_FALSE(r.planner.tracing());
  const auto e = r.end_epoch();
  EXPECT_FALSE(e.stop_trace);
  EXPECT_TRUE(e.release);
  EXPECT_TRUE(r.planner.records_final(r.ends[3]));
  const auto nothing = r.end_epoch();
  EXPECT_FALSE(nothing.stop_trace || nothing.release);
}

TEST(GpuWindowPlannerTest, AWindowArmedAtAnEpochsLastStepOpensInTheNext) {
  Driver r(quiet_config(4));
  r.steps(4);  // step 3, the epoch's last, arms it
  const auto e = r.end_epoch();
  EXPECT_FALSE(e.stop_trace || e.release);
  EXPECT_TRUE(r.starts.empty());
  r.steps(4);
  EXPECT_EQ(r.starts, Steps{4});
  EXPECT_EQ(r.traced, (Steps{4, 5}));
}

TEST(GpuWindowPlannerTest, FailedTraceStartDisablesWindows) {
  Driver r(quiet_config(1));
  r.start_ok = false;
  r.steps(3);
  EXPECT_EQ(r.starts, Steps{1});  // tried once
  EXPECT_FALSE(r.planner.tracing());
  EXPECT_FALSE(r.planner.trace_attached());
  EXPECT_TRUE(r.traced.empty());
  r.start_ok = true;
  r.planner.request_window(2);
  r.steps(5);
  r.end_epoch();
  r.steps(5);
  EXPECT_EQ(r.starts, Steps{1}) << "no window after a failed start";
}

TEST(GpuWindowPlannerTest, NoWindowsWithoutTheActivityTrace) {
  GpuConfig c = quiet_config(1);
  c.activity = false;
  Driver off(c);
  off.planner.request_window(2);
  off.steps(10);
  EXPECT_TRUE(off.starts.empty());

  c.activity = true;
  Driver unavailable(c);
  unavailable.planner.disable();
  unavailable.steps(10);
  EXPECT_TRUE(unavailable.starts.empty());
}

TEST(GpuWindowPlannerTest, AStartRefusedByABusyTraceSkipsOnlyThatWindow) {
  GpuConfig c;
  c.trace_first_step = 1000;
  c.trace_steps = 2;
  Driver r(c);
  r.start_ok = false;
  r.busy = true;
  r.planner.request_window(2);
  r.steps(4);
  EXPECT_EQ(r.starts, Steps{1});
  EXPECT_TRUE(r.traced.empty());
  r.start_ok = true;  // the other client let go
  r.planner.request_window(2);
  r.steps(4);
  EXPECT_EQ(r.starts, (Steps{1, 5}));
  EXPECT_EQ(r.traced, (Steps{5, 6}));
}

}  // namespace
}  // namespace torchpilot
