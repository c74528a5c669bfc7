// Integration tests of the loaders with real LibTorch datasets (CPU).
#include <gtest/gtest.h>
#include <time.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "fakes/gate.h"
#include "fakes/torch_loader_parts.h"
#include "torchpilot/runtime/reports/sinks.h"
#include "torchpilot/torchpilot.h"

namespace {

using torchpilot::LoaderOptions;
using torchpilot::TunableLoader;

using torchpilot::test::stacked;
using torchpilot::test::Stacked;

using torchpilot::test::quiet_config;
using torchpilot::test::recording_into;

void count(const torch::Tensor& targets, std::vector<int>& seen) {
  auto t = targets.contiguous();
  for (int64_t k = 0; k < t.size(0); ++k) ++seen.at(static_cast<size_t>(t[k].item<int64_t>()));
}

TEST(TunableLoader, ExactlyOnceUnderRandomLiveRetunes) {
  constexpr size_t kSize = 997;  // prime: the last batch is short
  LoaderOptions options;
  options.batch_size = 7;
  options.workers = 2;
  TunableLoader<Stacked> loader(stacked(kSize), options);
  std::mt19937 rng(42);
  int retunes = 0;
  for (int epoch = 0; epoch < 4; ++epoch) {
    std::vector<int> seen(kSize, 0);
    size_t batches = 0;
    for (auto& batch : loader) {
      ASSERT_EQ(batch.data.size(0), batch.target.size(0));
      count(batch.target, seen);
      ++batches;
      // Retune at most batch boundaries: workers, prefetch, pinning and GPU prefetch.
      if (rng() % 4 != 0) {
        loader.set_workers(static_cast<int>(rng() % 7));
        loader.set_prefetch(1 + static_cast<int>(rng() % 8));
        loader.set_pin_memory(rng() % 2 == 0);
        loader.set_device_prefetch(rng() % 3 == 0);
        ++retunes;
      }
    }
    EXPECT_EQ(batches, (kSize + 6) / 7);
    for (size_t i = 0; i < kSize; ++i)
      ASSERT_EQ(seen[i], 1) << "sample " << i << " epoch " << epoch;
  }
  EXPECT_GT(retunes, 300);
}

TEST(TunableLoader, EpochOrderIsShuffledAndReproducible) {
  LoaderOptions options;
  options.batch_size = 10;
  options.workers = 3;
  options.seed = 7;
  TunableLoader<Stacked> a(stacked(100), options), b(stacked(100), options);
  std::vector<int64_t> first, second;
  for (auto& batch : a) {
    for (int64_t k = 0; k < batch.target.size(0); ++k)
      first.push_back(batch.target[k].item<int64_t>());
  }
  for (auto& batch : b) {
    for (int64_t k = 0; k < batch.target.size(0); ++k)
      second.push_back(batch.target[k].item<int64_t>());
  }
  EXPECT_EQ(first, second);
  std::vector<int64_t> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(first, sorted);  // shuffled
}

TEST(TunableLoader, DatasetExceptionNamesTheSampleAndTheEpochGoesOn) {
  for (int workers : {0, 3}) {
    LoaderOptions options;
    options.batch_size = 8;
    options.workers = workers;
    TunableLoader<Stacked> loader(stacked(200, /*throw_on=*/123), options);
    loader.start_epoch();
    std::vector<int> seen(200, 0);
    int errors = 0;
    while (true) {
      try {
        auto batch = loader.next();
        if (!batch) break;
        count(batch->target, seen);
      } catch (const torchpilot::DataLoaderError& e) {
        ++errors;
        ASSERT_TRUE(e.sample_index().has_value());
        EXPECT_EQ(*e.sample_index(), 123u);
        EXPECT_NE(std::string(e.what()).find("sample 123"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("corrupt sample"), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(errors, 1) << "workers " << workers;
    // Everything but the failing sample arrived once (its batch-mates in a smaller batch).
    EXPECT_EQ(seen[123], 0);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 200 - 1);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 0), 1);
  }
}

TEST(TunableLoader, ExceptionLeavesARangeForLoop) {
  LoaderOptions options;
  options.batch_size = 4;
  options.workers = 2;
  options.shuffle = false;
  TunableLoader<Stacked> loader(stacked(40, /*throw_on=*/17), options);
  size_t batches = 0;
  try {
    for (auto& batch : loader) {
      (void)batch;
      ++batches;
    }
    FAIL() << "no exception";
  } catch (const torchpilot::DataLoaderError& e) {
    EXPECT_EQ(e.batch_index(), 4u);  // unshuffled: samples 16..19
    EXPECT_EQ(e.sample_index().value(), 17u);
  }
  EXPECT_EQ(batches, 4u);
  // A new epoch starts cleanly after the abandoned one.
  size_t again = 0;
  try {
    for (auto& batch : loader) {
      (void)batch;
      ++again;
    }
  } catch (const torchpilot::DataLoaderError&) {
  }
  EXPECT_EQ(again, 4u);
}

TEST(TunableLoader, DestroyedMidEpochWithBusyWorkersJoinsCleanly) {
  for (int round = 0; round < 3; ++round) {
    LoaderOptions options;
    options.batch_size = 4;
    options.workers = 4;
    options.prefetch = 4;
    auto loader = std::make_unique<TunableLoader<Stacked>>(stacked(400, -1, 2000), options);
    loader->start_epoch();
    ASSERT_TRUE(loader->next().has_value());
    ASSERT_TRUE(loader->next().has_value());
    loader->set_workers(6);
    loader.reset();  // workers are mid-batch: must finish and join, not hang or crash
  }
  SUCCEED();
}

// Sample i is [i], but every get() waits for the gate to open (a dataset blocked for good).
using torchpilot::test::Gate;
class GatedDataset : public torch::data::datasets::Dataset<GatedDataset> {
 public:
  GatedDataset(size_t size, std::shared_ptr<Gate> gate) : values_(size), gate_(std::move(gate)) {
    for (size_t i = 0; i < size; ++i) values_[i] = static_cast<int64_t>(i);
  }
  torch::data::Example<> get(size_t i) override {
    gate_->enter();
    // Reads this dataset copy after the wait: it must still exist when the loader is long gone.
    const int64_t v = values_.at(i);
    gate_->leave();
    return {torch::full({1}, static_cast<float>(v)), torch::tensor(v)};
  }
  torch::optional<size_t> size() const override { return values_.size(); }

 private:
  std::vector<int64_t> values_;
  std::shared_ptr<Gate> gate_;
};

TEST(TunableLoader, DestroyedWhileTheDatasetBlocksReturnsAndAbandonsTheCall) {
  auto gate = std::make_shared<Gate>();
  using torchpilot::test::within_ten_seconds;
  torchpilot::Pilot pilot(quiet_config(torchpilot::Mode::kAdvise));
  LoaderOptions options;
  options.batch_size = 1;
  options.workers = 2;
  options.shutdown_timeout_ms = 200;
  using Gated = decltype(GatedDataset(1, gate).map(torch::data::transforms::Stack<>()));
  auto loader = std::make_unique<TunableLoader<Gated>>(
      GatedDataset(50, gate).map(torch::data::transforms::Stack<>()), options);
  loader->attach(pilot);  // the abandonment warning goes to the Pilot's log
  loader->start_epoch();
  ASSERT_TRUE(within_ten_seconds([&] { return gate->entered.load() == 2; }));

  ASSERT_TRUE(gate->destroyed_in_time([&] { loader.reset(); }))
      << "destroying the loader hung on a blocked dataset call";

  // The abandoned calls finish on their datasets, which the loader's destruction did not free.
  gate->open();
  ASSERT_TRUE(within_ten_seconds([&] { return gate->left.load() == 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(gate->entered.load(), 2);
}

TEST(TunableLoader, ReportsWaitsToThePilotAndEndsItsEpochs) {
  auto recording = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::Pilot pilot(quiet_config(torchpilot::Mode::kAdvise), recording_into(recording));
  LoaderOptions options;
  options.batch_size = 5;
  TunableLoader<Stacked> loader(stacked(50, -1, 300), options);  // workers 0: starved
  loader.attach(pilot);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (auto& batch : loader) {
      auto step = pilot.step(batch.data.size(0));
    }
  }
  ASSERT_EQ(recording->epochs.size(), 2u);
  const auto& e = recording->epochs[0];
  EXPECT_EQ(e.steps, 10);
  EXPECT_EQ(e.samples, 50);
  ASSERT_TRUE((e.sections.get<torchpilot::LoaderStats>() != nullptr));
  EXPECT_EQ(e.sections.get<torchpilot::LoaderStats>()->batches, 10);
  EXPECT_EQ(e.sections.get<torchpilot::LoaderStats>()->settings.workers, 0);
  EXPECT_GT(e.data_wait_fraction, 0.5);  // nothing but loading happens in these steps
  ASSERT_FALSE(recording->advice[0].empty());
  EXPECT_EQ(recording->advice[0][0].id, "data_starvation");
  EXPECT_NE(recording->advice[0][0].cause.find("workers = 0"), std::string::npos)
      << recording->advice[0][0].cause;
}

TEST(TunableLoader, AutotuneAddsWorkersForASlowDataset) {
  torchpilot::Config config = quiet_config(torchpilot::Mode::kAutotune);
  // Windows long enough that a loaded CI machine (ctest -j2) cannot flip the ranking: 5-step
  // windows once measured 2 workers no faster than none there.
  config.autotune.warmup_steps = 240;
  config.autotune.settle_steps = 4;
  config.autotune.measure_steps = 14;
  config.autotune.max_workers = 4;
  config.autotune.warmup_seconds = 0;  // budget and windows in steps only
  config.autotune.min_window_ms = 0;
  auto recording = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::Pilot pilot(config, recording_into(recording));
  LoaderOptions options;
  options.batch_size = 4;
  // Sleeping samples: parallel workers help even on a machine with few cores.
  TunableLoader<Stacked> loader(stacked(64, -1, 1500), options);
  loader.attach(pilot);
  int steps = 0;
  while (!pilot.tuning_finished() && steps < 600) {
    for (auto& batch : loader) {
      auto step = pilot.step(batch.data.size(0));
      if (++steps >= 600 || pilot.tuning_finished()) break;
    }
  }
  ASSERT_TRUE(pilot.tuning_finished());
  ASSERT_EQ(recording->decisions.size(), 1u);
  const auto& d = recording->decisions[0];
  std::string trials;
  for (const auto& t : d.trials) trials += torchpilot::format_trial(t, false) + "\n";
  SCOPED_TRACE(trials);
  EXPECT_EQ(d.baseline.at("loader.workers"), 0);
  EXPECT_GE(d.chosen.at("loader.workers"), 2);
  EXPECT_GT(d.chosen_throughput, d.baseline_throughput * 1.5);
  EXPECT_LE(d.steps_used, config.autotune.warmup_steps);
  EXPECT_EQ(loader.settings().workers, d.chosen.at("loader.workers"));  // applied
}

// A dataset whose samples cost CPU time (a decode): each spins until its thread has used
// `cpu_us` of CPU.
class CpuHeavyDataset : public torch::data::datasets::Dataset<CpuHeavyDataset> {
 public:
  explicit CpuHeavyDataset(size_t size, int cpu_us) : size_(size), cpu_us_(cpu_us) {}
  torch::data::Example<> get(size_t index) override {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    const int64_t end = ts.tv_sec * 1000000000LL + ts.tv_nsec + cpu_us_ * 1000LL;
    volatile double x = 1;
    for (;;) {
      for (int i = 0; i < 1000; ++i) x = x * 1.0000001 + 1e-9;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      if (ts.tv_sec * 1000000000LL + ts.tv_nsec >= end) break;
    }
    return {torch::full({1}, static_cast<int64_t>(index)),
            torch::tensor(static_cast<int64_t>(index))};
  }
  torch::optional<size_t> size() const override { return size_; }

 private:
  size_t size_;
  int cpu_us_;
};

// Issue 40: a stock loader with workers 0 and CPU-heavy samples was given the whole wait as its
// gain (+9,373%); its production is now measured on the training thread (the fetch's CPU time),
// so the gain is the one TunableLoader's figures give: bounded by the cores.
TEST(Watch, WorkersZeroProductionIsMeasuredAndTheGainBoundedByTheCores) {
  auto recording = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::Pilot pilot(quiet_config(torchpilot::Mode::kAdvise), recording_into(recording));
  // 4 samples of 2 ms of CPU: 8 ms a batch; the step takes 0.2 ms.
  auto loader = torch::data::make_data_loader(
      CpuHeavyDataset(60, 2000).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(4).workers(0));
  for (auto& batch : torchpilot::watch(*loader, pilot)) {
    auto step = pilot.step(batch.data.size(0));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ASSERT_EQ(recording->epochs.size(), 1u);
  const auto* l = recording->epochs[0].sections.get<torchpilot::LoaderStats>();
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->produce_count, 15);
  EXPECT_FALSE(l->production_estimated);
  EXPECT_GE(l->produce_cpu_ns, 15 * 8 * 1000000LL) << "each batch's CPU time, measured";
  EXPECT_GE(l->produce_ns, l->produce_cpu_ns - 15 * 1000000LL);
  const torchpilot::Advice* a = nullptr;
  for (const auto& x : recording->advice[0]) a = x.id == "data_starvation" ? &x : a;
  ASSERT_NE(a, nullptr);
  double cpu_per_batch = -1, usable = -1, delivery = -1;
  for (const auto& e : a->evidence) {
    if (e.name == "usable_workers") usable = e.value;
    if (e.name == "fastest_delivery_per_batch") delivery = e.value;
  }
  // A batch's CPU time is taken at most its wall time (the clocks differ by their reads: under
  // ASan the thread's CPU time of a fetch came out 0.6 us above its wall time).
  cpu_per_batch =
      static_cast<double>(std::min(l->produce_cpu_ns, l->produce_ns)) / 1e6 / l->produce_count;
  ASSERT_GT(usable, 0) << "the gain is bounded by the cores: " << a->action;
  EXPECT_NEAR(delivery, cpu_per_batch / usable, 1e-6);
  EXPECT_NE(a->action.find("DataLoaderOptions().workers("), std::string::npos) << a->action;
}

// Issue 40: an I/O-bound stock loader (its workers sleep) on a 2-core machine was told "the
// workers already use the CPUs (2): make batches cheaper"; 6 workers nearly doubled its rate.
// The workers' CPU time (the process's less the training thread's) says they wait.
TEST(Watch, SleepingWorkersAreToldToAddWorkersBeyondTheCpus) {
  auto recording = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::Pilot pilot(quiet_config(torchpilot::Mode::kAdvise), recording_into(recording));
  // 2 workers, 4 samples of 5 ms of sleep: 20 ms a batch per worker, a step of nothing.
  auto loader = torch::data::make_data_loader(
      stacked(80, -1, 5000), torch::data::DataLoaderOptions().batch_size(4).workers(2));
  for (auto& batch : torchpilot::watch(*loader, pilot)) {
    auto step = pilot.step(batch.data.size(0));
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  ASSERT_EQ(recording->epochs.size(), 1u);
  const auto* l = recording->epochs[0].sections.get<torchpilot::LoaderStats>();
  ASSERT_NE(l, nullptr);
  EXPECT_TRUE(l->production_estimated);
  EXPECT_EQ(l->produce_count, 20);
  EXPECT_LT(static_cast<double>(l->produce_cpu_ns) / static_cast<double>(l->produce_ns), 0.5);
  const torchpilot::Advice* a = nullptr;
  for (const auto& x : recording->advice[0]) a = x.id == "data_starvation" ? &x : a;
  ASSERT_NE(a, nullptr);
  EXPECT_NE(a->cause.find("too few workers"), std::string::npos) << a->cause;
  EXPECT_NE(a->action.find("more workers than CPUs can help"), std::string::npos) << a->action;
  EXPECT_EQ(a->action.find("already use the CPUs"), std::string::npos) << a->action;
  EXPECT_GT(a->expected_gain, 0.0);
}

TEST(Watch, MeasuresAStockDataLoader) {
  auto recording = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::Pilot pilot(quiet_config(torchpilot::Mode::kAdvise), recording_into(recording));
  auto loader = torch::data::make_data_loader(
      stacked(60, -1, 500), torch::data::DataLoaderOptions().batch_size(6).workers(0));
  for (int epoch = 0; epoch < 2; ++epoch) {
    int batches = 0;
    for (auto& batch : torchpilot::watch(*loader, pilot)) {
      auto step = pilot.step(batch.data.size(0));
      ++batches;
    }
    EXPECT_EQ(batches, 10);
  }
  ASSERT_EQ(recording->epochs.size(), 2u);
  for (const auto& e : recording->epochs) {
    EXPECT_EQ(e.steps, 10);
    ASSERT_TRUE((e.sections.get<torchpilot::LoaderStats>() != nullptr));
    EXPECT_EQ(e.sections.get<torchpilot::LoaderStats>()->name, "watched");
    EXPECT_EQ(e.sections.get<torchpilot::LoaderStats>()->batches, 10);
    EXPECT_GT(e.data_wait_fraction, 0.5);
  }
  EXPECT_EQ(recording->advice[0].at(0).id, "data_starvation");
}

TEST(Watch, ReportsTheStockLoadersOwnOptions) {
  // Issue 15: a loader made with 4 workers is reported with 4, not the default 0, and the
  // starvation advice says how many it has instead of telling it to add some.
  auto recording = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::Pilot pilot(quiet_config(torchpilot::Mode::kAdvise), recording_into(recording));
  auto loader = torch::data::make_data_loader(
      stacked(60, -1, 2000),
      torch::data::DataLoaderOptions().batch_size(6).workers(4).max_jobs(5).timeout(
          std::chrono::milliseconds(30000)));
  for (auto& batch : torchpilot::watch(*loader, pilot)) auto step = pilot.step(batch.data.size(0));
  ASSERT_EQ(recording->epochs.size(), 1u);
  const auto* l = recording->epochs[0].sections.get<torchpilot::LoaderStats>();
  ASSERT_NE(l, nullptr);
  EXPECT_TRUE(l->settings_known);
  EXPECT_EQ(l->settings.workers, 4);
  EXPECT_EQ(l->batch_size, 6);
  EXPECT_EQ(l->max_jobs, 5);
  EXPECT_EQ(l->timeout_ms, 30000);
  std::vector<std::string> lines;
  section_text(*l, recording->epochs[0], lines);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("workers 4, batch size 6, max jobs 5, timeout 30000 ms"),
            std::string::npos)
      << lines[0];
  for (const auto& a : recording->advice[0]) {
    if (a.id != "data_starvation") continue;
    // Its own 4 workers, measured: "too few workers: ... so 4 workers deliver one every ..." or
    // "workers keep up on average (4 deliver a batch every ...".
    EXPECT_TRUE(a.cause.find("4 workers deliver") != std::string::npos ||
                a.cause.find("(4 deliver") != std::string::npos)
        << a.cause;
    EXPECT_EQ(a.action.find("load in more worker threads"), std::string::npos) << a.action;
  }
}

TEST(Watch, StockLoaderWithWorkers) {
  torchpilot::Pilot pilot(quiet_config(torchpilot::Mode::kAdvise));
  auto loader = torch::data::make_data_loader(
      stacked(100), torch::data::DataLoaderOptions().batch_size(10).workers(2));
  std::vector<int> seen(100, 0);
  for (auto& batch : torchpilot::watch(*loader, pilot)) {
    auto step = pilot.step();
    count(batch.target, seen);
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 100);
  ASSERT_EQ(pilot.epoch_summaries().size(), 1u);
  EXPECT_EQ(pilot.epoch_summaries()[0].steps, 10);
}

}  // namespace
