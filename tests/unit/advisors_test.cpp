// The data-starvation advisor: planted starvation, healthy runs, thresholds, and each cause branch.
#include "torchpilot/advisors/core/advisors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <regex>
#include <string>

#include "advice_test_util.h"
#include "torchpilot/advisors/core/gain_models.h"
#include "torchpilot/runtime/core/metrics.h"

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1000 * 1000;

// An epoch of `steps` steps of `step_ms` each, waiting `wait_ms` of them for data.
EpochSummary make_summary(int64_t steps, double step_ms, double wait_ms) {
  EpochSummary s;
  s.steps = steps;
  s.wall_ns = static_cast<Nanos>(std::llround(steps * step_ms * kMs));
  s.data_wait_ns = static_cast<Nanos>(std::llround(steps * wait_ms * kMs));
  s.data_wait_fraction = fraction(s.data_wait_ns, s.wall_ns);
  s.samples = steps * 32;
  return s;
}

// Loader counters of an epoch: `produced` batches at `batch_ms` each, `cpu_share` of it on the CPU.
LoaderStats make_loader(int workers, double batch_ms, int max_workers = 8, int produced = 100,
                        double cpu_share = 1.0) {
  LoaderStats l;
  l.name = "tunable";
  l.tunable = true;
  l.settings.workers = workers;
  l.settings.prefetch = 2;
  l.max_workers = max_workers;
  l.batches = produced;
  l.produce_count = produced;
  l.produce_ns = static_cast<Nanos>(std::llround(produced * batch_ms * kMs));
  l.produce_cpu_ns = static_cast<Nanos>(std::llround(cpu_share * l.produce_ns));
  return l;
}

using test::contains;
using test::evidence;

const AdvisorsConfig kConfig;  // defaults: data_starvation threshold 0.05, high severity 0.25

TEST(DataStarvationTest, PlantedStarvationIsHighSeverityWithNumbers) {
  const EpochSummary s = make_summary(100, 100.0, 60.0);
  const std::optional<Advice> a = advise_data_starvation(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->id, "data_starvation");
  EXPECT_EQ(a->severity, Severity::kHigh);
  EXPECT_NEAR(*evidence(*a, "data_wait_fraction"), 0.6, 1e-12);
  EXPECT_NEAR(*evidence(*a, "data_wait_per_step"), 60.0, 1e-9);
  EXPECT_NEAR(*evidence(*a, "step_time"), 100.0, 1e-9);
  EXPECT_DOUBLE_EQ(*evidence(*a, "threshold"), 0.05);
  // No loader counters: removing the wait turns a 100 ms step into a 40 ms one, +150%.
  EXPECT_NEAR(a->expected_gain, 0.6 / 0.4, 1e-9);
  EXPECT_TRUE(a->gain_estimated);
  EXPECT_TRUE(contains(a->finding, "60.0%")) << a->finding;
  EXPECT_TRUE(contains(a->cause, "not visible")) << a->cause;
  EXPECT_TRUE(contains(a->action, "worker")) << a->action;
}

TEST(DataStarvationTest, ModerateStarvationIsAWarning) {
  const std::optional<Advice> a = advise_data_starvation(make_summary(50, 80.0, 8.0), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->severity, Severity::kWarning);
  EXPECT_NEAR(*evidence(*a, "data_wait_fraction"), 0.1, 1e-12);
  EXPECT_NEAR(a->expected_gain, 0.1 / 0.9, 1e-9);
}

TEST(DataStarvationTest, HealthyRunGivesNothing) {
  EXPECT_FALSE(advise_data_starvation(make_summary(100, 100.0, 2.0), kConfig).has_value());
  EXPECT_FALSE(advise_data_starvation(make_summary(100, 100.0, 0.0), kConfig).has_value());
  EXPECT_FALSE(advise_data_starvation(EpochSummary{}, kConfig).has_value());
  // Even a loader that looks bad (workers = 0) gives nothing when the wait is below threshold.
  EpochSummary s = make_summary(100, 100.0, 4.0);
  s.sections.set<LoaderStats>(make_loader(0, 3.0));
  EXPECT_FALSE(advise_data_starvation(s, kConfig).has_value());
}

TEST(DataStarvationTest, ThresholdEdges) {
  AdvisorsConfig config;
  config.data_starvation.threshold = 0.125;  // exactly representable
  config.data_starvation.high_severity = 0.5;
  EpochSummary s = make_summary(8, 100.0, 12.5);
  ASSERT_DOUBLE_EQ(s.data_wait_fraction, 0.125);
  EXPECT_FALSE(advise_data_starvation(s, config).has_value()) << "at the threshold: no advice";
  s = make_summary(8, 100.0, 12.6);
  std::optional<Advice> a = advise_data_starvation(s, config);
  ASSERT_TRUE(a.has_value()) << "just above the threshold";
  EXPECT_EQ(a->severity, Severity::kWarning);
  s = make_summary(8, 100.0, 50.0);
  a = advise_data_starvation(s, config);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->severity, Severity::kHigh) << "at high_severity: high";
  s = make_summary(8, 100.0, 49.9);
  EXPECT_EQ(advise_data_starvation(s, config)->severity, Severity::kWarning);
}

TEST(DataStarvationTest, ThresholdsComeFromTheConfig) {
  const EpochSummary s = make_summary(100, 100.0, 20.0);
  AdvisorsConfig strict;
  strict.data_starvation.threshold = 0.01;
  strict.data_starvation.high_severity = 0.1;
  EXPECT_EQ(advise_data_starvation(s, strict)->severity, Severity::kHigh);
  AdvisorsConfig lax;
  lax.data_starvation.threshold = 0.3;
  lax.data_starvation.high_severity = 0.5;
  EXPECT_FALSE(advise_data_starvation(s, lax).has_value());
}

// 100 steps of 100 ms with 60 ms of wait: the step computes for 40 ms.
EpochSummary starved_with(const LoaderStats& loader) {
  EpochSummary s = make_summary(100, 100.0, 60.0);
  s.sections.set<LoaderStats>(loader);
  return s;
}

TEST(DataStarvationTest, CauseWorkersZero) {
  const std::optional<Advice> a =
      advise_data_starvation(starved_with(make_loader(0, 30.0)), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_NEAR(*evidence(*a, "batch_produce_time"), 30.0, 1e-9);
  EXPECT_NEAR(*evidence(*a, "batch_produce_cpu_share"), 1.0, 1e-9);
  EXPECT_NEAR(*evidence(*a, "compute_time_per_step"), 40.0, 1e-9);
  EXPECT_EQ(*evidence(*a, "workers"), 0.0);
  EXPECT_EQ(*evidence(*a, "workers_needed_estimate"), 1.0);  // ceil(30 / 40)
  EXPECT_EQ(*evidence(*a, "cpus_available"), 8.0);
  EXPECT_TRUE(contains(a->cause, "workers = 0")) << a->cause;
  EXPECT_TRUE(contains(a->action, "load in 1 worker")) << a->action;
  EXPECT_FALSE(contains(a->action, "CPU-bound")) << a->action;
  EXPECT_NEAR(a->expected_gain, 1.5, 1e-9);
  EXPECT_FALSE(contains(a->cause, "pageable")) << "pinned memory unavailable: no pin hint";
}

TEST(DataStarvationTest, CauseWorkersZeroAndCpuBound) {
  // 400 ms of CPU per batch, 40 ms of compute: 10 workers needed, 8 CPUs.
  const std::optional<Advice> a =
      advise_data_starvation(starved_with(make_loader(0, 400.0)), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*evidence(*a, "workers_needed_estimate"), 10.0);
  EXPECT_TRUE(contains(a->cause, "workers = 0")) << a->cause;
  EXPECT_TRUE(contains(a->action, "load in 8 worker")) << a->action;  // no more than the CPUs
  EXPECT_TRUE(contains(a->action, "CPU-bound")) << a->action;
  // Seven cores (eight less the training thread's) deliver a batch every 400/7 ms at best: a
  // 100 ms step becomes 57.1 ms, +75%.
  EXPECT_EQ(*evidence(*a, "usable_workers"), 7.0);
  EXPECT_NEAR(*evidence(*a, "fastest_delivery_per_batch"), 400.0 / 7, 1e-9);
  EXPECT_NEAR(a->expected_gain, 100.0 / (400.0 / 7) - 1, 1e-9);
  EXPECT_TRUE(contains(a->action, "estimated: with 8 workers on at most 7 cores")) << a->action;
}

TEST(DataStarvationTest, GainIsForTheWorkersTheAdviceNames) {
  // Two workers that mostly wait (I/O): 200 ms a batch each, 10% of it on the CPU; the step
  // computes 40 ms and waits 60. Five workers are needed (200 / 40); the cores could deliver a
  // batch every 20 / 7 ms, but five workers deliver one every 40 ms: the step becomes 40 ms.
  const std::optional<Advice> a =
      advise_data_starvation(starved_with(make_loader(2, 200.0, 8, 100, 0.1)), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*evidence(*a, "workers_advised"), 5.0);
  EXPECT_EQ(*evidence(*a, "workers_estimated_for"), 5.0);
  EXPECT_NEAR(*evidence(*a, "fastest_delivery_per_batch"), 40.0, 1e-9);
  EXPECT_NEAR(a->expected_gain, 100.0 / 40 - 1, 1e-9);
  // Ten needed on eight CPUs while CPU-bound: eight advised, and seven cores bound the delivery.
  const std::optional<Advice> b =
      advise_data_starvation(starved_with(make_loader(2, 400.0, 8, 100, 1.0)), kConfig);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*evidence(*b, "workers_estimated_for"), 8.0);
  EXPECT_NEAR(*evidence(*b, "fastest_delivery_per_batch"), 400.0 / 7, 1e-9);
}

TEST(DataStarvationTest, AWarmUpStepDoesNotDiluteTheWaitBelowTheThreshold) {
  // 40 steps of 2.5 ms work and 1 ms of data wait, the first one 974 ms long (cuDNN's warm-up):
  // 3.4% of the epoch's wall time, 28.6% of a steady step.
  EpochSummary s = make_summary(40, (974.0 + 39 * 3.5) / 40, 1.0);
  EXPECT_LT(s.data_wait_fraction, 0.05);
  s.compute_p50_ns = static_cast<Nanos>(2.5 * kMs);
  const std::optional<Advice> a = advise_data_starvation(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_NEAR(*evidence(*a, "data_wait_share_of_steady_step"), 1.0 / 3.5, 1e-9);
  EXPECT_NEAR(*evidence(*a, "data_wait_fraction"), s.data_wait_fraction, 1e-12);
  EXPECT_TRUE(contains(a->finding, "28.6% of step time (1.00 ms of a 3.50 ms steady step"))
      << a->finding;
  // Without the median the epoch's share decides, as before.
  s.compute_p50_ns = 0;
  EXPECT_FALSE(advise_data_starvation(s, kConfig).has_value());
}

TEST(DataStarvationTest, StockWorkersAreToldToRunOneIntraOpThreadEach) {
  // The training thread and LibTorch's DataLoader workers each run their tensor ops on an
  // intra-op team: 4 advised workers and the training thread, 16 each, are 80 threads on 16 CPUs.
  LoaderStats l = make_loader(0, 160.0, 16);
  l.tunable = false;
  l.intra_op_threads = 16;
  std::optional<Advice> a = advise_data_starvation(starved_with(l), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(contains(a->action, "torch::set_num_threads(1) on the training thread before"))
      << a->action;
  EXPECT_TRUE(contains(a->action, "80 threads on 16 CPUs")) << a->action;
  EXPECT_EQ(*evidence(*a, "intra_op_threads"), 16.0);
  // One intra-op thread already, or torchpilot's own loader (its workers are its own): no clause.
  l.intra_op_threads = 1;
  a = advise_data_starvation(starved_with(l), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_FALSE(contains(a->action, "set_num_threads")) << a->action;
  l.intra_op_threads = 16;
  l.tunable = true;
  a = advise_data_starvation(starved_with(l), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_FALSE(contains(a->action, "set_num_threads")) << a->action;
}

TEST(DataStarvationTest, ABatchsCpuTimeIsAtMostItsWallTime) {
  // A stock loader's CPU time is the process's less the training thread's: other threads (intra-op
  // spinning, the driver's) can make it more than the workers' wall time. A batch is one
  // thread's work: 3.3x its wall time is read as its wall time, no more.
  LoaderStats l = make_loader(2, 40.0, 16, 100, 3.3);
  l.tunable = false;
  l.production_estimated = true;
  const auto g = gains::starvation_gain(starved_with(l), 2);
  ASSERT_TRUE(g);
  EXPECT_NEAR(g->batch_cpu_s, g->batch_s, 1e-12);
}

TEST(DataStarvationTest, GainFromTheMedianComputeAndTheMeanWait) {
  // One worker: a batch costs 8 ms of CPU, the step computes 2 ms and waits 6 ms; a 400 ms stall
  // (a trace window's end) inflates the mean to (9 x 8 + 400) / 10 = 47.2 ms. Median compute 2 ms,
  // mean wait 5.4 ms: a 7.4 ms step; 7 usable cores deliver a batch every 8/7 ms, so compute
  // bounds it: 7.4 / 2 - 1.
  EpochSummary s = make_summary(10, 47.2, 5.4);
  s.compute_p50_ns = 2 * kMs;
  s.sections.set<LoaderStats>(make_loader(1, 8.0));
  const std::optional<Advice> a = advise_data_starvation(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_NEAR(*evidence(*a, "predicted_step_time"), 2.0, 1e-9);
  EXPECT_NEAR(*evidence(*a, "steady_step_time"), 7.4, 1e-9);
  EXPECT_NEAR(a->expected_gain, 7.4 / 2 - 1, 1e-9);
  EXPECT_TRUE(contains(a->action, "a 7.40 ms step")) << a->action;
  // The workers are sized from the median too: one worker delivers a batch every 8 ms while the
  // step computes 2 ms, so four are needed (the mean, 41.8 ms, would say one is enough).
  EXPECT_NEAR(*evidence(*a, "compute_time_per_step"), 2.0, 1e-9);
  EXPECT_EQ(*evidence(*a, "workers_needed_estimate"), 4.0);
  EXPECT_EQ(*evidence(*a, "workers_advised"), 4.0);
  EXPECT_TRUE(contains(a->cause, "too few workers")) << a->cause;
  EXPECT_TRUE(contains(a->action, "about 4 workers")) << a->action;
  // Without the median, the mean step less the mean wait (41.8 ms) hides the starvation.
  s.compute_p50_ns = 0;
  EXPECT_LT(advise_data_starvation(s, kConfig)->expected_gain, 0.2);
}

TEST(DataStarvationTest, CauseTooFewWorkers) {
  const std::optional<Advice> a =
      advise_data_starvation(starved_with(make_loader(2, 200.0)), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_NEAR(*evidence(*a, "batch_produce_time"), 200.0, 1e-9);
  EXPECT_EQ(*evidence(*a, "workers"), 2.0);
  EXPECT_EQ(*evidence(*a, "workers_needed_estimate"), 5.0);  // ceil(200 / 40)
  EXPECT_TRUE(contains(a->cause, "too few workers")) << a->cause;
  EXPECT_TRUE(contains(a->action, "about 5 workers")) << a->action;
  EXPECT_FALSE(contains(a->action, "more workers than CPUs")) << a->action;
  EXPECT_NEAR(a->expected_gain, 1.5, 1e-9);
}

TEST(DataStarvationTest, CauseTooFewWorkersWhenLoadingWaits) {
  // I/O-bound: 10% of production on the CPU, so more workers than CPUs help.
  const std::optional<Advice> a =
      advise_data_starvation(starved_with(make_loader(4, 400.0, 8, 100, 0.1)), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_NEAR(*evidence(*a, "batch_produce_cpu_share"), 0.1, 1e-9);
  EXPECT_EQ(*evidence(*a, "workers_needed_estimate"), 10.0);
  EXPECT_TRUE(contains(a->cause, "too few workers")) << a->cause;
  EXPECT_FALSE(contains(a->cause, "CPU-bound")) << a->cause;
  EXPECT_TRUE(contains(a->action, "about 10 workers")) << a->action;
  EXPECT_TRUE(contains(a->action, "more workers than CPUs")) << a->action;
  EXPECT_NEAR(a->expected_gain, 1.5, 1e-9);  // not limited by the CPUs
}

TEST(DataStarvationTest, CauseCpuBound) {
  const std::optional<Advice> a =
      advise_data_starvation(starved_with(make_loader(4, 400.0, 8)), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*evidence(*a, "workers_needed_estimate"), 10.0);  // ceil(400 / 40) > 8 CPUs
  EXPECT_EQ(*evidence(*a, "cpus_available"), 8.0);
  EXPECT_TRUE(contains(a->cause, "CPU-bound")) << a->cause;
  EXPECT_TRUE(contains(a->action, "use 8 workers")) << a->action;
  // Seven usable cores deliver a batch every 57.1 ms: a 100 ms step becomes 57.1 ms, +75% (not
  // the +150% that removing the whole wait would give).
  EXPECT_NEAR(a->expected_gain, 100.0 / (400.0 / 7) - 1, 1e-9);
}

TEST(DataStarvationTest, CpuBoundWithUnknownCpuCountCountsOne) {
  const std::optional<Advice> a =
      advise_data_starvation(starved_with(make_loader(1, 90.0, 0)), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*evidence(*a, "cpus_available"), 1.0);
  EXPECT_TRUE(contains(a->cause, "CPU-bound")) << a->cause;  // ceil(90 / 40) = 3 > 1
  EXPECT_NEAR(a->expected_gain, 100.0 / 90.0 - 1.0, 1e-9);
}

TEST(DataStarvationTest, CausePrefetchShallow) {
  const std::optional<Advice> a =
      advise_data_starvation(starved_with(make_loader(4, 100.0)), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*evidence(*a, "workers_needed_estimate"), 3.0);  // ceil(100 / 40) <= 4 workers
  EXPECT_EQ(*evidence(*a, "workers"), 4.0);
  EXPECT_TRUE(contains(a->cause, "prefetch 2")) << a->cause;
  EXPECT_TRUE(contains(a->action, "prefetch deeper (e.g. 4")) << a->action;
}

TEST(DataStarvationTest, PinHintOnlyWhenAvailableAndOff) {
  LoaderStats l = make_loader(4, 100.0);
  l.pin_memory_available = true;
  std::optional<Advice> a = advise_data_starvation(starved_with(l), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(contains(a->cause, "pageable")) << a->cause;
  EXPECT_TRUE(contains(a->action, "pin memory")) << a->action;

  l.settings.pin_memory = true;  // already pinned
  a = advise_data_starvation(starved_with(l), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_FALSE(contains(a->action, "pin memory")) << a->action;

  l.settings.pin_memory = false;
  l.pin_memory_available = false;  // cannot pin
  a = advise_data_starvation(starved_with(l), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_FALSE(contains(a->action, "pin memory")) << a->action;
}

TEST(DataStarvationTest, WatchedLoaderWithoutCountersIsNotVisible) {
  LoaderStats l = make_loader(2, 50.0, 8, 0);  // no batches produced as far as it knows
  l.tunable = false;
  const std::optional<Advice> a = advise_data_starvation(starved_with(l), kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(contains(a->cause, "not visible")) << a->cause;
  EXPECT_FALSE(evidence(*a, "batch_produce_time").has_value());
}

TEST(DataStarvationTest, TuneHintDependsOnLoaderKind) {
  LoaderStats l = make_loader(2, 200.0);
  std::optional<Advice> a = advise_data_starvation(starved_with(l), kConfig);
  EXPECT_TRUE(contains(a->action, "mode: autotune picks this")) << a->action;
  EXPECT_FALSE(contains(a->action, "TunableLoader")) << a->action;
  l.tunable = false;
  a = advise_data_starvation(starved_with(l), kConfig);
  EXPECT_TRUE(contains(a->action, "TunableLoader")) << a->action;
}

TEST(RunAdvisorsTest, HealthyVersusStarved) {
  Config config;
  EXPECT_TRUE(run_advisors(make_summary(200, 50.0, 0.5), config).empty());
  const std::vector<Advice> advice = run_advisors(make_summary(200, 50.0, 30.0), config);
  ASSERT_EQ(advice.size(), 1u);
  EXPECT_EQ(advice[0].id, "data_starvation");
  EXPECT_EQ(advice[0].severity, Severity::kHigh);
  EXPECT_NEAR(*evidence(advice[0], "data_wait_fraction"), 0.6, 1e-12);
  // The thresholds come from config.advisors.data_starvation.
  config.advisors.data_starvation.threshold = 0.7;
  config.advisors.data_starvation.high_severity = 0.8;
  EXPECT_TRUE(run_advisors(make_summary(200, 50.0, 30.0), config).empty());
}

TEST(SeverityTest, Names) {
  EXPECT_STREQ(to_string(Severity::kInfo), "info");
  EXPECT_STREQ(to_string(Severity::kWarning), "warning");
  EXPECT_STREQ(to_string(Severity::kHigh), "high");
}

// Steps that are all waiting (or a wait measured past the step): no overflowing worker count, no
// absurd gain.
TEST(DataStarvationTest, AllWaitingStepsGiveBoundedAdvice) {
  AdvisorsConfig config;
  for (double wait : {10.0, 12.0}) {
    EpochSummary s = make_summary(10, 10.0, wait);
    s.sections.set<LoaderStats>(make_loader(0, 5000.0, 8));  // five seconds a batch
    auto a = advise_data_starvation(s, config);
    ASSERT_TRUE(a.has_value());
    EXPECT_EQ(a->expected_gain, 0.0) << "unknown compute time: no gain is claimed";
    const double needed = evidence(*a, "workers_needed_estimate").value();
    EXPECT_GE(needed, 1.0);
    EXPECT_LE(needed, 8.0);  // all the CPUs, not an overflowed int
    EXPECT_FALSE(std::regex_search(a->action, std::regex("-[0-9]"))) << a->action;
  }
}

}  // namespace
}  // namespace torchpilot
