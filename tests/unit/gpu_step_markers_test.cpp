// The GPU time of a step from step markers: the GPU monitor over a fake backend whose GPU runs
// behind the host (tests/fakes/).
#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fakes/gpu_monitor_rig.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/cost/cost.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"
#include "torchpilot/runtime/gpu/gpu_step_stats.h"

namespace torchpilot {
namespace {

using test::kernel;
using test::pm;
using test::Rig;

constexpr Nanos kMs = 1000000;

// --- GPU time of a step (step markers) ---------------------------------------------------------

// A trainer that queues its steps ahead: the host spends 1 ms per step, the GPU 10 ms, and
// reaches the boundary after step j - 1 at 10 j ms (boundary 0: the first step's start).
struct AsyncRig : Rig {
  explicit AsyncRig(Config c) : Rig(c, false) {
    backend->markers = true;
    // A marker at every boundary (marker ids below count on it); runs of steps sharing markers:
    // tests further down.
    c.gpu.marker_interval_ms = 0;
    make(std::move(c));
  }
  void host_steps(int n) {
    for (int i = 0; i < n; ++i) {
      auto s = pilot->step(1);
      clock->advance(kMs);
    }
  }
  static Nanos boundary(int64_t j) { return 10 * kMs * j; }
  // A detailed window over steps 1-3.
  static Config window_1_to_3() {
    Config c = Rig::window_config(1, 3);
    return c;
  }
  // The GPU runs steps [from, to): step k has k + 1 kernels and SM efficiency 0.05 (k + 1).
  void gpu_runs(int64_t from, int64_t to) {
    for (int64_t k = from; k < to; ++k) {
      const Nanos b = boundary(k);
      for (int64_t i = 0; i <= k; ++i) {
        backend->queued.kernels.push_back(
            kernel(b + kMs + i * kMs / 2, b + kMs + i * kMs / 2 + 100, 200, "step_kernel"));
      }
      backend->queued.pm.push_back(pm(b, boundary(k + 1), 0.05 * static_cast<double>(k + 1)));
      // Marker ids: the first step's start, then every step's end.
      backend->resolve(backend->marker_ids.at(static_cast<size_t>(k + 1)), boundary(k + 1));
      if (k == 0) backend->resolve(backend->marker_ids.at(0), boundary(0));
    }
  }
  // The GPU runs steps 8 and 9, the epoch ends: the step records published.
  std::vector<GpuStepRecord> end_after_ten_steps() {
    gpu_runs(8, 10);
    pilot->end_epoch();
    return sink->late<GpuStepRecord>();
  }
};

TEST(GpuMonitorTest, KernelsAndSamplesThatRanAfterTheHostSpanLandOnTheirStep) {
  AsyncRig rig(AsyncRig::window_1_to_3());
  rig.host_steps(8);  // the host is at 8 ms; the GPU has not reached step 0's end
  EXPECT_EQ(rig.backend->marker_ids.size(), 9u) << "one marker per boundary";
  EXPECT_EQ(rig.backend->trace_starts, 1);
  EXPECT_EQ(rig.backend->trace_stops, 0) << "the window's kernels have not run yet";
  EXPECT_TRUE(rig.sink->late<GpuStepRecord>().empty()) << "no step's GPU span is known";

  rig.gpu_runs(0, 8);  // the GPU catches up
  rig.host_steps(1);   // step 8: its end drains the markers and stops the trace
  EXPECT_EQ(rig.backend->trace_stops, 1);
  ASSERT_EQ(rig.backend->resolved_at_stop.size(), 1u);
  EXPECT_GE(rig.backend->resolved_at_stop[0], rig.backend->marker_ids[4])
      << "stopped before the GPU reached the window's last step's end";
  rig.host_steps(1);  // step 9: the tail's end, the trace is released
  EXPECT_EQ(rig.backend->releases, 1);
  const auto steps = rig.end_after_ten_steps();
  ASSERT_EQ(steps.size(), 10u);
  for (const GpuStepRecord& r : steps) {
    SCOPED_TRACE("step " + std::to_string(r.step));
    EXPECT_TRUE(r.gpu_timed);
    EXPECT_EQ(r.gpu_begin_ns, AsyncRig::boundary(r.step));
    EXPECT_EQ(r.gpu_end_ns, AsyncRig::boundary(r.step + 1));
    EXPECT_EQ(r.stats.wall_ns, 10 * kMs);
    EXPECT_NEAR(r.stats.sm_efficiency, 0.05 * static_cast<double>(r.step + 1), 1e-9);
    EXPECT_EQ(r.traced, r.step >= 1 && r.step <= 3);
    if (r.traced) EXPECT_EQ(r.stats.kernels, r.step + 1);
  }
  EXPECT_EQ(steps[9].gpu_lag_ns, AsyncRig::boundary(10) - 10 * kMs);
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.gpu_timed_steps, 10);
  EXPECT_EQ(g.marker_timeouts, 0);
  EXPECT_EQ(g.stats.kernels, 2 + 3 + 4);
  EXPECT_EQ(g.traced_steps, 3);
}

// A trainer whose GPU is the slower side: its ordinary steps' host time (1 ms: the host queues
// ahead) is not their length; their GPU spans (10 ms) are, and the epoch keeps their median.
TEST(GpuMonitorTest, OrdinaryStepsKeepTheirGpuSpansMedian) {
  AsyncRig rig(AsyncRig::window_1_to_3());
  rig.host_steps(8);
  rig.gpu_runs(0, 8);
  rig.host_steps(12);  // the window's tail, its release, then ordinary steps again
  rig.gpu_runs(8, 20);
  rig.pilot->end_epoch();
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.traced_steps, 3);
  ASSERT_GE(g.ordinary_steps, 8) << "step 0 and those after the release";
  EXPECT_LE(g.ordinary_steps, 20 - 3);
  EXPECT_EQ(g.ordinary_gpu_steps, g.ordinary_steps) << "every one's markers resolved";
  EXPECT_NEAR(static_cast<double>(g.ordinary_step_p50_ns), 1e6, 0.05 * 1e6);  // bucket edges
  EXPECT_NEAR(static_cast<double>(g.ordinary_gpu_step_p50_ns), 10e6, 0.02 * 10e6);
  // Steps with markers of their own: their own host step beside the GPU's.
  EXPECT_NEAR(static_cast<double>(g.ordinary_gpu_host_ns), 1e6 * g.ordinary_gpu_steps,
              0.02 * 1e6 * g.ordinary_gpu_steps);
}

TEST(GpuMonitorTest, PhasesOfTracedStepsGetGpuSpansFromTheirMarkers) {
  Config c = AsyncRig::window_1_to_3();
  c.gpu.trace_steps = 2;  // steps 1 and 2
  AsyncRig rig(c);
  // The host runs each step in 1 ms; the GPU runs step k in [10k, 10k + 10) ms: forward 3 ms,
  // backward 5 ms (in step 2 a nested "clip" takes its last 2), optimizer 1 ms, then 1 ms outside
  // any phase. Each marker recorded is given the GPU time it will resolve at.
  std::vector<std::pair<uint64_t, Nanos>> plan;
  size_t seen = 0;
  auto mark = [&](Nanos gpu_ms) {
    for (; seen < rig.backend->marker_ids.size(); ++seen) {
      plan.emplace_back(rig.backend->marker_ids[seen], gpu_ms * kMs);
    }
  };
  std::vector<size_t> markers_per_step;
  for (int64_t k = 0; k < 6; ++k) {
    const size_t before = rig.backend->marker_ids.size();
    const Nanos g = 10 * k;
    {
      auto s = rig.pilot->step(1);
      mark(g);  // an epoch's first step records its own start
      {
        auto f = rig.pilot->phase("forward");
        mark(g);
        rig.clock->advance(kMs / 4);
      }
      mark(g + 3);
      {
        auto b = rig.pilot->phase("backward");
        mark(g + 3);
        rig.clock->advance(kMs / 4);
        if (k == 2) {
          auto clip = rig.pilot->phase("clip");
          mark(g + 6);
          rig.clock->advance(kMs / 8);
        }
        mark(g + 8);
      }
      mark(g + 8);
      {
        auto o = rig.pilot->phase("optimizer");
        mark(g + 8);
        rig.clock->advance(kMs / 4);
      }
      mark(g + 9);
      rig.clock->advance(kMs / 8);
    }
    mark(g + 10);
    markers_per_step.push_back(rig.backend->marker_ids.size() - before);
    // Kernels: forward busy 2 of its 3 ms, backward all 5, the optimizer none.
    if (k == 1 || k == 2) {
      rig.backend->queued.kernels.push_back(kernel(g * kMs, (g + 2) * kMs, 200, "fwd"));
      rig.backend->queued.kernels.push_back(kernel((g + 3) * kMs, (g + 8) * kMs, 200, "bwd"));
    }
    rig.backend->queued.pm.push_back(pm(g * kMs, (g + 10) * kMs, 0.5));
  }
  // Phase markers only in the traced steps: two per phase there, none elsewhere.
  EXPECT_EQ(markers_per_step, (std::vector<size_t>{2, 7, 9, 1, 1, 1}));
  for (const auto& [id, t] : plan) rig.backend->resolve(id, t);
  rig.pilot->end_epoch();

  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.traced_steps, 2);
  EXPECT_EQ(g.phases_gpu.steps, 2);
  EXPECT_EQ(g.phases_gpu.step_gpu_ns, 20 * kMs);
  EXPECT_EQ(g.phases_gpu.covered_ns, 18 * kMs) << "the nested clip counts once";
  ASSERT_EQ(g.phases_gpu.phases.size(), 4u);
  const auto phase = [&](const std::string& name) {
    for (const GpuPhaseStats& p : g.phases_gpu.phases) {
      if (p.name == name) return p;
    }
    ADD_FAILURE() << "no phase " << name;
    return GpuPhaseStats{};
  };
  EXPECT_EQ(g.phases_gpu.phases[0].name, "forward") << "in order of first appearance";
  EXPECT_EQ(phase("forward").count, 2);
  EXPECT_EQ(phase("forward").gpu_ns, 6 * kMs);
  EXPECT_EQ(phase("forward").busy_ns, 4 * kMs);
  EXPECT_EQ(phase("forward").host_ns, kMs / 2) << "the host ran ahead: 0.25 ms a step";
  EXPECT_EQ(phase("backward").gpu_ns, 10 * kMs);
  EXPECT_EQ(phase("backward").busy_ns, 10 * kMs);
  EXPECT_EQ(phase("optimizer").gpu_ns, 2 * kMs);
  EXPECT_EQ(phase("optimizer").busy_ns, 0);
  EXPECT_EQ(phase("clip").count, 1);
  EXPECT_EQ(phase("clip").gpu_ns, 2 * kMs);

  // The section's JSON and the log say the same.
  EXPECT_EQ(nlohmann::json::parse(section_json(g))["device_index"], 0);  // the fake's
  EXPECT_NE(rig.log.str().find("  GPU 0 Fake GPU: utilization"), std::string::npos);
  const auto j = nlohmann::json::parse(section_json(g))["phases_gpu"];
  EXPECT_EQ(j["steps"], 2);
  EXPECT_DOUBLE_EQ(j["step_gpu_ms"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(j["outside_phases_ms"].get<double>(), 1.0);
  EXPECT_EQ(j["phases"][1]["name"], "backward");
  EXPECT_DOUBLE_EQ(j["phases"][1]["gpu_ms_per_step"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(j["phases"][0]["kernel_busy"].get<double>(), 2.0 / 3);
  EXPECT_NE(rig.log.str().find("GPU time by phase (2 traced steps, 10 ms per step): forward 3 ms "
                               "(30.0%, kernels busy 66.7%, host 0.25 ms)"),
            std::string::npos)
      << rig.log.str();
}

TEST(GpuMonitorTest, AStepWithAPhaseMarkerMissingIsLeftOutOfThePhaseFigures) {
  Config c = AsyncRig::window_1_to_3();  // steps 1-3 traced
  AsyncRig rig(c);
  rig.host_steps(1);
  // Step 1: backward's end marker is recorded but never resolves (a driver error drops it).
  // Step 2: the backend keeps its last events for step markers: backward's begin is refused.
  // Step 3: every marker resolves.
  std::vector<uint64_t> unresolved;
  for (int k = 1; k <= 3; ++k) {
    auto s = rig.pilot->step(1);
    { auto f = rig.pilot->phase("forward"); }
    rig.backend->refuse_optional = k == 2;
    { auto b = rig.pilot->phase("backward"); }
    rig.backend->refuse_optional = false;
    if (k == 1) unresolved.push_back(rig.backend->marker_ids.back());
  }
  rig.host_steps(3);
  // Step markers are never refused: only the optional ones were.
  EXPECT_EQ(rig.backend->marker_ids.size(), 2u + 5u + 3u + 5u + 3u);
  for (size_t i = 0; i < rig.backend->marker_ids.size(); ++i) {
    const uint64_t id = rig.backend->marker_ids[i];
    if (id != unresolved[0]) rig.backend->resolve(id, static_cast<Nanos>(i) * kMs);
  }
  rig.pilot->end_epoch();
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.traced_steps, 3);
  EXPECT_EQ(g.phases_gpu.steps, 1) << "only step 3 has every phase's span";
  EXPECT_EQ(g.phases_gpu.incomplete_steps, 2);
  ASSERT_EQ(g.phases_gpu.phases.size(), 2u);
  EXPECT_EQ(g.phases_gpu.phases[0].count, 1);
  EXPECT_EQ(g.phases_gpu.phases[1].count, 1);
  EXPECT_NE(rig.log.str().find("2 traced steps left out (a phase marker missing)"),
            std::string::npos)
      << rig.log.str();
}

TEST(GpuMonitorTest, NestedPhasesOfOneNamePairAndTooManyLeaveTheStepOut) {
  Config c = AsyncRig::window_1_to_3();
  c.gpu.trace_steps = 2;  // steps 1-2
  AsyncRig rig(c);
  rig.host_steps(1);
  {
    auto s = rig.pilot->step(1);  // step 1: "block" inside "block"
    const size_t before = rig.backend->marker_ids.size();
    auto outer = rig.pilot->phase("block");
    rig.backend->refuse_optional = true;  // the inner begin is refused ...
    { auto inner = rig.pilot->phase("block"); }
    rig.backend->refuse_optional = false;
    EXPECT_EQ(rig.backend->marker_ids.size(), before + 1) << "... and its end is not the outer's";
    outer.end();
    EXPECT_EQ(rig.backend->marker_ids.size(), before + 2);
  }
  {
    auto s = rig.pilot->step(1);  // step 2: more phases than markers are kept for
    for (int i = 0; i < 70; ++i) auto p = rig.pilot->phase("micro");
  }
  rig.host_steps(3);
  // Step 1: outer begin, outer end (the inner got neither), step end. Step 2: 64 phases' pairs.
  EXPECT_EQ(rig.backend->marker_ids.size(), 2u + 3u + (128u + 1u) + 3u);
  for (size_t i = 0; i < rig.backend->marker_ids.size(); ++i) {
    rig.backend->resolve(rig.backend->marker_ids[i], static_cast<Nanos>(i) * kMs);
  }
  rig.pilot->end_epoch();
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.phases_gpu.steps, 0);
  EXPECT_EQ(g.phases_gpu.incomplete_steps, 2);
  EXPECT_TRUE(g.phases_gpu.phases.empty());
}

TEST(GpuMonitorTest, KernelsDeliveredOutOfOrderLandOnTheirSteps) {
  // CUPTI hands records over buffer by buffer and stream by stream: a drain may bring kernels that
  // started before ones already held. The monitor keeps its kernels in start order (its per-step
  // index relies on it); none may be lost or counted twice.
  AsyncRig rig(AsyncRig::window_1_to_3());
  rig.host_steps(8);
  rig.gpu_runs(0, 8);
  std::vector<KernelRecord> later, earlier;
  for (KernelRecord& k : rig.backend->queued.kernels) {
    (k.begin >= AsyncRig::boundary(2) ? later : earlier).push_back(std::move(k));
  }
  std::reverse(later.begin(), later.end());
  std::reverse(earlier.begin(), earlier.end());
  rig.backend->queued.kernels = later;  // steps 2-7 first, last to first
  rig.host_steps(1);
  rig.backend->queued.kernels = earlier;  // then steps 0-1
  rig.host_steps(1);
  const auto steps = rig.end_after_ten_steps();
  ASSERT_EQ(steps.size(), 10u);
  for (const GpuStepRecord& r : steps) {
    SCOPED_TRACE("step " + std::to_string(r.step));
    EXPECT_EQ(r.traced, r.step >= 1 && r.step <= 3);
    if (!r.traced) continue;
    EXPECT_EQ(r.stats.kernels, r.step + 1);
    // Each kernel runs 100 ns: the step's busy share is its kernels' time, once each.
    EXPECT_NEAR(r.stats.gpu_utilization, static_cast<double>((r.step + 1) * 100) / (10 * kMs),
                1e-12);
  }
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->stats.kernels, 2 + 3 + 4);
}

TEST(GpuMonitorTest, EpochEndWaitsForTheGpuToReachTheLastBoundary) {
  Config c = Rig::window_config(2, 10);  // steps 2-4 traced; the epoch ends with the window
  AsyncRig rig(c);
  rig.host_steps(5);
  EXPECT_EQ(rig.backend->trace_stops, 0);
  // The GPU reaches the last boundary while the epoch's end waits for it.
  rig.gpu_runs(0, 4);
  const size_t last = rig.backend->marker_ids.size() - 1;
  rig.backend->on_await.push_back({rig.backend->marker_ids[last], AsyncRig::boundary(5)});
  for (int i = 0; i <= 4; ++i) {
    rig.backend->queued.kernels.push_back(kernel(AsyncRig::boundary(4) + kMs + i * 10,
                                                 AsyncRig::boundary(4) + kMs + i * 10 + 5, 200));
  }
  rig.backend->queued.pm.push_back(pm(AsyncRig::boundary(4), AsyncRig::boundary(5), 0.25));
  rig.pilot->end_epoch();
  ASSERT_EQ(rig.backend->awaited.size(), 1u);
  EXPECT_EQ(rig.backend->awaited[0], rig.backend->marker_ids[last]);
  EXPECT_EQ(rig.backend->trace_stops, 1);
  const auto steps = rig.sink->late<GpuStepRecord>();
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_TRUE(steps[4].gpu_timed);
  EXPECT_TRUE(steps[4].traced);
  EXPECT_EQ(steps[4].stats.kernels, 5) << "the last traced step's kernels ran after its host span";
  EXPECT_NEAR(steps[4].stats.sm_efficiency, 0.25, 1e-9);
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->marker_timeouts, 0);
  // The next epoch's first step records its own start marker.
  const size_t before = rig.backend->marker_ids.size();
  rig.host_steps(1);
  EXPECT_EQ(rig.backend->marker_ids.size(), before + 2);
}

TEST(GpuMonitorTest, MarkersThatNeverResolveFallBackToHostSpansAndHoldNothingForever) {
  Config c = Rig::window_config(1, 1);
  Rig rig(c, false);
  rig.backend->markers = true;  // recorded, never resolved
  rig.make(c);
  for (int i = 0; i < 5; ++i) rig.step(100, 200, 0.5);
  EXPECT_TRUE(rig.sink->late<GpuStepRecord>().empty()) << "held while the markers may come";
  EXPECT_EQ(rig.backend->trace_stops, 0) << "the window waits for the GPU, boundedly";
  for (int i = 0; i < 25; ++i) rig.step(100, 200, 0.5);  // 3 s of host time
  EXPECT_EQ(rig.backend->trace_stops, 1);
  EXPECT_EQ(rig.backend->releases, 1);
  const auto steps = rig.sink->late<GpuStepRecord>();
  ASSERT_GE(steps.size(), 5u);
  for (const GpuStepRecord& r : steps) {
    EXPECT_FALSE(r.gpu_timed);
    EXPECT_EQ(r.stats.wall_ns, 100 * kMs) << "the host span";
    EXPECT_NEAR(r.stats.sm_efficiency, 0.5, 1e-9);
  }
  rig.pilot->end_epoch();
  // The epoch end waits boundedly (a quarter of its budget share, at most 1 s): steps whose markers
  // may still come (under 2 s old) go to the next epoch; none is held forever.
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(rig.backend->awaited.size(), 1u) << "the epoch end waited once, boundedly";
  EXPECT_EQ(g.gpu_timed_steps, 0);
  EXPECT_EQ(g.traced_steps, 1);
  EXPECT_EQ(g.steps + g.carried_steps, 30);
  EXPECT_EQ(g.marker_timeouts, g.steps);
  EXPECT_GT(g.carried_steps, 0);
  EXPECT_EQ(static_cast<int64_t>(rig.sink->late<GpuStepRecord>().size()), g.steps);
  EXPECT_NE(rig.log.str().find("still running go to the next epoch"), std::string::npos)
      << rig.log.str();
  // The run's end publishes them all, with their host spans.
  rig.pilot.reset();
  EXPECT_EQ(rig.sink->late<GpuStepRecord>().size(), 30u);
}

// Issue 15: an epoch's end waits for the GPU (and decodes PM samples on the training thread) only
// within its budget share; a short epoch's steps whose figures are not final go to the next.
TEST(GpuMonitorTest, AShortEpochsEndDoesNotWaitItsUnfinishedStepsCountInTheNext) {
  Config c = Rig::base_config();
  c.cost.budget = 0.01;
  Rig rig(c);
  rig.backend->on_flush = [&] { rig.clock->advance(5 * kMs); };  // a 5 ms decode
  for (int i = 0; i < 10; ++i) rig.step(10, 100, 0.5);
  rig.pilot->end_epoch();  // 100 ms: 0.25 ms allowed; the first flush's cost is not known yet
  const auto& g0 = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(rig.backend->flushes, 1);
  EXPECT_EQ(g0.steps, 10);
  EXPECT_EQ(g0.carried_steps, 0);
  EXPECT_EQ(g0.epoch_end_wait_ns, 5 * kMs);
  const CostStats& c0 = *rig.sink->epochs[0].sections.get<CostStats>();
  ASSERT_FALSE(c0.epoch_end_parts.empty());
  EXPECT_EQ(c0.epoch_end_parts[0], std::make_pair(std::string("gpu"), 5 * kMs));

  for (int i = 0; i < 9; ++i) rig.step(10, 100, 0.5);
  const Nanos b = rig.clock->now_ns();
  {
    auto s = rig.pilot->step(1);
    rig.clock->advance(10 * kMs);
  }                        // no sample covers it yet
  rig.pilot->end_epoch();  // a 5 ms flush does not fit in 0.25 ms: the decode thread is asked
  const auto& g1 = *rig.sink->epochs[1].sections.get<GpuEpochStats>();
  EXPECT_EQ(rig.backend->flushes, 1);
  EXPECT_EQ(rig.backend->flush_requests, 1);
  EXPECT_EQ(g1.epoch_end_wait_ns, 0);
  EXPECT_EQ(g1.steps, 9);
  EXPECT_EQ(g1.carried_steps, 1);
  EXPECT_NE(rig.log.str().find("(over 9 steps, 0 of them from earlier epochs; 1 still running go "
                               "to the next epoch)"),
            std::string::npos)
      << rig.log.str();

  rig.backend->queued.pm.push_back(pm(b, b + 10 * kMs, 0.5));  // the decode thread delivers
  for (int i = 0; i < 10; ++i) rig.step(10, 100, 0.5);
  rig.pilot->end_epoch();
  const auto& g2 = *rig.sink->epochs[2].sections.get<GpuEpochStats>();
  EXPECT_EQ(g2.earlier_steps, 1);
  EXPECT_EQ(g2.steps, 11);
  const auto late = rig.sink->late<GpuStepRecord>();
  ASSERT_EQ(late.size(), 30u);
  EXPECT_EQ(late[19].epoch, 1);
  EXPECT_NEAR(late[19].stats.sm_efficiency, 0.5, 1e-9);
}

// An epoch's end waits for a window's release (0.1-0.4 s) only for the run's first window;
// a later window's steps wait for their records and count in the next epoch.
TEST(GpuMonitorTest, AnEpochEndWaitsOnlyForTheFirstWindowsRelease) {
  Config c = Rig::window_config(2, 3, 1);
  Rig rig(c);
  rig.backend->slow_release = true;
  for (int i = 0; i < 10; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.backend->finish_releases, 1);
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->traced_steps, 3);
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->carried_steps, 0);

  for (int i = 0; i < 10; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();  // the second window's release still runs: not waited for
  EXPECT_EQ(rig.backend->releases, 2);
  EXPECT_EQ(rig.backend->finish_releases, 1);
  const auto& g1 = *rig.sink->epochs[1].sections.get<GpuEpochStats>();
  EXPECT_EQ(g1.traced_steps, 0);
  EXPECT_EQ(g1.steps, 2) << "the steps before the window";
  EXPECT_EQ(g1.carried_steps, 8) << "the window's and those after it (steps finish in order)";

  rig.backend->releasing = false;  // done
  for (int i = 0; i < 10; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  const auto& g2 = *rig.sink->epochs[2].sections.get<GpuEpochStats>();
  EXPECT_EQ(g2.earlier_steps, 8);
  EXPECT_GE(g2.traced_steps, 3);
}

// With the default budget the first window's release (0.4 s) is waited for only when the budget
// has room for it; otherwise its figures come with a later epoch.
TEST(GpuMonitorTest, TheFirstWindowsReleaseIsWaitedForOnlyWithRoomInTheBudget) {
  Config c = Rig::base_config();
  c.cost.budget = 0.01;
  c.gpu.trace_first_step = 5;
  c.gpu.trace_steps = 2;
  Rig rig(c);
  rig.backend->slow_release = true;
  auto epoch = [&] {
    for (int i = 0; i < 20; ++i) rig.step(10, 200, 1.0);
    rig.pilot->end_epoch();
  };
  for (int e = 0; e < 30; ++e) epoch();  // the window opens at about 5 s
  EXPECT_EQ(rig.backend->trace_starts, 1);
  EXPECT_EQ(rig.backend->releases, 1);
  EXPECT_EQ(rig.backend->finish_releases, 0) << "0.4 s does not fit in 1% of 6 s";
  int64_t traced = 0;
  for (const auto& s : rig.sink->epochs) traced += s.sections.get<GpuEpochStats>()->traced_steps;
  EXPECT_EQ(traced, 0) << "not final while the release runs";
  rig.backend->releasing = false;  // done
  epoch();
  traced = 0;
  for (const auto& s : rig.sink->epochs) traced += s.sections.get<GpuEpochStats>()->traced_steps;
  EXPECT_EQ(traced, 2);
}

TEST(GpuMonitorTest, WithoutMarkersStepsUseTheirHostSpanAtOnce) {
  Config c = Rig::window_config(1, 1);
  Rig rig(c);  // the fake records no markers (as the unavailable backend)
  for (int i = 0; i < 3; ++i) rig.step(10, 200, 0.5);
  rig.step(GpuMonitor::kCollectEveryNs / kMs, 200, 0.5);  // its end collects (after the window's)
  EXPECT_EQ(rig.backend->trace_stops, 1);
  EXPECT_EQ(rig.sink->late<GpuStepRecord>().size(), 4u);
  rig.pilot->end_epoch();
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.gpu_timed_steps, 0);
  EXPECT_EQ(g.marker_timeouts, 0);
  EXPECT_TRUE(rig.backend->awaited.empty());
  EXPECT_FALSE(rig.sink->late<GpuStepRecord>()[0].gpu_timed);
}

TEST(GpuMonitorTest, StepMarkersOffInTheConfigurationAreNeverRecorded) {
  Config c = Rig::base_config();
  c.gpu.step_markers = false;
  Rig rig(c, false);
  rig.backend->markers = true;
  rig.make(c);
  for (int i = 0; i < 3; ++i) rig.step(10, 200, 0.5);
  rig.pilot->end_epoch();
  EXPECT_TRUE(rig.backend->marker_ids.empty());
  EXPECT_EQ(rig.sink->late<GpuStepRecord>().size(), 3u);
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->gpu_timed_steps, 0);
}

// --- runs of steps sharing markers (gpu.marker_interval_ms) ------------------------------------

// Steps of 1 ms of host time with markers every 4 ms; the GPU runs behind by 20 ms and takes
// twice the host's time for each step (a queue that grows: its span is not the host's).
struct RunRig : Rig {
  explicit RunRig(Config c) : Rig(c, false) {
    backend->markers = true;
    c.gpu.marker_interval_ms = 4;
    make(std::move(c));
  }
  // Each marker recorded so far, resolved at 20 ms + twice its host time.
  void gpu_reaches_all() {
    for (; resolved < backend->marker_ids.size(); ++resolved) {
      backend->resolve(backend->marker_ids[resolved], 20 * kMs + 2 * recorded_at[resolved]);
    }
  }
  void host_steps(int n) {
    for (int i = 0; i < n; ++i) {
      auto s = pilot->step(1);
      note_markers();
      clock->advance(kMs);
      s.end();
      note_markers();
    }
  }
  void note_markers() {
    while (recorded_at.size() < backend->marker_ids.size()) recorded_at.push_back(clock->now_ns());
  }
  std::vector<Nanos> recorded_at;
  size_t resolved = 0;
};

// Steps that share markers count their run's mean GPU span among the ordinary steps: host-time
// shares would copy the host's pattern (1 and 3 ms steps read 2 and 6 ms on the GPU, whose run
// of two took 8). Their host length beside it is the run's mean too (2 ms, where the host's
// median step is 1 or 3 ms): the two sides are compared like for like.
TEST(GpuMonitorTest, OrdinaryStepsSharingMarkersCountTheirRunsMeanGpuSpan) {
  RunRig rig(Rig::base_config());
  for (int i = 0; i < 24; ++i) {
    auto s = rig.pilot->step(1);
    rig.note_markers();
    rig.clock->advance(i % 2 == 0 ? kMs : 3 * kMs);  // runs of two: 4 ms of host time
    s.end();
    rig.note_markers();
    rig.gpu_reaches_all();  // the GPU takes twice the host's time
  }
  rig.pilot->end_epoch();
  const auto* g = rig.sink->epochs[0].sections.get<GpuEpochStats>();
  ASSERT_NE(g, nullptr);
  ASSERT_GE(g->ordinary_gpu_steps, 16);
  EXPECT_NEAR(static_cast<double>(g->ordinary_gpu_step_p50_ns), 4e6, 0.05 * 4e6);
  // The same steps' host lengths in total beside their GPU lengths: 2 ms and 4 ms a step.
  EXPECT_NEAR(static_cast<double>(g->ordinary_gpu_host_ns), 2e6 * g->ordinary_gpu_steps, 1e3);
  EXPECT_NEAR(static_cast<double>(g->ordinary_gpu_ns), 4e6 * g->ordinary_gpu_steps, 1e3);
}

TEST(GpuMonitorTest, StepsBetweenTwoMarkersShareTheirGpuSpanByHostTime) {
  RunRig rig(Rig::base_config());
  rig.host_steps(10);
  // Markers: the first step's start, then the ends of steps 3 and 7 (4 ms after the run's
  // start); the epoch's end closes the last run (steps 8 and 9).
  EXPECT_EQ(rig.backend->marker_ids.size(), 3u);
  rig.pilot->end_epoch();  // records the run's end marker, waits for it (the fake: at once)
  EXPECT_EQ(rig.backend->marker_ids.size(), 4u);
  rig.note_markers();
  rig.gpu_reaches_all();
  rig.host_steps(1);  // the next epoch's first step drains them
  rig.pilot->end_epoch();
  const auto steps = rig.sink->late<GpuStepRecord>();
  ASSERT_GE(steps.size(), 10u);
  for (int k = 0; k < 10; ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    const GpuStepRecord& r = steps[static_cast<size_t>(k)];
    EXPECT_TRUE(r.gpu_timed);
    EXPECT_TRUE(r.gpu_shared) << "no step of 1 ms has markers of its own";
    // The GPU ran the run twice as slowly: each step's share is 2 ms, back to back.
    EXPECT_EQ(r.gpu_end_ns - r.gpu_begin_ns, 2 * kMs);
    EXPECT_EQ(r.gpu_begin_ns, 20 * kMs + 2 * k * kMs);
  }
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->marker_timeouts, 0);
}

TEST(GpuMonitorTest, AWindowsStepsGetMarkersOfTheirOwnAndEndTheRunBeforeThem) {
  Config c = Rig::window_config(2, 2);  // steps 2 and 3 traced
  RunRig rig(c);
  rig.host_steps(6);
  // Step 0's start; the run of steps 0-1 ends where the window starts (step 2's start), then a
  // marker at each traced step's end and in the window's tail (steps 4 and 5: the trace is
  // released at step 5's end).
  EXPECT_EQ(rig.backend->marker_ids.size(), 6u);
  rig.pilot->end_epoch();
  rig.note_markers();
  rig.gpu_reaches_all();
  rig.host_steps(1);
  rig.pilot->end_epoch();
  const auto steps = rig.sink->late<GpuStepRecord>();
  ASSERT_GE(steps.size(), 6u);
  for (int k = 0; k < 6; ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    EXPECT_TRUE(steps[static_cast<size_t>(k)].gpu_timed);
    EXPECT_EQ(steps[static_cast<size_t>(k)].gpu_shared, k < 2);
  }
  // Traced steps' GPU spans are their own markers': 2 ms each (the GPU's pace).
  EXPECT_EQ(steps[2].gpu_end_ns - steps[2].gpu_begin_ns, 2 * kMs);
  EXPECT_EQ(steps[3].gpu_end_ns - steps[3].gpu_begin_ns, 2 * kMs);
}

TEST(GpuMonitorTest, ARunsStepsWaitForItsEndMarkerAndNeverLongerThanTheBound) {
  RunRig rig(Rig::base_config());
  rig.backend->queued.pm.push_back(
      pm(0, 3 * GpuMonitor::kMarkerWaitNs, 0.5));  // samples: none wait
  rig.host_steps(2);                               // a run open: no end marker yet
  rig.note_markers();
  rig.gpu_reaches_all();
  rig.host_steps(1);
  EXPECT_TRUE(rig.sink->late<GpuStepRecord>().empty()) << "steps 0-1 wait for their run's end";
  // The host stalls longer than the markers' bound within the run: the steps finish untimed.
  rig.clock->advance(GpuMonitor::kMarkerWaitNs);
  auto s = rig.pilot->step(1);
  s.end();
  // That step's end (over 4 ms after the run's start) closed the run: its steps are timed once
  // the GPU reaches the marker; those past the bound are not held for it.
  const auto steps = rig.sink->late<GpuStepRecord>();
  ASSERT_FALSE(steps.empty());
  EXPECT_FALSE(steps[0].gpu_timed);
}

}  // namespace
}  // namespace torchpilot
