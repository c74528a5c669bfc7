// What torchpilot costs and the budget it keeps (cost.h), step-time outliers and periodic stalls
// (step_outliers.h), and the host-side advisors (host_bound, periodic_stall, low_mfu's bound).
#include "torchpilot/runtime/cost/cost.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fakes/pilot_parts.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/reports/run_journal.h"
#include "torchpilot/runtime/reports/sinks.h"
#include "torchpilot/runtime/stalls/step_outliers.h"

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1000000;
constexpr Nanos kS = 1000000000;

CostConfig budget(double fraction, double horizon_s) {
  CostConfig c;
  c.budget = fraction;
  c.horizon_s = horizon_s;
  return c;
}

TEST(CostBudgetTest, AllowanceGrowsWithTheRunUpToTheHorizon) {
  CostBudget b(budget(0.01, 100));
  EXPECT_FALSE(b.allows(0, 1)) << "nothing before the run starts";
  b.start(0);
  EXPECT_EQ(b.allowance(10 * kS), 100 * kMs);
  EXPECT_EQ(b.allowance(1000 * kS), 1000 * kMs) << "1% of the 100 s horizon";
  b.spend(5 * kS, 60 * kMs);
  EXPECT_TRUE(b.allows(10 * kS, 40 * kMs));
  EXPECT_FALSE(b.allows(10 * kS, 41 * kMs));
  EXPECT_NEAR(b.horizon_fraction(10 * kS), 0.006, 1e-9);
}

TEST(CostBudgetTest, SpendingLeavesTheHorizon) {
  CostBudget b(budget(0.01, 64));  // one-second slices
  b.start(0);
  b.spend(kS, 500 * kMs);
  EXPECT_EQ(b.spent(60 * kS), 500 * kMs);
  EXPECT_FALSE(b.allows(60 * kS, 200 * kMs));
  EXPECT_EQ(b.spent(70 * kS), 0) << "spent 69 s ago: out of the 64 s horizon";
  EXPECT_TRUE(b.allows(70 * kS, 600 * kMs));
}

// A collector that takes 1 ms of the training thread at each step's start.
class SlowCollector final : public Collector {
 public:
  explicit SlowCollector(ManualClock& clock) : clock_(clock) {}
  std::string name() const override { return "slow"; }
  void on_step_begin(int64_t, Nanos) override { clock_.advance(kMs); }
  void on_epoch_end(EpochSummary&) override { clock_.advance(5 * kMs); }

 private:
  ManualClock& clock_;
};

struct PilotRig : test::PilotParts {
  std::shared_ptr<ManualClock> cpu = std::make_shared<ManualClock>();
  explicit PilotRig(Config c = {}, bool slow = true) {
    PilotOptions o = options("cost-test");
    o.cpu_clock = cpu;
    o.default_collectors = false;
    if (slow) o.collectors.push_back(std::make_shared<SlowCollector>(*clock));
    pilot = std::make_unique<Pilot>(std::move(c), std::move(o));
  }
  void step(Nanos ms, Nanos cpu_ms) {
    auto s = pilot->step(1);
    clock->advance(ms * kMs);
    cpu->advance(cpu_ms * kMs);
  }
};

TEST(PilotCostTest, OwnTimeOnTheTrainingThreadIsMeasuredAndReported) {
  PilotRig rig;
  for (int i = 0; i < 10; ++i) rig.step(10, 10);
  rig.pilot->end_epoch();
  for (const StepRecord& r : rig.pilot->recent_steps()) EXPECT_EQ(r.own_ns, kMs) << r.step;
  ASSERT_EQ(rig.sink->epochs.size(), 1u);
  const EpochSummary& e = rig.sink->epochs[0];
  EXPECT_EQ(e.own_ns, 10 * kMs);
  EXPECT_EQ(e.cpu_ns, 100 * kMs);
  const CostStats* c = e.sections.get<CostStats>();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->step_calls_ns, 10 * kMs);
  EXPECT_EQ(c->epoch_end_ns, 5 * kMs) << "the collectors' epoch-end work";
  EXPECT_EQ(c->training_thread_ns, 15 * kMs);
  EXPECT_EQ(c->epoch_ns, 115 * kMs);
  EXPECT_NEAR(c->fraction, 15.0 / 115.0, 1e-9);
  EXPECT_DOUBLE_EQ(c->budget, 0.01);
  // Where the epoch end went, by part: the slow collector's 5 ms.
  ASSERT_FALSE(c->epoch_end_parts.empty());
  EXPECT_EQ(c->epoch_end_parts[0].first, "slow");
  EXPECT_EQ(c->epoch_end_parts[0].second, 5 * kMs);
  ASSERT_FALSE(c->step_parts.empty());
  EXPECT_EQ(c->step_parts[0], std::make_pair(std::string("slow"), 10 * kMs));
  EXPECT_NE(rig.log.str().find("torchpilot: 15.00 ms, 13.0% of the epoch (steps 10.00 ms: slow "
                               "10.00 ms; epoch end 5.00 ms: slow 5.00 ms)"),
            std::string::npos)
      << rig.log.str();
  const std::string json = epoch_json(e, {});
  EXPECT_NE(json.find("\"cost\":{"), std::string::npos) << json;
  EXPECT_NE(json.find("\"training_thread_ms\":15.0"), std::string::npos) << json;
  EXPECT_NE(json.find("\"epoch_end_parts_ms\":{"), std::string::npos) << json;
}

TEST(PilotCostTest, NoCpuClockMeansCpuTimeNotMeasured) {
  Config c;
  PilotOptions o;
  o.clock = std::make_shared<ManualClock>();
  o.default_collectors = false;
  o.logger = std::make_shared<spdlog::logger>("quiet");
  Pilot pilot(c, std::move(o));
  { auto s = pilot.step(1); }
  EXPECT_EQ(pilot.recent_steps()[0].cpu_ns, -1);
}

// --- outliers -------------------------------------------------------------------------------

StepRecord record(int64_t step, int64_t in_epoch, Nanos ms) {
  StepRecord r;
  r.step = step;
  r.step_in_epoch = in_epoch;
  r.begin_ns = step * 1000 * kMs;
  r.end_ns = r.begin_ns + ms * kMs;
  return r;
}

TEST(StallTrackerTest, ASingleSlowStepMakesNoPeriod) {
  StallTracker t(3.0);
  for (int64_t i = 0; i < 50; ++i) t.add(record(i, i, 10));
  EXPECT_TRUE(t.add(record(50, 50, 100)));
  for (int64_t i = 51; i < 200; ++i) t.add(record(i, i, 10));
  EXPECT_EQ(t.period(), 0);
  EpochSummary e;
  e.wall_ns = 200 * 10 * kMs + 90 * kMs;
  const OutlierStats o = t.summarize(e, {});
  EXPECT_EQ(o.count, 1);
  EXPECT_EQ(o.period, 0);
  EXPECT_EQ(o.excess_ns, 90 * kMs);
}

TEST(StallTrackerTest, TwoSlowStepsMakeNoPeriodThreeEquallySpacedDo) {
  StallTracker t(3.0);
  for (int64_t i = 0; i < 150; ++i) {
    const bool slow = i == 40 || i == 77 || i == 114;  // every 37 steps
    t.add(record(i, i, slow ? 60 : 10));
    if (i == 77) EXPECT_EQ(t.period(), 0) << "one gap is no period";
  }
  EXPECT_EQ(t.period(), 37);
  EXPECT_TRUE(t.at_period(151));
  EXPECT_TRUE(t.at_period(150));  // one step either side
  EXPECT_FALSE(t.at_period(140));
}

// A slow step every 4 steps (a stock loader whose 4 workers deliver in turn, then all wait) is the
// step's rhythm, not a periodic stall: no period, so the sync probe, the markers and the CPU reads
// that a period brings stay off (they would be at three steps in four). Every 16 is one.
TEST(StallTrackerTest, SlowStepsEveryFewStepsMakeNoPeriod) {
  for (const int64_t every : {2, 4, 8, 15}) {
    StallTracker t(3.0);
    for (int64_t i = 0; i < 400; ++i) t.add(record(i, i, i % every == every - 1 ? 60 : 10));
    EXPECT_EQ(t.period(), 0) << "a slow step every " << every;
    EXPECT_FALSE(t.at_period(401));
  }
  // Gaps that alternate (8, 9, 8, 9: a batch that takes 8.5 steps' time) hold no fine lattice,
  // but every 17 holds half of them: still a rhythm.
  for (const int64_t gap : {8, 9, 12}) {
    StallTracker t(3.0);
    int64_t next = 5;
    bool longer = false;
    for (int64_t i = 0; i < 400; ++i) {
      const bool slow = i == next;
      if (slow) {
        next += gap + (longer ? 1 : 0);
        longer = !longer;
      }
      t.add(record(i, i, slow ? 60 : 10));
    }
    EXPECT_EQ(t.period(), 0) << "gaps of " << gap << " and " << gap + 1;
  }
  StallTracker t(3.0);
  for (int64_t i = 0; i < 400; ++i) t.add(record(i, i, i % 16 == 15 ? 60 : 10));
  EXPECT_EQ(t.period(), StallTracker::kMinPeriod);
}

TEST(StallTrackerTest, AStallThatLastsTwoStepsIsOneEvent) {
  StallTracker t(3.0);
  for (int64_t i = 0; i < 200; ++i) {
    const bool slow = i % 50 == 20 || i % 50 == 21;
    t.add(record(i, i, slow ? 60 : 10));
  }
  EXPECT_EQ(t.period(), 50);
}

// A checkpoint every 150 steps with unrelated slow steps between (two-step stalls, as the
// planted checkpoint pair's advise epoch on an H100 had them): the gaps between consecutive
// events are mostly not 150, the lattice through the checkpoints is.
TEST(StallTrackerTest, APeriodHoldsWithUnrelatedSlowStepsBetween) {
  const std::set<int64_t> slow = {74, 224, 325, 326, 340, 341, 374, 465, 466, 524, 674, 824, 974};
  StallTracker t(3.0);
  for (int64_t i = 0; i < 975; ++i) {
    t.add(record(i, i, slow.count(i) > 0 ? 60 : 2));
    if (i == 300) EXPECT_EQ(t.period(), 0) << "two checkpoints are no period";
  }
  EXPECT_EQ(t.period(), 150);
  EXPECT_TRUE(t.at_period(1124));
  EXPECT_FALSE(t.at_period(1050));
}

// Among many unrelated slow steps, three that happen to be equally spaced (520, 591, 662: every
// 71), or three on a lattice with a gap (20, 83, 209: every 63, 146 missing), are no period.
TEST(StallTrackerTest, ThreeEquallySpacedAmongManyUnrelatedSlowStepsAreNoPeriod) {
  const std::set<int64_t> slow = {20, 83, 131, 209, 250, 301, 390, 445, 520, 591, 662};
  StallTracker t(3.0);
  for (int64_t i = 0; i < 700; ++i) {
    t.add(record(i, i, slow.count(i) > 0 ? 60 : 2));
    EXPECT_EQ(t.period(), 0) << "at step " << i;
  }
}

// The anchor is the lattice point: an event a step off the lattice still counts at the period.
TEST(StallTrackerTest, TheAnchorIsOnTheLatticeNotOnTheLastEvent) {
  const std::set<int64_t> slow = {100, 200, 299, 401};
  StallTracker t(3.0);
  for (int64_t i = 0; i < 450; ++i) t.add(record(i, i, slow.count(i) > 0 ? 60 : 2));
  EXPECT_EQ(t.period(), 100);
  EXPECT_TRUE(t.at_period(299));
  EXPECT_TRUE(t.at_period(499));
  EXPECT_TRUE(t.at_period(501));
  EXPECT_FALSE(t.at_period(502));
}

// Issue 40: a stall every 40 steps was reported as every 120 in epochs of 120 steps, where every
// third stall falls on an epoch's first step (an edge, left out of the events). Such a stall
// fills the lattice; edges alone (every epoch's first step slow) still make no period.
TEST(StallTrackerTest, AStallOnAnEpochsFirstStepStillCountsForThePeriod) {
  StallTracker t(3.0);
  for (int64_t i = 0; i < 600; ++i) {
    const bool slow = i > 0 && i % 40 == 0;
    t.add(record(i, i % 120, slow ? 60 : 10));
    if (i >= 160)
      EXPECT_TRUE(t.period() == 0 || t.period() == 40) << "at " << i << ": " << t.period();
  }
  EXPECT_EQ(t.period(), 40);
  StallTracker edges(3.0);
  for (int64_t i = 0; i < 600; ++i) edges.add(record(i, i % 120, i % 120 == 0 ? 60 : 10));
  EXPECT_EQ(edges.period(), 0);
}

// The sync probe's figures (sync.*) on the probed steps: the stalls' time in syncs and host
// copies above what the ordinary steps probed beside them spend there.
TEST(StallTrackerTest, ProbedStallsGetTheirSyncShareAboveTheOrdinaryProbedSteps) {
  StallTracker t(3.0);
  constexpr int64_t kPeriod = 20;
  int64_t probed_stalls = 0;
  for (int64_t i = 0; i < 200; ++i) {
    const bool slow = i % kPeriod == 5;
    StepRecord r = record(i, i, slow ? 110 : 10);
    t.add(r);
    r.at_period = t.at_period(i);
    // What the probe does (hooks/gpu/torch_sync_probe.cpp): it probes from the step after one
    // at the period; here every step at the period is probed, as are the one after them.
    if (r.at_period || (i > 0 && t.at_period(i - 1))) {
      r.metrics.set("sync", "probed", 1);
      r.metrics.set("sync", "ms", slow ? 62.0 : 2.0);  // 60 ms of the 100 ms excess, 2 ms always
      r.metrics.set("sync", "ops", slow ? 40 : 1);
      r.metrics.set("sync", "d2h_mb", slow ? 200 : 0.0);
      probed_stalls += slow ? 1 : 0;
    }
    t.add_probe(r);
  }
  EXPECT_EQ(t.period(), kPeriod);
  EpochSummary e;
  e.steps = 200;
  e.wall_ns = 190 * 10 * kMs + 10 * 110 * kMs;
  const OutlierStats o = t.summarize(e, {});
  ASSERT_GT(probed_stalls, 0);
  EXPECT_EQ(o.probed, probed_stalls);
  EXPECT_NEAR(o.sync_share, 0.6, 1e-6);
  EXPECT_NEAR(o.d2h_mb_per_stall, 200, 1e-9);
  EXPECT_NEAR(o.syncs_per_stall, 40, 1e-9);
  const std::string json = section_json(o);
  EXPECT_NE(json.find("\"sync_share\":0.6"), std::string::npos) << json;
}

// A GPU-bound trainer: the host stalls 100 ms every 20 steps, but the GPU runs the work queued
// before the stall for 70 ms of it: the stall costs the GPU 30 ms, and that is the gain.
// `s` with `o` as its outliers, and the periodic-stall advice on it.
auto advise_stall(EpochSummary& s, const OutlierStats& o) {
  s.sections.set(o);
  return advise_periodic_stall(s, AdvisorsConfig{});
}

// 100 steps in 1 s.
EpochSummary hundred_steps_in_a_second() {
  EpochSummary s;
  s.steps = 100;
  s.wall_ns = 1000 * kMs;
  return s;
}

// Five stalls every 20 steps of 8 ms (every 0.16 s), 150 ms (30 ms each, 15%) above the median.
OutlierStats five_periodic_stalls() {
  OutlierStats o;
  o.count = o.periodic_count = 5;
  o.period = 20;
  o.median_ns = 8 * kMs;
  o.periodic_excess_ns = 150 * kMs;
  o.periodic_share = 0.15;
  return o;
}

TEST(StallTrackerTest, GpuSpansGiveTheStallsCostInGpuTime) {
  StallTracker t(3.0);
  std::vector<std::pair<int64_t, Nanos>> late;  // GPU spans come after their steps
  for (int64_t i = 0; i < 200; ++i) {
    const bool slow = i % 20 == 5;
    t.add(record(i, i, slow ? 110 : 10));
    late.emplace_back(i, (slow ? 40 : 10) * kMs);
    if (late.size() > 3) {  // three steps behind
      t.add_gpu_span(late.front().first, late.front().second);
      late.erase(late.begin());
    }
  }
  EpochSummary e;
  e.steps = 200;
  e.wall_ns = 190 * 10 * kMs + 10 * 110 * kMs;
  OutlierStats o = t.summarize(e, {});
  EXPECT_EQ(o.periodic_count, 9);  // the first stall comes before the median is known
  EXPECT_EQ(o.gpu_timed, 9);
  EXPECT_EQ(o.gpu_median_ns, 10 * kMs);
  EXPECT_EQ(o.periodic_excess_ns, 9 * 100 * kMs);
  EXPECT_EQ(o.periodic_gpu_excess_ns, 9 * 30 * kMs);
  EpochSummary s = e;
  auto a = advise_stall(s, o);
  ASSERT_TRUE(a.has_value());
  EXPECT_NEAR(a->expected_gain, 270.0 / (3000.0 - 270.0), 1e-6);
  EXPECT_NE(a->action.find("the GPU's idle in the stalls removed: 30 ms per stall above its median "
                           "step, of the 100 ms the host stalls"),
            std::string::npos)
      << a->action;
  // Without GPU spans: the host's excess.
  o.periodic_gpu_excess_ns = -1;
  o.gpu_timed = 0;
  a = advise_stall(s, o);
  ASSERT_TRUE(a.has_value());
  EXPECT_NEAR(a->expected_gain, 900.0 / (3000.0 - 900.0), 1e-6);
}

TEST(StallTrackerTest, ASlowStepRightAfterAStallIsPartOfTheSameStall) {
  // Seen on an H100: the step after each checkpoint save was also slow (the GPU queue refilling)
  // now and then. Its excess belongs to the save's stall; the stall is counted once.
  StallTracker t(3.0);
  for (int64_t i = 0; i < 200; ++i) {
    const bool save = i % 20 == 5;
    const bool after = i == 46;  // once, the step after a save
    t.add(record(i, i, save ? 110 : after ? 50 : 10));
  }
  EpochSummary e;
  e.steps = 200;
  e.wall_ns = 189 * 10 * kMs + 10 * 110 * kMs + 50 * kMs;
  const OutlierStats o = t.summarize(e, {});
  EXPECT_EQ(o.period, 20);
  EXPECT_EQ(o.periodic_count, 9);  // the first save comes before the median is known
  EXPECT_EQ(o.periodic_excess_ns, 9 * 100 * kMs + 40 * kMs);
}

TEST(StallTrackerTest, UnprobedStallsHaveNoSyncShare) {
  StallTracker t(3.0);
  for (int64_t i = 0; i < 200; ++i) {
    StepRecord r = record(i, i, i % 20 == 5 ? 110 : 10);
    t.add(r);
    r.at_period = t.at_period(i);
    t.add_probe(r);
  }
  EpochSummary e;
  e.wall_ns = 3000 * kMs;
  const OutlierStats o = t.summarize(e, {});
  EXPECT_EQ(o.probed, 0);
  EXPECT_FALSE(measured(o.sync_share));
  EXPECT_EQ(section_json(o).find("\"sync_share\":0"), std::string::npos);
}

// --- advisors -------------------------------------------------------------------------------

EpochSummary host_bound_summary(double busy, Nanos cpu_ms) {
  EpochSummary s;
  s.steps = 100;
  s.wall_ns = 100 * 10 * kMs;
  s.step_p50_ns = 10 * kMs;
  s.cpu_ns = cpu_ms * kMs;
  GpuEpochStats g;
  g.device = "Fake GPU";
  g.stats.counter_utilization = busy;
  s.sections.set(g);
  return s;
}

TEST(HostBoundTest, AHostBoundStepIsNamedWithNoUnboundedGain) {
  // The GPU busy 0.1% of the step; the thread busy on the CPU (host work, no loader attached).
  const EpochSummary s = host_bound_summary(0.001, 950);
  const auto a = advise_host_bound(s, AdvisorsConfig{});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->severity, Severity::kHigh);
  EXPECT_NE(a->finding.find("idles 99.9% of the step"), std::string::npos) << a->finding;
  EXPECT_NE(a->cause.find("mostly busy"), std::string::npos) << a->cause;
  EXPECT_NE(a->action.find("torchpilot::watch"), std::string::npos) << a->action;
  EXPECT_NE(a->action.find("move host work off the training thread"), std::string::npos);
  EXPECT_EQ(a->expected_gain, 0.0) << "how much host work can move is not measured";
  // Run through the catalog: no advice states an unbounded gain.
  Config c;
  for (const Advice& x : run_advisors(s, c)) EXPECT_LE(x.expected_gain, 1.0 / 0.001) << x.id;
}

TEST(HostBoundTest, BlockedThreadPointsAtTheUnmeasuredWait) {
  const auto a = advise_host_bound(host_bound_summary(0.3, 100), AdvisorsConfig{});
  ASSERT_TRUE(a.has_value());
  EXPECT_NE(a->cause.find("mostly blocked"), std::string::npos) << a->cause;
  EXPECT_NE(a->action.find("torchpilot::watch"), std::string::npos) << a->action;
}

TEST(HostBoundTest, BeforeAWindowItSaysOneWillTellInsteadOfGuessing) {
  for (const char* plan : {"planned", "deferred"}) {
    SCOPED_TRACE(plan);
    EpochSummary s = host_bound_summary(0.001, 950);
    GpuEpochStats g = *s.sections.get<GpuEpochStats>();
    g.next_window = plan;
    g.next_window_step = 20;
    s.sections.set(g);
    const auto a = advise_host_bound(s, AdvisorsConfig{});
    ASSERT_TRUE(a.has_value());
    EXPECT_NE(a->action.find("a trace window will tell which of host work, host syncs, pageable "
                             "copies or kernel launch gaps idles the GPU"),
              std::string::npos)
        << a->action;
    EXPECT_EQ(a->action.find("move host work off the training thread"), std::string::npos)
        << "no guessed action before the window";
    EXPECT_NE(a->action.find(std::string(plan) == "planned" ? "planned from step 20"
                                                            : "waits for room in the cost budget"),
              std::string::npos)
        << a->action;
  }
  // Windows done (or off): the actions come back.
  EpochSummary s = host_bound_summary(0.001, 950);
  GpuEpochStats g = *s.sections.get<GpuEpochStats>();
  g.next_window = "done";
  s.sections.set(g);
  EXPECT_NE(advise_host_bound(s, AdvisorsConfig{})->action.find("move host work"),
            std::string::npos);
}

TEST(HostBoundTest, QuietOnABusyGpuOrWithoutGpuFigures) {
  EXPECT_FALSE(advise_host_bound(host_bound_summary(0.95, 950), AdvisorsConfig{}).has_value());
  EpochSummary s = host_bound_summary(0.1, 950);
  s.data_wait_ns = 850 * kMs;  // the idle is the measured data wait
  s.data_wait_fraction = 0.85;
  EXPECT_FALSE(advise_host_bound(s, AdvisorsConfig{}).has_value());
  EpochSummary no_gpu;
  no_gpu.steps = 10;
  no_gpu.wall_ns = 100 * kMs;
  EXPECT_FALSE(advise_host_bound(no_gpu, AdvisorsConfig{}).has_value());
}

// The low-MFU advice on `s` with an MFU of 0.05% (1 GFLOP a step, 1 PFLOP/s peak).
auto advise_low_mfu_at_half_a_thousandth(EpochSummary& s) {
  FlopEpochStats f;
  f.mfu = 0.0005;
  f.model_flops_per_step = 1e9;
  f.peak_flops_per_s = 1e15;
  s.sections.set(f);
  return advise_low_mfu(s, AdvisorsConfig{});
}

TEST(LowMfuTest, HostIdleWithoutATraceStatesNoGain) {
  EpochSummary s = host_bound_summary(0.0012, 950);
  const auto a = advise_low_mfu_at_half_a_thousandth(s);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->expected_gain, 0.0) << a->action;
  EXPECT_NE(a->action.find("host_bound"), std::string::npos) << a->action;
}

TEST(LowMfuTest, TracedHostIdleStatesNoGain) {
  EpochSummary s = host_bound_summary(0.0012, 950);
  GpuEpochStats g = *s.sections.get<GpuEpochStats>();
  g.traced_steps = 10;
  g.stats.traced_ns = 100 * kMs;
  g.stats.gpu_utilization = 0.0012;
  g.stats.idle_other_ns = static_cast<Nanos>(0.9988 * 100 * kMs);
  g.kernel_classes.steps = 10;
  g.kernel_classes.traced_ns = 100 * kMs;
  g.kernel_classes.idle_ns = 0.9988 * 100 * kMs;
  s.sections.set(g);
  const auto a = advise_low_mfu_at_half_a_thousandth(s);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->expected_gain, 0.0) << a->cause << " / " << a->action;
  EXPECT_NE(a->cause.find("before the first or after the last kernel"), std::string::npos)
      << a->cause;
}

TEST(PeriodicStallTest, QuietWithoutAPeriodOrBelowThreshold) {
  EpochSummary s = hundred_steps_in_a_second();
  OutlierStats o;
  o.count = 1;
  o.excess_ns = 200 * kMs;
  o.excess_share = 0.2;
  EXPECT_FALSE(advise_stall(s, o).has_value()) << "one slow step";
  o.period = 20;
  o.periodic_count = 5;
  o.periodic_excess_ns = 10 * kMs;
  o.periodic_share = 0.01;
  EXPECT_FALSE(advise_stall(s, o).has_value()) << "below 2%";
  o.periodic_excess_ns = 100 * kMs;
  o.periodic_share = 0.1;
  o.median_ns = 10 * kMs;
  const auto a = advise_stall(s, o);
  ASSERT_TRUE(a.has_value());
  EXPECT_NEAR(a->expected_gain, 100.0 / 900.0, 1e-9);
  EXPECT_NE(a->action.find("pilot.phase(\"checkpoint\")"), std::string::npos) << a->action;
}

TEST(PeriodicStallTest, ProbedHostCopiesNameTheCopyAndTheAsynchronousCheckpoint) {
  EpochSummary s = hundred_steps_in_a_second();
  OutlierStats o = five_periodic_stalls();
  o.cpu_share = 0.2;
  o.probed = 2;
  o.sync_share = 0.7;
  o.syncs_per_stall = 6;
  o.d2h_mb_per_stall = 201.3;
  // Each row changes the stall further, then names what the cause and the action must say.
  struct Row {
    const char* what;
    std::function<void(OutlierStats&)> change;
    std::vector<std::string> in_cause, in_action;
  };
  const std::vector<Row> rows = {
      {"copies most of the stall",
       [](OutlierStats&) {},
       {"70.0% of it waits for the GPU or copies to the host (201.3 MB"},
       {"if this is a checkpoint: checkpoint asynchronously"}},
      {"the copies a small part of the stall (serializing and writing the rest): still named",
       [](OutlierStats& o) {
         o.sync_share = 0.26;
         o.cpu_share = 0.85;
       },
       {},
       {"if this is a checkpoint: checkpoint asynchronously"}},
      {"few bytes: reads for logging, named only when they are most of the stall",
       [](OutlierStats& o) {
         o.d2h_mb_per_stall = 0.001;
         o.sync_share = 0.26;
       },
       {},
       {"mark the periodic work"}},
      {"few bytes, most of the stall",
       [](OutlierStats& o) { o.sync_share = 0.7; },
       {"6 reads per stall"},
       {"without synchronizing every time"}},
      {"a marked phase still names the work; the probe's share is only added to the cause",
       [](OutlierStats& o) {
         o.d2h_mb_per_stall = 201.3;
         o.phase = "eval";
         o.phase_share = 0.9;
       },
       {"in the phase 'eval'"},
       {"evaluate less often"}},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.what);
    row.change(o);
    const auto a = advise_stall(s, o);
    ASSERT_TRUE(a.has_value());
    for (const std::string& part : row.in_cause) {
      EXPECT_NE(a->cause.find(part), std::string::npos) << a->cause;
    }
    for (const std::string& part : row.in_action) {
      EXPECT_NE(a->action.find(part), std::string::npos) << a->action;
    }
  }
}

TEST(PeriodicStallTest, RunJournalFailuresGiveYoungsCheckpointInterval) {
  EpochSummary s = hundred_steps_in_a_second();
  OutlierStats o = five_periodic_stalls();
  o.phase = "checkpoint";
  o.phase_share = 0.9;
  // No journal, or one without failures: no interval.
  auto a = advise_stall(s, o);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->action.find("Young"), std::string::npos) << a->action;
  RunJournalStats j;
  j.runs = 3;
  j.failures = 2;
  j.wall_s = 1200;
  j.mtbf_s = 600;
  s.sections.set(j);
  a = advise_periodic_stall(s, AdvisorsConfig{});
  ASSERT_TRUE(a.has_value());
  // sqrt(2 x 0.03 s x 600 s) = 6 s = 750 steps of 8 ms.
  EXPECT_NE(a->action.find("Young's interval sqrt(2 x cost x MTBF) = 6 s, about every 750 steps "
                           "against every 20 now)"),
            std::string::npos)
      << a->action;
  // Already rarer than that: not to be checkpointed less often.
  o.period = 1000;
  a = advise_stall(s, o);
  ASSERT_TRUE(a.has_value());
  EXPECT_NE(a->action.find("against every 1000 now: no less often)"), std::string::npos)
      << a->action;
}

}  // namespace
}  // namespace torchpilot
