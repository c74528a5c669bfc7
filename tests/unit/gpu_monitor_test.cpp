// The GPU monitor inside a Pilot, through the fake GPU backend (tests/fakes/): windows, the
// budget, anomaly windows, NVTX ranges, the device choice (step markers: gpu_step_markers_test.cpp;
// the CUPTI backend's own tests: gpu_backend_test.cpp).
#include "torchpilot/runtime/gpu/gpu_monitor.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "fakes/gpu_monitor_rig.h"
#include "fakes/late_sink.h"
#include "fakes/scoped_env.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/cost/cost.h"
#include "torchpilot/runtime/gpu/gpu_step_stats.h"
#include "torchpilot/runtime/stalls/step_outliers.h"

namespace torchpilot {
namespace {

using test::pm;
using test::Rig;

constexpr Nanos kMs = 1000000;

TEST(GpuMonitorTest, OneSmKernelIsBusyButInefficientInTheAdvisoryLog) {
  Config c = Rig::window_config(3, 4);
  Rig rig(c);
  ASSERT_NE(rig.pilot->collector<GpuMonitor>(), nullptr);
  for (int i = 0; i < 12; ++i) rig.step(100, 1, 0.01);
  rig.pilot->end_epoch();

  ASSERT_EQ(rig.sink->epochs.size(), 1u);
  const EpochSummary& s = rig.sink->epochs[0];
  ASSERT_TRUE(s.sections.get<GpuEpochStats>());
  EXPECT_EQ(s.sections.get<GpuEpochStats>()->device, "Fake GPU");
  EXPECT_EQ(s.sections.get<GpuEpochStats>()->traced_steps, 4);
  EXPECT_NEAR(s.sections.get<GpuEpochStats>()->stats.counter_utilization, 1.0, 1e-9);
  EXPECT_NEAR(s.sections.get<GpuEpochStats>()->stats.sm_efficiency, 0.01, 1e-9);
  EXPECT_NEAR(s.sections.get<GpuEpochStats>()->stats.gpu_utilization, 1.0, 1e-9);
  EXPECT_NEAR(s.sections.get<GpuEpochStats>()->stats.estimated_sm_efficiency, 0.01, 1e-9);
  ASSERT_FALSE(s.sections.get<GpuEpochStats>()->top_kernels.empty());
  EXPECT_EQ(s.sections.get<GpuEpochStats>()->top_kernels[0].name, "spin_kernel");
  EXPECT_NEAR(s.sections.get<GpuEpochStats>()->top_kernels[0].mean_blocks_per_sm, 0.01, 1e-9);

  const auto& advice = rig.sink->advice[0];
  auto it = std::find_if(advice.begin(), advice.end(),
                         [](const Advice& a) { return a.id == "busy_inefficient"; });
  ASSERT_NE(it, advice.end());
  EXPECT_EQ(it->severity, Severity::kHigh);
  EXPECT_NE(it->cause.find("spin_kernel"), std::string::npos) << it->cause;
  // The bound if every SM were busy (100x here) is evidence, not a promised gain.
  EXPECT_EQ(it->expected_gain, 0.0);
  auto bound = std::find_if(it->evidence.begin(), it->evidence.end(), [](const Evidence& e) {
    return e.name == "gain_bound_if_every_sm_busy";
  });
  ASSERT_NE(bound, it->evidence.end());
  EXPECT_NEAR(bound->value, 99.0, 1e-6);
  // Every step's record was published, the traced ones flagged.
  ASSERT_EQ(rig.sink->late<GpuStepRecord>().size(), 12u);
  int traced = 0;
  for (const auto& r : rig.sink->late<GpuStepRecord>()) traced += r.traced ? 1 : 0;
  EXPECT_EQ(traced, 4);
  EXPECT_TRUE(rig.sink->late<GpuStepRecord>()[3].traced);
  EXPECT_FALSE(rig.sink->late<GpuStepRecord>()[2].traced);
  // The log shows nvidia-smi's number next to the truth.
  EXPECT_NE(rig.log.str().find("utilization 100.0% (NVML 100.0%), SM efficiency 1.0%"),
            std::string::npos)
      << rig.log.str();
}

TEST(GpuMonitorTest, StepsArePublishedOnceSamplesCoverThem) {
  Rig rig;
  auto s = rig.pilot->step(1);
  rig.clock->advance(10 * kMs);
  s.end();
  EXPECT_TRUE(
      rig.sink->late<GpuStepRecord>().empty());  // no PM sample has reached the step's end yet
  rig.backend->queued.pm.push_back(pm(0, 20 * kMs, 0.5));
  auto s2 = rig.pilot->step(1);
  rig.clock->advance(GpuMonitor::kCollectEveryNs);  // its end collects (steps between do not)
  s2.end();
  ASSERT_EQ(rig.sink->late<GpuStepRecord>().size(),
            1u);  // step 0 only; step 1 ends after the sample
  EXPECT_DOUBLE_EQ(rig.sink->late<GpuStepRecord>()[0].stats.sm_efficiency, 0.5);
  rig.pilot->end_epoch();  // the epoch end finishes the rest with what arrived
  EXPECT_EQ(rig.sink->late<GpuStepRecord>().size(), 2u);
}

// A step that lies mostly in a sampling gap (PM sampling restarting after a window's release)
// weighs in the epoch's PM means by the part its samples cover, not by its wall time.
TEST(GpuMonitorTest, EpochPmMeansWeighStepsByTheirSampledTime) {
  Rig rig;
  auto s1 = rig.pilot->step(1);
  rig.clock->advance(100 * kMs);
  s1.end();
  auto s2 = rig.pilot->step(1);
  rig.clock->advance(100 * kMs);
  s2.end();
  rig.backend->queued.pm.push_back(pm(0, 100 * kMs, 0.8, 1.0));
  // The second step: sampled only for its last 10 ms, a sample reading idle.
  rig.backend->queued.pm.push_back(pm(190 * kMs, 200 * kMs, 0.0, 0.0));
  rig.pilot->end_epoch();
  const auto& late = rig.sink->late<GpuStepRecord>();
  ASSERT_EQ(late.size(), 2u);
  EXPECT_EQ(late[0].stats.pm_covered_ns, 100 * kMs);
  EXPECT_EQ(late[1].stats.pm_covered_ns, 10 * kMs);
  const GpuStats& g = rig.sink->epochs[0].sections.get<GpuEpochStats>()->stats;
  EXPECT_NEAR(g.sm_efficiency, 0.8 * 100 / 110, 1e-9);  // by wall time it would read 0.4
  EXPECT_NEAR(g.counter_utilization, 100.0 / 110, 1e-9);
  EXPECT_EQ(g.pm_covered_ns, 110 * kMs);
}

// A window asked for while the previous one's release still runs opens once it is done: started
// at once, the trace's start would wait for the release on the training thread (0.3 s on an H200
// with PM sampling, traced as GPU idle: a short-epoch trainer's every repeat began so).
TEST(GpuMonitorTest, AWindowWaitsForThePreviousReleaseInsteadOfWaitingOnTheTrainingThread) {
  Config c = Rig::window_config(2, 3);
  Rig rig(c, false);
  rig.backend->slow_release = true;
  rig.make(c);
  for (int i = 0; i < 8 && !rig.backend->releasing; ++i) rig.step(10, 200, 1.0);
  ASSERT_TRUE(rig.backend->releasing) << "the first window's release runs";
  rig.pilot->request_window(2);
  for (int i = 0; i < 5; ++i) rig.step(10, 200, 1.0);  // armed at the first one's end
  EXPECT_EQ(rig.backend->trace_starts, 1) << "waits for the release";
  rig.backend->releasing = false;  // the release's thread is done
  rig.step(10, 200, 1.0);          // the window opens as the next step begins
  EXPECT_EQ(rig.backend->trace_starts, 2);
  EXPECT_EQ(rig.backend->starts_while_releasing, 0);
}

// A repeat that waited for the previous window's release opens at the step after it: each
// window's cost and prediction stay its own (the steps between them are all the first's, so its
// cost would otherwise run on into the second's and only one window would be counted).
TEST(GpuMonitorTest, AWindowOpeningRightAfterTheReleaseItWaitedForIsCostedOnItsOwn) {
  // 0.2 s epochs, a repeat at step 2 of each, releases of 20 steps. The first window's release
  // is waited for at its epoch's end (the run's first); the later epochs' ends have no room to
  // wait (0.4 s), so their releases run into the next epoch, past its repeat's step.
  Config c = Rig::window_config(2, 3, 1);
  Rig rig(c, false);
  rig.backend->slow_release = true;
  rig.make(c);
  int releasing = 0;
  int64_t predicted = 0;
  int waits = 0;  // epochs whose repeat was due while a release ran
  for (int epoch = 0; epoch < 4; ++epoch) {
    for (int i = 0; i < 20; ++i) {
      if (!rig.backend->releasing) releasing = 0;
      if (rig.backend->releasing && ++releasing == 20) rig.backend->releasing = false;
      if (i == 3 && rig.backend->releasing) ++waits;
      rig.step(10, 200, 1.0);
    }
    rig.pilot->end_epoch();
    predicted += rig.sink->epochs.back().sections.get<GpuEpochStats>()->windows_predicted;
  }
  ASSERT_GE(waits, 1) << "a repeat was due while a release ran";
  EXPECT_EQ(rig.backend->trace_starts, 4);
  EXPECT_EQ(rig.backend->starts_while_releasing, 0);
  // The last window's cost completes after the run; each of the others has its own (merged, the
  // third's would run on into the fourth's and neither would complete).
  EXPECT_EQ(predicted, 3);
}

TEST(GpuMonitorTest, WindowsOpenAtTheFirstStepAgainEachEpochAndOnRequest) {
  Config c = Rig::window_config(2, 3, 1);
  Rig rig(c);
  for (int i = 0; i < 10; ++i) rig.step(10, 200, 1.0);
  EXPECT_EQ(rig.backend->trace_starts, 1);
  EXPECT_EQ(rig.backend->trace_stops, 1);
  // The tail flushes nothing on the training thread: the release's forced flush (off the
  // training thread in the real backend) delivers the window's last records.
  EXPECT_EQ(rig.backend->flushes, 0);
  EXPECT_EQ(rig.backend->releases, 1);  // then CUPTI is detached
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->traced_steps, 3);
  for (int i = 0; i < 10; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.backend->trace_starts, 2);
  EXPECT_EQ(rig.sink->epochs[1].sections.get<GpuEpochStats>()->traced_steps, 3);

  rig.pilot->request_window(2);
  for (int i = 0; i < 4; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.backend->trace_starts, 3);
  EXPECT_EQ(rig.sink->epochs[2].sections.get<GpuEpochStats>()->traced_steps, 2);
  EXPECT_FALSE(rig.backend->tracing);
}

TEST(GpuMonitorTest, StepsDoNotWaitForPmSamplingThatStoppedAfterAWindow) {
  Config c = Rig::window_config(1, 1);
  Rig rig(c);
  rig.step(10, 200, 1.0);
  rig.step(10, 200, 1.0);  // traced
  rig.backend->statuses[0] = {"pm_sampling", false, "after releasing the trace: failed"};
  auto s = rig.pilot->step(1);  // no PM samples from here on
  rig.clock->advance(10 * kMs);
  s.end();
  auto s2 = rig.pilot->step(1);  // the release happens at this step's end (tail of 2)
  rig.clock->advance(10 * kMs);
  s2.end();
  auto s3 = rig.pilot->step(1);
  rig.clock->advance(GpuMonitor::kCollectEveryNs);  // its end collects (after the window's)
  s3.end();
  EXPECT_EQ(rig.backend->releases, 1);
  EXPECT_EQ(rig.sink->late<GpuStepRecord>().size(), 5u)
      << "every step published without waiting for samples";
}

TEST(GpuMonitorTest, AWindowArmedAtAnEpochsLastStepOpensInTheNext) {
  Config c = Rig::window_config(4, 2);  // armed at the end of step 3, the epoch's last
  Rig rig(c);
  for (int i = 0; i < 4; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.backend->trace_starts, 0) << "nothing to trace in this epoch";
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->traced_steps, 0);
  for (int i = 0; i < 4; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.backend->trace_starts, 1);
  EXPECT_EQ(rig.sink->epochs[1].sections.get<GpuEpochStats>()->traced_steps, 2);
}

TEST(GpuMonitorTest, AWindowsFirstStepIsTracedFromItsScope) {
  Config c = Rig::window_config(1, 1);
  Rig rig(c);
  rig.step(10, 200, 1.0);
  rig.clock->advance(5 * kMs);  // between the boundary and the scope: not traced
  rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.traced_steps, 1);
  EXPECT_EQ(g.stats.traced_ns, 10 * kMs);
  EXPECT_NEAR(g.stats.gpu_utilization, 1.0, 1e-9);
}

// A trace's start can hold the GPU: on an H200 the first window of some processes ran its first
// step 3x its others, with item() waits 4-6x the later windows', and its advice promised gains the
// steps did not have. A window's first step over twice its others' median is left out of the
// window's figures (its trace kept); one a little slower stays in.
TEST(GpuMonitorTest, AWindowsFirstStepFarSlowerThanItsOthersIsLeftOutOfItsFigures) {
  for (const Nanos first_ms : {40, 15}) {
    Config c = Rig::window_config(2, 4);
    Rig rig(c);
    rig.step(10, 200, 1.0);
    rig.step(10, 200, 1.0);
    rig.step(first_ms, 200, 1.0);  // the window's first step
    for (int i = 0; i < 3; ++i) rig.step(10, 200, 1.0);
    for (int i = 0; i < 3; ++i) rig.step(10, 200, 1.0);
    rig.pilot->end_epoch();
    const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
    if (first_ms == 40) {
      EXPECT_EQ(g.traced_steps, 3);
      EXPECT_EQ(g.traced_steps_left_out, 1);
      EXPECT_EQ(g.stats.traced_ns, 30 * kMs);
      const auto& late = rig.sink->late<GpuStepRecord>();
      ASSERT_GE(late.size(), 3u);
      EXPECT_FALSE(late[2].traced) << "its record says its figures are an untraced step's";
      EXPECT_NE(rig.log.str().find("1 left out"), std::string::npos) << rig.log.str();
    } else {
      EXPECT_EQ(g.traced_steps, 4);
      EXPECT_EQ(g.traced_steps_left_out, 0);
      EXPECT_EQ(g.stats.traced_ns, 45 * kMs);
    }
  }
}

TEST(GpuMonitorTest, NoAnomalyWindowDuringAutotune) {
  Config c = Rig::base_config();
  c.mode = Mode::kAutotune;  // no loader: auto-tune waits out its budget of 1000 steps
  c.autotune.warmup_steps = 1000;
  c.autotune.warmup_seconds = 0;
  c.gpu.trace_anomaly_factor = 3;
  Rig rig(c);
  for (int i = 0; i < 70; ++i) rig.step(10, 200, 1.0);
  rig.step(50, 200, 1.0);
  rig.step(10, 200, 1.0);
  EXPECT_FALSE(rig.pilot->tuning_finished());
  EXPECT_EQ(rig.backend->trace_starts, 0);
}

TEST(GpuMonitorTest, StepsStopWaitingForPmSamplesThatStoppedMidEpoch) {
  Rig rig;
  rig.step(10, 200, 1.0);
  rig.backend->statuses[0] = {"pm_sampling", false, "PM sampling stopped: decode failed"};
  for (int i = 0; i < 40; ++i) {
    auto s = rig.pilot->step(1);
    rig.clock->advance(10 * kMs);
  }
  EXPECT_GE(rig.sink->late<GpuStepRecord>().size(), 30u);
}

// gpu.pm_duty < 1: between bursts no PM sample comes, and the backend says up to when the
// samples are all there; steps there are published at once instead of held to the epoch's end.
TEST(GpuMonitorTest, StepsDoNotWaitForPmSamplesWhileSamplingPausesBetweenBursts) {
  Rig rig;
  rig.step(10, 200, 1.0);
  auto unsampled_steps = [&](bool paused) {
    for (int i = 0; i < 20; ++i) {
      if (paused) rig.backend->queued.pm_final_until = rig.clock->now_ns();
      auto s = rig.pilot->step(1);
      rig.clock->advance(10 * kMs);
    }
    return rig.sink->late<GpuStepRecord>().size();
  };
  const size_t held = unsampled_steps(false);  // sampling runs: the steps wait for its samples
  EXPECT_LE(held, 2u);
  EXPECT_GE(unsampled_steps(true), held + 18);
  rig.pilot->end_epoch();
  const auto* g = rig.sink->epochs[0].sections.get<GpuEpochStats>();
  ASSERT_NE(g, nullptr);
  EXPECT_NEAR(g->stats.sm_efficiency, 1.0, 1e-9);  // from the one sampled step alone
}

TEST(GpuMonitorTest, FirstWindowWaitsForAutotune) {
  Config c = Rig::base_config();
  c.mode = Mode::kAutotune;  // no loader: auto-tune waits out its budget, then has nothing to do
  c.autotune.warmup_steps = 4;
  c.autotune.warmup_seconds = 0;
  c.gpu.trace_first_step = 0;
  c.gpu.trace_steps = 2;
  Rig rig(c);
  for (int i = 0; i < 10; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  EXPECT_TRUE(rig.pilot->tuning_finished());
  EXPECT_EQ(rig.backend->trace_starts, 1);
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->traced_steps, 2);
  for (const auto& r : rig.sink->late<GpuStepRecord>()) {
    if (r.traced) EXPECT_GE(r.step, 4) << "traced during the warm-up";
  }
}

TEST(GpuMonitorTest, SlowStepOpensAnAnomalyWindow) {
  Config c = Rig::base_config();
  c.gpu.trace_anomaly_factor = 3;
  c.gpu.trace_steps = 2;
  Rig rig(c);
  for (int i = 0; i < 70; ++i) rig.step(10, 200, 1.0);
  EXPECT_EQ(rig.backend->trace_starts, 0);
  rig.step(50, 200, 1.0);  // 5x the median ...
  rig.step(50, 200, 1.0);  // ... twice in a row: a window is armed ...
  EXPECT_EQ(rig.backend->trace_starts, 0);
  rig.step(10, 200, 1.0);  // ... and opens when the next step begins
  EXPECT_EQ(rig.backend->trace_starts, 1);
  for (int i = 0; i < 4; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->traced_steps, 2);
  // The log says why it fired.
  EXPECT_NE(rig.log.str().find("anomaly trace window: steps 70-71 did 50.00 and 50.00 ms"),
            std::string::npos)
      << rig.log.str();
}

TEST(GpuMonitorTest, SlowFirstStepsOfEachEpochOpenNoAnomalyWindow) {
  // Issue 15: a stock loader restarts its workers at each epoch: its first steps are slow.
  Config c = Rig::base_config();
  c.gpu.trace_anomaly_factor = 3;
  Rig rig(c);
  for (int epoch = 0; epoch < 6; ++epoch) {
    rig.step(300, 200, 1.0);
    rig.step(200, 200, 1.0);
    for (int i = 0; i < 30; ++i) rig.step(10, 200, 1.0);
    rig.pilot->end_epoch();
  }
  EXPECT_EQ(rig.backend->trace_starts, 0) << rig.log.str();
  const OutlierStats* o = rig.sink->epochs.back().sections.get<OutlierStats>();
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->edge_count, 2);
  EXPECT_EQ(o->period, 0);
}

TEST(GpuMonitorTest, ACheckpointEveryNStepsIsAPeriodicStallNotAnAnomaly) {
  // Issue 17: a slow step every 20 steps, in a phase "checkpoint", blocked (little CPU time).
  Config c = Rig::base_config();
  c.gpu.trace_anomaly_factor = 3;
  Rig rig(c, false);
  auto cpu = std::make_shared<ManualClock>();
  {
    PilotOptions o = rig.options("gpu-test");
    o.cpu_clock = cpu;
    if (auto m = make_gpu_monitor(c.gpu, rig.backend, *o.logger))
      o.collectors.push_back(std::move(m));
    rig.pilot = std::make_unique<Pilot>(c, std::move(o));
  }
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int i = 0; i < 100; ++i) {
      const int64_t step = rig.pilot->steps();
      auto s = rig.pilot->step(1);
      if (step % 20 == 10) {
        auto p = rig.pilot->phase("checkpoint");
        rig.clock->advance(40 * kMs);
        cpu->advance(4 * kMs);
      }
      rig.clock->advance(10 * kMs);
      cpu->advance(9 * kMs);
    }
    rig.pilot->end_epoch();
  }
  EXPECT_EQ(rig.backend->trace_starts, 0) << rig.log.str();
  const EpochSummary& e = rig.sink->epochs.back();
  const OutlierStats* o = e.sections.get<OutlierStats>();
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->period, 20);
  EXPECT_EQ(o->periodic_count, 5);
  // 5 x 40 ms above the median of a 1,200 ms epoch.
  EXPECT_NEAR(o->periodic_share, 200.0 / 1200.0, 0.01);
  EXPECT_EQ(o->phase, "checkpoint");
  EXPECT_NEAR(o->cpu_share, 0.1, 0.05);
  const auto& advice = rig.sink->advice.back();
  auto it = std::find_if(advice.begin(), advice.end(),
                         [](const Advice& a) { return a.id == "periodic_stall"; });
  ASSERT_NE(it, advice.end());
  EXPECT_NE(it->finding.find("every 20 steps"), std::string::npos) << it->finding;
  EXPECT_NE(it->action.find("checkpoint asynchronously"), std::string::npos) << it->action;
  EXPECT_NEAR(it->expected_gain, 200.0 / 1000.0, 0.01);
  EXPECT_NE(rig.log.str().find("every 20 steps"), std::string::npos);
}

// Hands a test the host collectors see (the Pilot is one privately).
struct HostProbe final : Collector {
  std::string name() const override { return "host_probe"; }
  unsigned step_hooks() const override { return 0; }
  void attach(CollectorHost* h) override { host = h; }
  CollectorHost* host = nullptr;
};

TEST(GpuMonitorTest, StepRecordsAreBuiltOnlyWhileSomeoneReadsThem) {
  // A step's GpuStepRecord costs a short-step trainer about a microsecond a step: none is built
  // while no sink or collector would read it; the epoch's figures count every step either way.
  Rig rig(Rig::base_config(), false);
  auto sink = std::make_shared<test::LateSink>();
  rig.sink = sink;
  rig.make(Rig::base_config());
  auto probe = std::make_shared<HostProbe>();
  rig.pilot->add_collector(probe);
  ASSERT_NE(probe->host, nullptr);
  EXPECT_FALSE(probe->host->late_steps_wanted());
  for (int i = 0; i < 5; ++i) rig.step(100, 1, 0.5);  // each step's end collects (100 ms)
  EXPECT_TRUE(sink->late_steps.empty());
  sink->wants = true;
  EXPECT_TRUE(probe->host->late_steps_wanted());
  for (int i = 0; i < 5; ++i) rig.step(100, 1, 0.5);
  rig.pilot->end_epoch();
  const auto late = sink->late<GpuStepRecord>();
  ASSERT_FALSE(late.empty());
  EXPECT_GE(late.front().step, 4);  // from the first collection after the sink wanted them
  EXPECT_EQ(late.back().step, 9);
  ASSERT_EQ(sink->epochs.size(), 1u);
  const GpuEpochStats* g = sink->epochs[0].sections.get<GpuEpochStats>();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->steps, 10);
  EXPECT_NEAR(g->stats.sm_efficiency, 0.5, 1e-9);
}

TEST(GpuMonitorTest, StepsNobodyReadsOneByOneGiveTheEpochTheSameFigures) {
  // With no late record wanted, untraced steps are taken a joined run at a time: the epoch's
  // figures are those of finishing them one by one (NVML's readings included: a run ends at one).
  auto run = [](bool wanted) {
    Config c = Rig::base_config();
    Rig rig(c, false);
    auto sink = std::make_shared<test::LateSink>();
    sink->wants = wanted;
    rig.sink = sink;
    rig.backend->markers = true;  // markers every gpu.marker_interval_ms: steps share them
    rig.make(c);
    size_t resolved = 0;
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (int i = 0; i < 60; ++i) {
        // Part of the second epoch without markers: host spans, a run of its own.
        rig.backend->markers = !(epoch == 1 && i >= 20 && i < 35);
        const Nanos b = rig.clock->now_ns();
        auto s = rig.pilot->step(1);
        rig.clock->advance((7 + i % 5) * kMs);
        const Nanos e = rig.clock->now_ns();
        PmSample p = pm(b, e, 0.2 + 0.01 * (i % 7), 0.9);
        p.tensor_activity = 0.01 * (i % 3);
        p.dram_throughput = 0.3 + 0.02 * (i % 4);
        p.pcie_read_bytes = 1000.0 * (i % 5);
        rig.backend->queued.pm.push_back(p);
        if (i % 9 == 4) {
          UtilSample u{e - 3 * kMs, i % 2 == 0 ? 0.95 : 0.6};
          u.sm_clock_mhz = i % 2 == 0 ? 1980 : 1500;
          u.clock_limited = i % 2 == 0 ? 0 : 1;
          rig.backend->queued.nvml.push_back(u);
        }
        s.end();
        // Each marker resolves 2 ms after its step's end (the GPU behind the host).
        for (; resolved < rig.backend->marker_ids.size(); ++resolved) {
          rig.backend->resolve(rig.backend->marker_ids[resolved], e + 2 * kMs);
        }
      }
      rig.pilot->end_epoch();
    }
    std::vector<GpuEpochStats> out;
    for (const auto& e : sink->epochs) out.push_back(*e.sections.get<GpuEpochStats>());
    return out;
  };
  const auto each = run(true);
  const auto joined = run(false);
  ASSERT_EQ(each.size(), 2u);
  ASSERT_EQ(joined.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    SCOPED_TRACE(e);
    EXPECT_EQ(each[e].steps_joined, 0);
    EXPECT_GT(joined[e].steps_joined, joined[e].steps / 2);
    EXPECT_EQ(joined[e].steps, each[e].steps);
    EXPECT_EQ(joined[e].earlier_steps, each[e].earlier_steps);
    EXPECT_EQ(joined[e].gpu_timed_steps, each[e].gpu_timed_steps);
    EXPECT_EQ(joined[e].carried_steps, each[e].carried_steps);
    EXPECT_GT(joined[e].gpu_timed_steps, 0);
    const GpuStats& a = each[e].stats;
    const GpuStats& b = joined[e].stats;
    EXPECT_EQ(b.wall_ns, a.wall_ns);
    EXPECT_EQ(b.pm_covered_ns, a.pm_covered_ns);
    EXPECT_NEAR(b.sm_efficiency, a.sm_efficiency, 1e-9);
    EXPECT_NEAR(b.counter_utilization, a.counter_utilization, 1e-9);
    EXPECT_NEAR(b.tensor_activity, a.tensor_activity, 1e-9);
    EXPECT_NEAR(b.dram_throughput, a.dram_throughput, 1e-9);
    EXPECT_NEAR(b.pcie_read_bytes, a.pcie_read_bytes, 1e-6);
    EXPECT_TRUE(measured(a.nvml_utilization));
    EXPECT_NEAR(b.nvml_utilization, a.nvml_utilization, 1e-9);
    EXPECT_NEAR(b.sm_clock_mhz, a.sm_clock_mhz, 1e-6);
    EXPECT_NEAR(b.clock_limited, a.clock_limited, 1e-9);
  }
  EXPECT_LT(joined[1].gpu_timed_steps, joined[1].steps);  // the run without markers
}

TEST(GpuMonitorTest, TheStallTrackerReadsStepRecordsOnlyOnceAPeriodIsKnown) {
  Config c = Rig::base_config();
  Rig rig(c, false);
  auto sink = std::make_shared<test::LateSink>();
  rig.sink = sink;
  rig.make(c);
  auto probe = std::make_shared<HostProbe>();
  rig.pilot->add_collector(probe);
  ASSERT_NE(probe->host, nullptr);
  rig.backend->markers = true;
  size_t resolved = 0;
  bool wanted_before_period = true;
  for (int i = 0; i < 200; ++i) {
    const int64_t step = rig.pilot->steps();
    if (step == 25) wanted_before_period = probe->host->late_steps_wanted();
    auto s = rig.pilot->step(1);
    if (step % 20 == 10) rig.clock->advance(40 * kMs);
    rig.clock->advance(10 * kMs);
    const Nanos e = rig.clock->now_ns();
    rig.backend->queued.pm.push_back(pm(e - 10 * kMs, e, 0.5));
    s.end();
    for (; resolved < rig.backend->marker_ids.size(); ++resolved) {
      rig.backend->resolve(rig.backend->marker_ids[resolved], e + kMs);
    }
  }
  rig.pilot->end_epoch();
  EXPECT_FALSE(wanted_before_period);
  const OutlierStats* o = sink->epochs.back().sections.get<OutlierStats>();
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->period, 20);
  EXPECT_TRUE(probe->host->late_steps_wanted());  // the stall tracker wants the GPU spans now
  EXPECT_GT(o->gpu_timed, 0) << "the stalls after the period was found have their GPU spans";
  EXPECT_GE(o->gpu_median_ns, 0);
}

// A window of `steps` from step 5 (every `every_epochs` epochs) under a 1% budget.
Config budget_window_config(int64_t steps, int64_t every_epochs = 0) {
  Config c = Rig::window_config(5, steps, every_epochs);
  c.cost.budget = 0.01;
  return c;
}

TEST(GpuMonitorTest, BudgetDefersWindowsThatWouldExceedIt) {
  // Issue 15: a window's start costs 100 ms here; steps take 10 ms, epochs 20 steps (0.2 s).
  Config c = budget_window_config(2, 1);
  Rig rig(c, false);
  rig.backend->on_start_trace = [&] { rig.clock->advance(100 * kMs); };
  rig.make(c);
  auto epochs = [&](int n) {
    for (int epoch = 0; epoch < n; ++epoch) {
      for (int i = 0; i < 20; ++i) rig.step(10, 200, 1.0);
      rig.pilot->end_epoch();
    }
  };
  // The first window's estimate: 50 ms while no median step exists (its first ask), then 2.5 ms
  // for its start and stop, 25 ms for the steps its release slows and 0.6 of each of its 2 steps'
  // 10 ms: 39.5 ms, 3.95 s of run.
  epochs(3);
  EXPECT_EQ(rig.backend->trace_starts, 0) << "a young run has no room for a window";
  const CostStats* first = rig.sink->epochs[0].sections.get<CostStats>();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->deferred, 1);
  EXPECT_LT(first->fraction, 0.01);
  std::string log = rig.log.str();
  EXPECT_NE(log.find("cost budget: the first trace window of 2 steps deferred (about 50.0 ms)"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("cost budget:"), log.rfind("cost budget:")) << "one log line";
  epochs(27);  // 6 s
  ASSERT_EQ(rig.backend->trace_starts, 1) << "once 1% of the run has room for 39.5 ms";
  int opened = -1;
  for (size_t e = 0; e < rig.sink->epochs.size(); ++e) {
    if (rig.sink->epochs[e].sections.get<CostStats>()->step_calls_ns >= 100 * kMs) {
      opened = static_cast<int>(e);
      break;
    }
  }
  EXPECT_GE(opened, 19) << "at about 3.95 s";
  EXPECT_LE(opened, 20);
  // Its start's 100 ms left the budget no room for its second step: it ended after one. The
  // repeat's estimate is what the first cost (100 ms, its start's): it waits for 1% of the run
  // to hold both (20 s), then runs.
  const CostStats* next =
      rig.sink->epochs[static_cast<size_t>(opened) + 1].sections.get<CostStats>();
  EXPECT_EQ(next->step_calls_ns, 0);
  // The window's prediction beside its cost, in the epoch its cost completed.
  int64_t predicted = 0;
  Nanos estimate = 0, cost = 0;
  for (const auto& s : rig.sink->epochs) {
    const auto* g = s.sections.get<GpuEpochStats>();
    predicted += g->windows_predicted;
    estimate += g->window_estimate_ns;
    cost += g->window_cost_ns;
  }
  EXPECT_EQ(predicted, 1);
  EXPECT_EQ(estimate, 79 * kMs / 2);
  EXPECT_GE(cost, 100 * kMs) << "its start's 100 ms";
  epochs(110);
  EXPECT_EQ(rig.backend->trace_starts, 2);
  EXPECT_LE(rig.sink->epochs.back().sections.get<CostStats>()->horizon_fraction, 0.0105);
}

// A 3-step window at step 10 of 10 ms steps whose release runs for `release_steps` steps of
// 25 ms (15 ms above the median); `steps` in all, one epoch: its GPU figures.
GpuEpochStats slowed_release_epoch(int release_steps, int steps) {
  Config c = Rig::window_config(10, 3);
  Rig rig(c, false);
  rig.backend->slow_release = true;
  rig.make(c);
  int slowed = 0;
  for (int i = 0; i < steps; ++i) {
    const bool releasing = rig.backend->releasing;
    if (releasing) ++slowed;
    rig.step(releasing ? 25 : 10, 200, 1.0);
    if (slowed == release_steps) rig.backend->finish_release();
  }
  rig.pilot->end_epoch();
  EXPECT_EQ(slowed, release_steps);
  const auto* g = rig.sink->epochs[0].sections.get<GpuEpochStats>();
  return g != nullptr ? *g : GpuEpochStats{};
}

// The steps while a window's release runs off the training thread are its cost too: the release
// contends with a host-bound trainer.
TEST(GpuMonitorTest, AWindowsCostHoldsTheStepsItsReleaseSlowed) {
  const GpuEpochStats g = slowed_release_epoch(10, 40);
  EXPECT_EQ(g.traced_steps, 3);
  EXPECT_EQ(g.windows_predicted, 1);
  EXPECT_GE(g.window_cost_ns, 10 * 15 * kMs * 95 / 100);
  EXPECT_LT(g.window_cost_ns, 12 * 15 * kMs + 50 * kMs);
}

// A long release (80 steps at 25 ms where they took 10): its slowed steps enter the planner's
// recent median, which would reach them halfway and charge the rest nothing; they are measured
// against the median when the window began.
TEST(GpuMonitorTest, ALongReleasesStepsAreMeasuredAgainstTheMedianBeforeIt) {
  const GpuEpochStats g = slowed_release_epoch(80, 120);
  EXPECT_EQ(g.windows_predicted, 1);
  EXPECT_GE(g.window_cost_ns, 80 * 15 * kMs * 95 / 100);
}

// A noisy trainer (10, 13, 10, 7 ms steps) whose release slows nothing: its steps above the
// median and below it cancel; counting only those above would charge the window 3 ms every four
// steps of the release.
TEST(GpuMonitorTest, AWindowsCostIsNotTheNoiseOfItsReleasesSteps) {
  Config c = Rig::window_config(10, 3);
  Rig rig(c, false);
  rig.backend->slow_release = true;
  rig.make(c);
  const Nanos pattern[] = {10, 13, 10, 7};
  int releasing = 0;
  for (int i = 0; i < 60; ++i) {
    if (rig.backend->releasing) ++releasing;
    rig.step(pattern[i % 4], 200, 1.0);
    if (i == 48) rig.backend->finish_release();
  }
  rig.pilot->end_epoch();
  const auto* g = rig.sink->epochs[0].sections.get<GpuEpochStats>();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->traced_steps, 3);
  ASSERT_GE(releasing, 24) << "a release of many steps";
  EXPECT_EQ(g->windows_predicted, 1);
  EXPECT_LT(g->window_cost_ns, 7 * kMs) << "the positive part alone: about 3 ms a 4 steps";
}

// The steps a release slowed cost the same whatever the window's length: the next window's
// estimate keeps them fixed and scales only its traced steps' slowdown. The first window (3 of
// 10 steps, the budget's room) is traced at no slowdown and its release slows 4 steps by 15 ms:
// the repeat is predicted at that 60 ms for more steps (scaled, 3 steps would be all the 60 ms
// had room for, and 6 would be predicted at 120 ms).
TEST(GpuMonitorTest, AReleasesCostIsFixedInTheNextWindowsEstimate) {
  Config c = budget_window_config(10, 1);
  Rig rig(c, false);
  rig.backend->slow_release = true;
  rig.make(c);
  struct Window {
    int64_t steps = 0;
    Nanos estimate = 0, cost = 0;
  };
  std::vector<Window> windows;
  for (int epoch = 0; epoch < 60 && windows.size() < 2; ++epoch) {
    int slowed = 0;
    for (int i = 0; i < 100; ++i) {
      const bool releasing = rig.backend->releasing;
      rig.step(releasing ? 25 : 10, 200, 1.0);
      if (releasing && ++slowed == 4) rig.backend->finish_release();
    }
    rig.pilot->end_epoch();
    const auto* g = rig.sink->epochs.back().sections.get<GpuEpochStats>();
    if (g->traced_steps > 0) windows.push_back({g->traced_steps, 0, 0});
    if (g->windows_predicted > 0 && !windows.empty()) {
      windows.back().estimate = g->window_estimate_ns;
      windows.back().cost = g->window_cost_ns;
    }
  }
  ASSERT_EQ(windows.size(), 2u);
  EXPECT_EQ(windows[0].steps, GpuWindowPlanner::kMinWindowSteps) << "what the budget had room for";
  EXPECT_GE(windows[0].cost, 60 * kMs);
  EXPECT_GT(windows[1].steps, windows[0].steps);
  EXPECT_EQ(windows[1].estimate, windows[0].cost);
}

TEST(GpuMonitorTest, AWindowTheBudgetHasNoRoomForWholeTracesFewerSteps) {
  // 10 ms steps: 10 steps are predicted at 2.5 + 25 (the release's steps) + 10 x 6 = 87.5 ms
  // (8.75 s of run at 1%), 3 at 45.5 ms (4.55 s): the first window opens earlier, shorter.
  Config c = budget_window_config(10);
  Rig rig(c, false);
  rig.make(c);
  int64_t traced = 0;
  size_t first = 0;
  for (int epoch = 0; epoch < 50 && traced == 0; ++epoch) {
    for (int i = 0; i < 20; ++i) rig.step(10, 200, 1.0);
    rig.pilot->end_epoch();
    traced = rig.sink->epochs.back().sections.get<GpuEpochStats>()->traced_steps;
    first = rig.sink->epochs.size() - 1;
  }
  EXPECT_EQ(rig.backend->trace_starts, 1);
  EXPECT_GE(traced, GpuWindowPlanner::kMinWindowSteps);
  EXPECT_LT(traced, 10) << "a shorter window";
  EXPECT_LT(first, 35u) << "before 10 steps had room (about 8.75 s, epoch 43)";
  EXPECT_NE(rig.log.str().find("trace window of 10 steps (or a shorter one, from 3) deferred"),
            std::string::npos)
      << rig.log.str();
}

TEST(GpuMonitorTest, AWindowCostlierThanPredictedEndsEarly) {
  // 10 ms steps until the first window opens; its traced steps then take 400 ms (a launch-heavy
  // step under CUPTI): the budget has no room for a second such step, so the window of 8 ends.
  Config c = budget_window_config(8);
  Rig rig(c, false);
  rig.make(c);
  for (int i = 0; i < 5000 && rig.backend->trace_starts == 0; ++i) {
    rig.step(10, 200, 1.0);
    if (i % 20 == 19) rig.pilot->end_epoch();
  }
  ASSERT_EQ(rig.backend->trace_starts, 1);
  for (int i = 0; i < 12; ++i) rig.step(rig.backend->tracing ? 400 : 10, 200, 1.0);
  rig.pilot->end_epoch();
  for (int i = 0; i < 20; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  int64_t traced = 0, cut = 0;
  for (const auto& s : rig.sink->epochs) {
    traced += s.sections.get<GpuEpochStats>()->traced_steps;
    cut += s.sections.get<GpuEpochStats>()->windows_cut;
  }
  EXPECT_EQ(cut, 1);
  EXPECT_GE(traced, 1);
  EXPECT_LE(traced, 2) << "of 8";
}

TEST(GpuMonitorTest, NvtxRangesAreBalanced) {
  Rig rig;
  {
    auto s = rig.pilot->step(1);
    { auto p = rig.pilot->phase("forward"); }
    auto left_open = rig.pilot->phase("backward");
    rig.clock->advance(kMs);
    s.end();  // the phase scope outlives the step: its range closes with the step
  }
  EXPECT_EQ(rig.backend->depth, 0);
  ASSERT_GE(rig.backend->ranges.size(), 4u);
  EXPECT_EQ(rig.backend->ranges[0], "+step 0");
  EXPECT_EQ(rig.backend->ranges[1], "+forward");
}

TEST(GpuMonitorTest, NoDeviceMeansNoMonitorAndOneLogLine) {
  Rig rig(Rig::base_config(), false);
  rig.backend->info.sm_count = 0;
  rig.backend->statuses = {{"pm_sampling", false, "no GPU driver (libcuda.so.1 not found)"}};
  rig.make(Rig::base_config());
  EXPECT_EQ(rig.pilot->collector<GpuMonitor>(), nullptr);
  EXPECT_NE(rig.log.str().find("GPU collectors off: no GPU driver"), std::string::npos);
  rig.step(10, 1, 0.0);
  rig.pilot->end_epoch();
  EXPECT_FALSE(rig.sink->epochs[0].sections.get<GpuEpochStats>());
}

TEST(GpuDeviceChoiceTest, SetThenLocalRankThenCurrentThenZero) {
  auto choose = [](int configured, const char* local_rank, int visible, int current) {
    const GpuDeviceChoice c = choose_gpu_device(configured, local_rank, visible, current);
    return std::to_string(c.index) + " " + c.source;
  };
  EXPECT_EQ(choose(3, "1", 8, 2), "3 gpu.device");
  EXPECT_EQ(choose(-1, "1", 8, 0), "1 LOCAL_RANK");  // torchrun, one GPU per local rank
  EXPECT_EQ(choose(-1, "1", -1, -1), "0 default");   // no driver to ask: not trusted
  // Each rank sees only its own GPU (CUDA_VISIBLE_DEVICES per rank): LOCAL_RANK is no index.
  EXPECT_EQ(choose(-1, "3", 1, 0), "0 current device");
  EXPECT_EQ(choose(-1, "3", 1, -1), "0 default");
  EXPECT_EQ(choose(-1, nullptr, 4, 2), "2 current device");
  EXPECT_EQ(choose(-1, "", 4, -1), "0 default");
  EXPECT_EQ(choose(-1, "x1", 4, 5), "0 default");  // neither names a visible device
  EXPECT_EQ(choose(-1, "-1", 4, -1), "0 default");
}

namespace {
int probe_visible = -1, probe_current = -1;
void fake_probe(int* visible, int* current) {
  *visible = probe_visible;
  *current = probe_current;
}
using test::ScopedEnv;
}  // namespace

TEST(GpuDeviceChoiceTest, EachRanksPilotObservesItsOwnGpu) {
  const GpuDeviceProbe before = gpu_device_probe();
  register_gpu_device_probe(&fake_probe);
  probe_visible = 2;
  probe_current = 0;
  {
    const ScopedEnv local_rank("LOCAL_RANK", "1");
    Rig rig;  // auto
    EXPECT_EQ(rig.pilot->config().gpu.device, 1);
    EXPECT_NE(rig.log.str().find("observing GPU 1 of 2 (LOCAL_RANK"), std::string::npos)
        << rig.log.str();
    EXPECT_NE(rig.log.str().find("has GPU 0 current, but LOCAL_RANK chose GPU 1"),
              std::string::npos)
        << rig.log.str();
    Config c = Rig::base_config();
    c.gpu.device = 0;  // set: kept
    Rig set(c);
    EXPECT_EQ(set.pilot->config().gpu.device, 0);
  }
  {
    const ScopedEnv local_rank("LOCAL_RANK", nullptr);
    probe_current = 1;  // the trainer chose its GPU before making the Pilot
    Rig rig;
    EXPECT_EQ(rig.pilot->config().gpu.device, 1);
    EXPECT_EQ(rig.log.str().find("current, but"), std::string::npos) << rig.log.str();
    probe_visible = 1;
    probe_current = -1;
    Rig one;  // one GPU, nothing to say
    EXPECT_EQ(one.pilot->config().gpu.device, 0);
    EXPECT_EQ(one.log.str().find("observing GPU"), std::string::npos) << one.log.str();
  }
  register_gpu_device_probe(before);
}

TEST(GpuMonitorTest, WithoutActivityTheCountersStillWork) {
  Config c = Rig::base_config();
  c.gpu.trace_first_step = 1;
  Rig rig(c, false);
  rig.backend->statuses[1] = {"activity", false, "another CUPTI client is attached"};
  rig.make(c);
  ASSERT_NE(rig.pilot->collector<GpuMonitor>(), nullptr);
  EXPECT_NE(rig.log.str().find("another CUPTI client"), std::string::npos);
  for (int i = 0; i < 5; ++i) rig.step(10, 1, 0.02);
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.backend->trace_starts, 0);
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.traced_steps, 0);
  EXPECT_NEAR(g.stats.sm_efficiency, 0.02, 1e-9);
  EXPECT_FALSE(measured(g.stats.gpu_utilization));
}

TEST(GpuMonitorTest, ThrowingObserverIsRemovedAndTrainingGoesOn) {
  struct Bad : Collector {
    std::string name() const override { return "bad"; }
    void on_step_end(StepRecord&) override { throw std::runtime_error("boom"); }
    void attach(CollectorHost* host) override { forgotten = host == nullptr; }
    bool forgotten = false;
  } bad;
  Rig rig;
  rig.pilot->add_collector(&bad);
  rig.step(10, 1, 0.5);
  rig.step(10, 1, 0.5);
  EXPECT_NE(rig.log.str().find("collector 'bad' failed in on_step_end and is removed: boom"),
            std::string::npos);
  EXPECT_EQ(rig.sink->steps.size(), 2u);
  EXPECT_TRUE(bad.forgotten) << "a dropped collector must not reach back into the Pilot later";
}

}  // namespace
}  // namespace torchpilot
