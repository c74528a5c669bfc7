// Trainers without epochs (CPU, real LibTorch loaders): a loop over an endless dataset left every
// N steps, a watched loader made once and looped over again, a TunableLoader loop left early, a
// trainer with no loader that never ends an epoch, and a Pilot destroyed mid-interval. Each gets
// its summaries and advice; the watched data wait is what the test's own stopwatch measured
// around the same fetches.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fakes/torch_loader_parts.h"
#include "torchpilot/runtime/core/interval.h"
#include "torchpilot/runtime/reports/sinks.h"
#include "torchpilot/torchpilot.h"

namespace {

using Clock = std::chrono::steady_clock;

// Sample i is [i]; each takes `sleep_us` to produce.
auto stacked(size_t size, int sleep_us) { return torchpilot::test::stacked(size, -1, sleep_us); }
constexpr size_t kEndless = size_t{1} << 40;

torchpilot::Config config() { return torchpilot::test::quiet_config(torchpilot::Mode::kAdvise); }
using torchpilot::test::recording_into;

bool advised(const std::vector<torchpilot::Advice>& advice, const std::string& id) {
  for (const auto& a : advice) {
    if (a.id == id) return true;
  }
  return false;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

TEST(StepBounded, WatchedLoopLeftEveryNStepsOverAnEndlessDataset) {
  auto recording = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::Pilot pilot(config(), recording_into(recording));
  // Sequential: a random sampler would hold 2^40 indices. 2 ms a sample, batch 2: 4 ms of wait a
  // step against 1 ms of work: starved.
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      stacked(kEndless, 2000), torch::data::DataLoaderOptions().batch_size(2).workers(0));
  constexpr int kEpochs = 3;
  constexpr int kSteps = 12;
  std::vector<double> fetch_s(kEpochs, 0.0);  // the test's own stopwatch around the fetches
  for (int e = 0; e < kEpochs; ++e) {
    int n = 0;
    auto fetch_began = Clock::now();
    for (auto& batch : torchpilot::watch(*loader, pilot)) {
      fetch_s[e] += seconds(Clock::now() - fetch_began);
      {
        auto step = pilot.step(batch.data.size(0));
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (++n == kSteps) break;  // the trainer's "epoch": N steps
      fetch_began = Clock::now();
    }
  }
  ASSERT_EQ(recording->epochs.size(), static_cast<size_t>(kEpochs));
  for (int e = 0; e < kEpochs; ++e) {
    const auto& s = recording->epochs[e];
    EXPECT_EQ(s.closed_by, torchpilot::PeriodEnd::kEpoch);
    EXPECT_EQ(s.steps, kSteps);
    EXPECT_EQ(s.first_step, e * kSteps);
    // The watched wait lies inside the stopwatch's span (it times less than the whole fetch),
    // and misses only the wrapper's few microseconds a fetch.
    const double waited = static_cast<double>(s.data_wait_ns) / 1e9;
    EXPECT_LE(waited, fetch_s[e] * 1.0001) << "epoch " << e;
    EXPECT_GE(waited, fetch_s[e] * 0.9) << "epoch " << e;
    EXPECT_GT(s.data_wait_fraction, 0.5);
    const auto* l = s.sections.get<torchpilot::LoaderStats>();
    ASSERT_NE(l, nullptr);
    EXPECT_EQ(l->name, "watched");
    EXPECT_TRUE(advised(recording->advice[e], "data_starvation")) << "epoch " << e;
  }
}

TEST(StepBounded, AWatchedLoaderMadeOnceIsAnEpochPerLoop) {
  auto recording = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::Pilot pilot(config(), recording_into(recording));
  // Workers: LibTorch refuses a new pass while batches are in flight, so a loop left early is
  // resumed by the next; 200 samples in batches of 5 are 40 batches.
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      stacked(200, 0), torch::data::DataLoaderOptions().batch_size(5).workers(2));
  auto watched = torchpilot::watch(*loader, pilot);
  int64_t next = 0;  // the next sample expected: nothing lost, nothing repeated
  for (int e = 0; e < 3; ++e) {
    int n = 0;
    for (auto& batch : watched) {
      auto step = pilot.step(batch.data.size(0));
      EXPECT_EQ(batch.target[0].item<int64_t>(), next);
      next += batch.target.size(0);
      if (++n == 10) break;
    }
  }
  int rest = 0;
  for (auto& batch : watched) {  // on to the loader's end: one epoch, not two
    auto step = pilot.step(batch.data.size(0));
    EXPECT_EQ(batch.target[0].item<int64_t>(), next);
    next += batch.target.size(0);
    ++rest;
  }
  EXPECT_EQ(rest, 10);
  EXPECT_EQ(next, 200);
  int again = 0;
  for (auto& batch : watched) {  // after the end: the loader from its start
    auto step = pilot.step(batch.data.size(0));
    if (again++ == 0) EXPECT_EQ(batch.target[0].item<int64_t>(), 0);
    if (again == 4) break;
  }
  pilot.end_epoch();  // nothing left: no empty epoch
  ASSERT_EQ(recording->epochs.size(), 5u);
  for (int e = 0; e < 4; ++e) EXPECT_EQ(recording->epochs[e].steps, 10) << e;
  EXPECT_EQ(recording->epochs[4].steps, 4);
  for (const auto& s : recording->epochs) {
    EXPECT_EQ(s.closed_by, torchpilot::PeriodEnd::kEpoch);
    const auto* l = s.sections.get<torchpilot::LoaderStats>();
    ASSERT_NE(l, nullptr);
    EXPECT_EQ(l->batches, s.steps);  // every batch's wait counted in its epoch
  }
}

TEST(StepBounded, ATunableLoaderLoopLeftEarlyEndsTheEpoch) {
  auto recording = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::Pilot pilot(config(), recording_into(recording));
  torchpilot::LoaderOptions options;
  options.batch_size = 5;
  options.workers = 2;
  torchpilot::TunableLoader<decltype(stacked(1, 0))> loader(stacked(100, 0), options);
  loader.attach(pilot);
  for (int e = 0; e < 2; ++e) {
    int n = 0;
    for (auto& batch : loader) {
      auto step = pilot.step(batch.data.size(0));
      if (++n == 8) break;
    }
  }
  int full = 0;
  for (auto& batch : loader) {
    auto step = pilot.step(batch.data.size(0));
    ++full;
  }
  EXPECT_EQ(full, 20);
  ASSERT_EQ(recording->epochs.size(), 3u);
  EXPECT_EQ(recording->epochs[0].steps, 8);
  EXPECT_EQ(recording->epochs[1].steps, 8);
  EXPECT_EQ(recording->epochs[2].steps, 20);
}

TEST(StepBounded, NoLoaderAndNoEpochEndGetsIntervals) {
  auto recording = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::Config c = config();
  c.section<torchpilot::IntervalConfig>().seconds = 0.2;
  c.section<torchpilot::IntervalConfig>().min_steps = 5;
  torchpilot::Pilot pilot(c, recording_into(recording));
  auto w = torch::randn({64, 64});
  const auto start = Clock::now();
  for (int i = 0; i < 60; ++i) {  // synthetic batches, 10 ms steps: about 0.6 s
    auto step = pilot.step(64);
    auto x = torch::randn({64, 64});
    (void)x.matmul(w).sum().item<float>();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double ran = seconds(Clock::now() - start);
  // At least 0.2 s and 5 steps each: as many as the time allows, at least one.
  ASSERT_GE(recording->epochs.size(), 1u);
  EXPECT_LE(recording->epochs.size(), static_cast<size_t>(ran / 0.2));
  for (size_t i = 0; i < recording->epochs.size(); ++i) {
    const auto& s = recording->epochs[i];
    EXPECT_EQ(s.closed_by, torchpilot::PeriodEnd::kInterval);
    EXPECT_GE(s.steps, 5);
    EXPECT_GE(static_cast<double>(s.wall_ns) / 1e9, 0.2);
  }
  EXPECT_EQ(recording->advice.size(), recording->epochs.size());  // the advisors ran at each
}

TEST(StepBounded, APilotDestroyedMidIntervalWritesItsLastRecord) {
  const std::string path = ::testing::TempDir() + "step_bounded_exit.jsonl";
  std::remove(path.c_str());
  {
    torchpilot::Config c = config();
    c.log.json_path = path;
    torchpilot::Pilot pilot(c);
    for (int i = 0; i < 7; ++i) auto step = pilot.step(1);
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string records = text.str();
  EXPECT_NE(records.find("\"type\":\"epoch\""), std::string::npos) << records;
  EXPECT_NE(records.find("\"closed_by\":\"exit\""), std::string::npos) << records;
  EXPECT_NE(records.find("\"steps\":7"), std::string::npos) << records;
  std::remove(path.c_str());
}

}  // namespace
