// The loader's worker model (runtime/loader/loader_model.h), shared by the data_starvation advice
// and the loader's tuning policy, and the stock loader meter (stock_loader_meter.h) that gives a
// watched LibTorch DataLoader the production figures the model needs.
#include "torchpilot/runtime/loader/loader_model.h"

#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include "advice_test_util.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/loader/loader_policy.h"
#include "torchpilot/runtime/loader/stock_loader_meter.h"

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1000 * 1000;
using test::contains;
using test::evidence;

Nanos thread_cpu() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<Nanos>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Runs on the CPU until this thread has used `ns` of CPU time.
void spin_cpu(Nanos ns) {
  const Nanos end = thread_cpu() + ns;
  volatile double x = 1;
  while (thread_cpu() < end) x = x * 1.0000001 + 1e-9;
}

// An epoch of 100 steps of 100 ms, 60 ms of it waiting for data (40 ms of compute).
EpochSummary starved(const LoaderStats& l) {
  EpochSummary s;
  s.steps = 100;
  s.wall_ns = 100 * 100 * kMs;
  s.data_wait_ns = 100 * 60 * kMs;
  s.data_wait_fraction = fraction(s.data_wait_ns, s.wall_ns);
  s.samples = 100;
  s.sections.set<LoaderStats>(l);
  return s;
}

// A watched stock loader's counters: `workers` workers, `batch_ms` per batch per worker, of which
// `cpu_share` on the CPU (as stock_loader_meter.h fills them).
LoaderStats stock(int workers, double batch_ms, double cpu_share, int cpus) {
  LoaderStats l;
  l.name = "watched";
  l.tunable = false;
  l.settings.workers = workers;
  l.settings.prefetch = 2;
  l.max_jobs = 2 * workers;
  l.max_workers = cpus;
  l.batches = l.produce_count = 100;
  l.produce_ns = static_cast<Nanos>(100 * batch_ms * kMs);
  l.produce_cpu_ns = static_cast<Nanos>(cpu_share * static_cast<double>(l.produce_ns));
  l.production_estimated = workers > 0;
  return l;
}

TEST(LoaderModelTest, WorkersFromTheRatioBoundedByTheCpusOnlyWhenCpuBound) {
  WorkerEstimate e = estimate_workers(4.2, 0.9, 8);
  EXPECT_EQ(e.needed, 5);
  EXPECT_EQ(e.useful, 5);
  EXPECT_TRUE(e.cpu_bound);
  e = estimate_workers(12.0, 0.9, 8);  // CPU-bound: no more than the CPUs
  EXPECT_EQ(e.needed, 12);
  EXPECT_EQ(e.useful, 8);
  e = estimate_workers(12.0, 0.2, 8);  // the workers mostly wait: more than the CPUs
  EXPECT_EQ(e.useful, 12);
  EXPECT_FALSE(e.cpu_bound);
  e = estimate_workers(12.0, kNotMeasured, 8);  // unknown share: not called CPU-bound
  EXPECT_EQ(e.useful, 12);
  EXPECT_EQ(estimate_workers(0.3, 1.0, 8).needed, 1);
  EXPECT_EQ(estimate_workers(std::nan(""), 1.0, 8).needed, 1);
  EXPECT_EQ(estimate_workers(1e30, 0.1, 8).needed, kLoaderMaxWorkersEstimate);
}

// One model: the worker count the advice names is the first the tuning policy tries. The same
// loader in both forms: 2 workers at 200 ms a batch each, a step that computes 40 ms and waits
// 60 ms (10 steps/s, 60% waiting); a batch a step. The advice: ceil(200 / 40) = 5 workers. The
// tuner's baseline trial: its consumer rate 10 / 0.4 = 25 steps/s, its workers' capacity
// 2 / 0.2 s = 10 batches/s, so 25 x 2 / 10 = 5 workers.
TEST(LoaderModelTest, TheAdviceAndTheTunerNameTheSameWorkerCount) {
  LoaderStats l = stock(2, 200.0, 1.0, 8);
  l.name = "tunable";
  l.tunable = true;
  l.production_estimated = false;
  const auto advice = advise_data_starvation(starved(l), AdvisorsConfig{});
  ASSERT_TRUE(advice.has_value());
  const double advised = evidence(*advice, "workers_advised").value();
  EXPECT_EQ(advised, 5.0);
  EXPECT_TRUE(contains(advice->action, "starting from this count")) << advice->action;

  AutotuneConfig config;
  const auto policy = make_loader_policy(config);
  KnobRegistry knobs;
  Knob workers{"loader.workers", {}, [] { return int64_t{2}; }, [](int64_t) {}};
  for (int w = 0; w <= 8; ++w) workers.domain.push_back(w);
  knobs.add(std::move(workers));
  TrialResult base;
  base.setting = {{"loader.workers", 2}};
  base.throughput = base.demand = 10;
  base.unit = "steps/s";
  base.data_wait_fraction = 0.6;
  base.supply_capacity = 10;
  const auto first = policy->propose({base}, 0, knobs);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->at("loader.workers"), static_cast<int64_t>(advised))
      << "the search starts where the advice points (it doubled to 4 before)";
}

// Without production figures (no capacity measured, or no wait) the search doubles as before.
TEST(LoaderModelTest, WithoutFiguresTheSearchDoubles) {
  AutotuneConfig config;
  const auto policy = make_loader_policy(config);
  KnobRegistry knobs;
  Knob workers{"loader.workers", {}, [] { return int64_t{2}; }, [](int64_t) {}};
  for (int w = 0; w <= 8; ++w) workers.domain.push_back(w);
  knobs.add(std::move(workers));
  TrialResult base;
  base.setting = {{"loader.workers", 2}};
  base.throughput = base.demand = 10;
  base.data_wait_fraction = 0.6;
  const auto first = policy->propose({base}, 0, knobs);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->at("loader.workers"), 4);
}

// Issue: a stock loader with workers 0 and CPU-heavy samples was told +9,373% (the whole wait
// removed) where 12 workers measured 11x. Its production measured on the training thread bounds
// the gain by the cores: 16 CPUs, 15 of them producing 256 ms of CPU a batch deliver one every
// 17.1 ms; a 2.7 ms step that waits 256 ms becomes 17.1 ms: +1,416%, not +9,373%.
TEST(LoaderModelTest, StockLoaderWithWorkersZeroIsBoundedByTheCores) {
  EpochSummary s;
  s.steps = 100;
  s.wall_ns = static_cast<Nanos>(100 * 258.7 * kMs);
  s.data_wait_ns = 100 * 256 * kMs;
  s.data_wait_fraction = fraction(s.data_wait_ns, s.wall_ns);
  s.compute_p50_ns = static_cast<Nanos>(2.7 * kMs);
  s.sections.set<LoaderStats>(stock(0, 256.0, 1.0, 16));
  const auto a = advise_data_starvation(s, AdvisorsConfig{});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*evidence(*a, "usable_workers"), 15.0);
  EXPECT_NEAR(a->expected_gain, 258.7 / (256.0 / 15) - 1, 1e-9);
  EXPECT_LT(a->expected_gain, 20.0);
  EXPECT_TRUE(contains(a->action, "DataLoaderOptions().workers(16)")) << a->action;
}

// Issue: an I/O-bound stock loader (its workers sleep) on 2 CPUs was told "the workers already
// use the CPUs (2): make batches cheaper", where 6 workers went from 464 to 900 samples/s. Its
// workers' CPU share (10%) says they wait: more workers than CPUs, with a gain the cores bound.
TEST(LoaderModelTest, IoBoundStockLoaderIsToldToAddWorkers) {
  const auto a = advise_data_starvation(starved(stock(2, 200.0, 0.1, 2)), AdvisorsConfig{});
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(contains(a->cause, "too few workers")) << a->cause;
  EXPECT_TRUE(contains(a->cause, "about 200.00 ms")) << a->cause;
  EXPECT_TRUE(contains(a->cause, "at most 10% of it on the CPU")) << a->cause;
  EXPECT_TRUE(contains(a->action, "use about 5 workers (DataLoaderOptions().workers(5))"))
      << a->action;
  EXPECT_TRUE(contains(a->action, "more workers than CPUs can help")) << a->action;
  EXPECT_FALSE(contains(a->action, "already use the CPUs")) << a->action;
  // One usable core at 20 ms of CPU a batch is no bound on a 40 ms step: the wait goes.
  EXPECT_NEAR(a->expected_gain, 100.0 / 40.0 - 1, 1e-9);
  // The same loader CPU-bound: the CPUs bound the workers and the gain.
  const auto b = advise_data_starvation(starved(stock(2, 200.0, 0.9, 2)), AdvisorsConfig{});
  ASSERT_TRUE(b.has_value());
  EXPECT_TRUE(contains(b->cause, "CPU-bound")) << b->cause;
  // 180 ms of CPU a batch on the one core left beside the training thread: no faster than now.
  EXPECT_EQ(b->expected_gain, 0.0);
}

TEST(StockLoaderMeterTest, WorkersZeroMeasuresTheFetchOnTheTrainingThread) {
  StockLoaderMeter meter(0);
  const Nanos cpu = meter.fetch_begin();
  spin_cpu(20 * kMs);
  meter.fetch_end(cpu, 25 * kMs);
  LoaderStats s;
  meter.fill(s, 0, 1, 0);
  EXPECT_EQ(s.produce_count, 1);
  EXPECT_EQ(s.produce_ns, 25 * kMs);
  EXPECT_GE(s.produce_cpu_ns, 20 * kMs);
  EXPECT_LT(s.produce_cpu_ns, 2000 * kMs);
  EXPECT_FALSE(s.production_estimated);
}

// Workers' CPU time is the process's less the training thread's: a worker that computes counts,
// one that sleeps does not, and the training thread's own work never does.
TEST(StockLoaderMeterTest, WorkersCpuTimeIsTheProcessLessTheTrainingThread) {
  StockLoaderMeter meter(0);
  spin_cpu(30 * kMs);  // the training thread's own work
  std::thread sleeper([] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
  sleeper.join();
  LoaderStats idle;
  meter.fill(idle, 2, 10, 100 * kMs);
  EXPECT_TRUE(idle.production_estimated);
  EXPECT_EQ(idle.produce_count, 10);
  EXPECT_EQ(idle.produce_ns, 2 * 100 * kMs);  // two workers' elapsed time
  EXPECT_LT(idle.produce_cpu_ns, 20 * kMs) << "a sleeping worker and the training thread's work";
  std::thread worker([] { spin_cpu(40 * kMs); });
  worker.join();
  LoaderStats busy;
  meter.fill(busy, 2, 10, 100 * kMs);
  EXPECT_GE(busy.produce_cpu_ns - idle.produce_cpu_ns, 40 * kMs);
}

}  // namespace
}  // namespace torchpilot
