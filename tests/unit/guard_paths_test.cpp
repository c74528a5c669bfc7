// The guard's own error paths (issue 41, item 6): a collector or sink whose name() throws, a
// custom clock that throws. Each used to terminate the program or lose every epoch summary; now
// the one that threw is dropped or worked around, with a log line, and training goes on.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include "fakes/string_logger.h"
#include "fakes/text.h"
#include "torchpilot/runtime/core/pilot.h"

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1000 * 1000;

// A collector whose name() throws; it may also throw at a step's end.
class Nameless : public Collector {
 public:
  explicit Nameless(bool throw_at_step) : throw_at_step_(throw_at_step) {}
  std::string name() const override { throw 7; }  // not even a std::exception
  void on_step_end(StepRecord&) override {
    if (throw_at_step_) throw std::runtime_error("step boom");
  }
  void on_epoch_end(EpochSummary&) override { ++epochs; }
  int epochs = 0;

 private:
  bool throw_at_step_;
};

class NamelessSink : public Sink {
 public:
  std::string name() const override { throw std::logic_error("no name"); }
  void on_step(const StepRecord&, const std::vector<std::string>&) override {
    throw std::runtime_error("sink boom");
  }
};

// Throws from its `fail_after`-th read on.
class FailingClock : public Clock {
 public:
  explicit FailingClock(int fail_after) : fail_after_(fail_after) {}
  Nanos now_ns() const override {
    if (++reads_ > fail_after_) throw std::runtime_error("clock gone");
    return reads_ * kMs;
  }

 private:
  int fail_after_;
  mutable int reads_ = 0;
};

struct Rig {
  Rig() : logger(test::string_logger("guard_paths", log)) { logger->set_pattern("%v"); }
  PilotOptions options() {
    PilotOptions o;
    o.logger = logger;
    o.clock = std::make_shared<ManualClock>(1000 * kMs);
    o.sinks = {recording};
    o.default_collectors = false;
    return o;
  }
  std::string text() {
    logger->flush();
    return log.str();
  }
  std::ostringstream log;
  std::shared_ptr<spdlog::logger> logger;
  std::shared_ptr<RecordingSink> recording = std::make_shared<RecordingSink>();
};

Config advise() {
  Config c;
  c.mode = Mode::kAdvise;
  return c;
}

TEST(GuardPaths, ACollectorWhoseNameThrowsInItsErrorPathIsRemoved) {
  Rig rig;
  Pilot pilot(advise(), rig.options());
  Nameless bad(/*throw_at_step=*/true);
  pilot.add_collector(&bad);
  for (int i = 0; i < 3; ++i) EXPECT_NO_THROW(auto s = pilot.step(1));
  EXPECT_NO_THROW(pilot.end_epoch());
  EXPECT_EQ(rig.recording->steps.size(), 3u);
  ASSERT_EQ(rig.recording->epochs.size(), 1u);
  EXPECT_EQ(
      test::count_of(rig.text(), "collector '(unnamed)' failed in on_step_end and is removed"), 1u)
      << rig.text();
  pilot.remove_collector(&bad);
}

TEST(GuardPaths, ACollectorWhoseNameThrowsLosesNoEpochSummary) {
  Rig rig;
  Pilot pilot(advise(), rig.options());
  Nameless quiet(/*throw_at_step=*/false);
  pilot.add_collector(&quiet);
  for (int e = 0; e < 2; ++e) {
    for (int i = 0; i < 3; ++i) auto s = pilot.step(1);
    pilot.end_epoch();
  }
  EXPECT_EQ(rig.recording->epochs.size(), 2u) << rig.text();
  EXPECT_EQ(test::count_of(rig.text(), "summary of epoch"), 0u) << rig.text();
  pilot.remove_collector(&quiet);
}

TEST(GuardPaths, ASinkWhoseNameThrowsInItsErrorPathIsDisabled) {
  Rig rig;
  PilotOptions o = rig.options();
  o.sinks.push_back(std::make_shared<NamelessSink>());
  Pilot pilot(advise(), o);
  for (int i = 0; i < 3; ++i) EXPECT_NO_THROW(auto s = pilot.step(1));
  pilot.flush();  // short steps reach the sinks in batches
  EXPECT_EQ(rig.recording->steps.size(), 3u);
  EXPECT_EQ(test::count_of(rig.text(), "sink '(unnamed)' failed in on_step and is disabled"), 1u)
      << rig.text();
}

TEST(GuardPaths, ACustomClockThatThrowsNeitherThrowsNorStopsTheSteps) {
  Rig rig;
  PilotOptions o = rig.options();
  o.clock = std::make_shared<FailingClock>(12);
  Pilot pilot(advise(), o);
  for (int i = 0; i < 20; ++i) EXPECT_NO_THROW(auto s = pilot.step(1));
  EXPECT_NO_THROW(pilot.end_epoch());
  EXPECT_EQ(rig.recording->steps.size(), 20u);
  EXPECT_EQ(test::count_of(rig.text(), "the clock failed"), 1u) << rig.text();
}

}  // namespace
}  // namespace torchpilot
