// Reporting intervals (runtime/core/interval.h): a trainer that never ends an epoch gets interval
// summaries by time or by step count, said once in the log; a trainer that ends epochs keeps them;
// a Pilot destroyed with steps pending reports them; the ranks' agreement governs the length.
// Time is a ManualClock.
#include "torchpilot/runtime/core/interval.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fakes/string_logger.h"
#include "fakes/text.h"
#include "torchpilot/runtime/core/config_section.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/reports/sinks.h"

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1000 * 1000;

using test::count_of;

struct Rig {
  explicit Rig(Config c) {
    logger = test::string_logger("interval_test", log);
    logger->set_pattern("%v");
    PilotOptions o;
    o.clock = clock;
    o.logger = logger;
    o.sinks = {recording};
    o.default_collectors = false;
    pilot = std::make_unique<Pilot>(std::move(c), std::move(o));
  }
  // A step of `ms` milliseconds, `wait_ms` of it waiting for data.
  void step(Nanos ms, Nanos wait_ms = 0) {
    clock->advance(wait_ms * kMs);
    if (wait_ms > 0) pilot->record_data_wait(wait_ms * kMs);
    auto s = pilot->step(8);
    clock->advance((ms - wait_ms) * kMs);
  }
  std::string text() {
    logger->flush();
    return log.str();
  }

  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>(1000 * kMs);
  std::shared_ptr<RecordingSink> recording = std::make_shared<RecordingSink>();
  std::ostringstream log;
  std::shared_ptr<spdlog::logger> logger;
  std::unique_ptr<Pilot> pilot;
};

Config interval_config(double seconds, int64_t min_steps, int64_t steps) {
  Config c;
  c.mode = Mode::kAdvise;
  auto& i = c.section<IntervalConfig>();
  i.seconds = seconds;
  i.min_steps = min_steps;
  i.steps = steps;
  return c;
}

TEST(IntervalTest, DefaultsAndKeys) {
  const Config c;
  EXPECT_EQ(c.section<IntervalConfig>().seconds, 60);
  EXPECT_EQ(c.section<IntervalConfig>().min_steps, 50);
  EXPECT_EQ(c.section<IntervalConfig>().steps, 0);
  const std::vector<std::string> keys = config_keys();
  for (const char* k : {"interval.seconds", "interval.min_steps", "interval.steps"}) {
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
  }
}

TEST(IntervalTest, ATrainerThatNeverEndsAnEpochGetsIntervalsByTime) {
  // 100 ms steps, intervals of 1 s once 5 steps ran: every 10 steps.
  Rig rig(interval_config(1.0, 5, 0));
  for (int i = 0; i < 35; ++i) rig.step(100, /*wait_ms=*/20);
  const auto& epochs = rig.recording->epochs;
  ASSERT_EQ(epochs.size(), 3u);
  for (size_t i = 0; i < epochs.size(); ++i) {
    EXPECT_EQ(epochs[i].closed_by, PeriodEnd::kInterval);
    EXPECT_EQ(epochs[i].epoch, static_cast<int64_t>(i));
    EXPECT_EQ(epochs[i].steps, 10);
    EXPECT_EQ(epochs[i].first_step, static_cast<int64_t>(10 * i));
    EXPECT_NEAR(epochs[i].data_wait_fraction, 0.2, 1e-9);
  }
  EXPECT_EQ(rig.pilot->epoch(), 3);
  const std::string log = rig.text();
  EXPECT_EQ(count_of(log, "no epoch end after 1 s (interval.seconds)"), 1u) << log;
  EXPECT_EQ(count_of(log, "interval 0: 10 steps in 1 s"), 1u) << log;
  EXPECT_EQ(count_of(log, "interval 2: 10 steps"), 1u) << log;
  // The advisors ran at each interval's end: 20% data wait is starvation.
  ASSERT_EQ(rig.recording->advice.size(), 3u);
  bool starvation = false;
  for (const auto& a : rig.recording->advice[2])
    starvation = starvation || a.id == "data_starvation";
  EXPECT_TRUE(starvation);
  // The JSON record says which it was.
  EXPECT_NE(epoch_json(epochs[0], {}).find("\"closed_by\":\"interval\""), std::string::npos);
}

TEST(IntervalTest, SlowStepsWaitForMinSteps) {
  // 2 s steps: 1 s has passed after the first step, but an interval needs 4 steps.
  Rig rig(interval_config(1.0, 4, 0));
  for (int i = 0; i < 9; ++i) rig.step(2000);
  ASSERT_EQ(rig.recording->epochs.size(), 2u);
  EXPECT_EQ(rig.recording->epochs[0].steps, 4);
  EXPECT_EQ(rig.recording->epochs[1].steps, 4);
}

TEST(IntervalTest, ByStepCountHoweverLong) {
  Rig rig(interval_config(0, 1, 7));  // time off, every 7 steps
  for (int i = 0; i < 15; ++i) rig.step(1);
  ASSERT_EQ(rig.recording->epochs.size(), 2u);
  EXPECT_EQ(rig.recording->epochs[0].steps, 7);
  EXPECT_EQ(rig.recording->epochs[1].first_step, 7);
  EXPECT_EQ(count_of(rig.text(), "no epoch end after 7 steps (interval.steps)"), 1u);
}

TEST(IntervalTest, EpochsTheTrainerEndsAreKeptAndReset) {
  Rig rig(interval_config(1.0, 5, 0));
  // Epochs of 8 steps of 100 ms: none reaches 1 s, no interval.
  for (int e = 0; e < 3; ++e) {
    for (int i = 0; i < 8; ++i) rig.step(100);
    rig.pilot->end_epoch();
  }
  ASSERT_EQ(rig.recording->epochs.size(), 3u);
  for (const auto& s : rig.recording->epochs) EXPECT_EQ(s.closed_by, PeriodEnd::kEpoch);
  EXPECT_EQ(count_of(rig.text(), "interval"), 0u);
  // A long epoch gets intervals inside it; its end closes the rest as the epoch.
  for (int i = 0; i < 25; ++i) rig.step(100);
  rig.pilot->end_epoch();
  const auto& epochs = rig.recording->epochs;
  ASSERT_EQ(epochs.size(), 6u);
  EXPECT_EQ(epochs[3].closed_by, PeriodEnd::kInterval);
  EXPECT_EQ(epochs[4].closed_by, PeriodEnd::kInterval);
  EXPECT_EQ(epochs[5].closed_by, PeriodEnd::kEpoch);
  EXPECT_EQ(epochs[5].steps, 5);
}

TEST(IntervalTest, APilotDestroyedMidIntervalReportsItsSteps) {
  std::ostringstream log;
  auto recording = std::make_shared<RecordingSink>();
  {
    Rig rig(interval_config(60, 50, 0));
    for (int i = 0; i < 12; ++i) rig.step(10, 2);
    recording = rig.recording;
    rig.pilot.reset();  // destroyed with 12 steps pending
    const std::string text = rig.text();
    EXPECT_EQ(count_of(text, "epoch 0 (at exit): 12 steps in 0.12 s"), 1u) << text;
  }
  ASSERT_EQ(recording->epochs.size(), 1u);
  EXPECT_EQ(recording->epochs[0].closed_by, PeriodEnd::kExit);
  EXPECT_EQ(recording->epochs[0].steps, 12);
  EXPECT_NEAR(recording->epochs[0].data_wait_fraction, 0.2, 1e-9);
  // Nothing pending: nothing at exit.
  Rig idle(interval_config(60, 50, 0));
  idle.step(10);
  idle.pilot->end_epoch();
  idle.pilot.reset();
  EXPECT_EQ(idle.recording->epochs.size(), 1u);
  EXPECT_EQ(count_of(idle.text(), "at exit"), 0u);
}

TEST(IntervalTest, ModeOffReportsNothing) {
  Config c = interval_config(0.001, 1, 1);
  c.mode = Mode::kOff;
  Rig rig(c);
  for (int i = 0; i < 5; ++i) rig.step(10);
  rig.pilot.reset();
  EXPECT_TRUE(rig.recording->epochs.empty());
}

TEST(IntervalTest, TheRanksAgreementSetsTheLengthInSteps) {
  // 100 ms steps: this rank proposes 10 steps for 1 s after 3 steps; the ranks agree on 12.
  Rig rig(interval_config(1.0, 3, 0));
  std::vector<int64_t> asked;
  rig.pilot->set_interval_agreement([&](int64_t proposed) -> std::optional<int64_t> {
    asked.push_back(proposed);
    return 12;
  });
  for (int i = 0; i < 30; ++i) rig.step(100);
  ASSERT_EQ(asked.size(), 1u);  // once, at the period's third step
  EXPECT_EQ(asked[0], 10);
  ASSERT_EQ(rig.recording->epochs.size(), 2u);
  EXPECT_EQ(rig.recording->epochs[0].steps, 12);
  EXPECT_EQ(rig.recording->epochs[1].steps, 12);
  EXPECT_NE(rig.text().find("ranks agreed on intervals of 12 steps"), std::string::npos);
}

TEST(IntervalTest, RanksThatCannotAgreeCloseNoIntervalByTime) {
  Rig rig(interval_config(1.0, 3, 0));
  int calls = 0;
  rig.pilot->set_interval_agreement([&](int64_t) -> std::optional<int64_t> {
    ++calls;
    return std::nullopt;
  });
  for (int i = 0; i < 40; ++i) rig.step(100);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(rig.recording->epochs.empty());
  EXPECT_EQ(count_of(rig.text(), "the ranks did not agree on an interval length"), 1u);
  // An agreement that throws counts as no agreement, and the steps go on.
  Rig thrower(interval_config(1.0, 3, 0));
  thrower.pilot->set_interval_agreement(
      [](int64_t) -> std::optional<int64_t> { throw std::runtime_error("store down"); });
  for (int i = 0; i < 40; ++i) thrower.step(100);
  EXPECT_TRUE(thrower.recording->epochs.empty());
  EXPECT_NE(thrower.text().find("store down"), std::string::npos);
}

TEST(IntervalTest, BadValuesAreRefused) {
  Config c;
  c.section<IntervalConfig>().seconds = -1;
  EXPECT_THROW(validate(c), ConfigError);
  Config d;
  d.section<IntervalConfig>().min_steps = 0;
  EXPECT_THROW(validate(d), ConfigError);
}

}  // namespace
}  // namespace torchpilot
