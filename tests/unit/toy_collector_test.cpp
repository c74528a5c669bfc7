// The collector seam, shown end to end with a toy collector that lives only in this file: it
// counts steps, adds a per-step metric, publishes a late record per step and adds an epoch
// section. Nothing else in the code base knows it exists, yet the log, the JSON lines and the
// recording sink carry its figures (docs/architecture.md, "Adding a collector").
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/reports/sinks.h"

namespace toy {

// The toy's epoch section and late step record.
struct StepCount {
  static constexpr const char* kSectionName = "step_count";
  int64_t steps = 0;
  int64_t samples = 0;
};
std::string section_json(const StepCount& c) {
  return nlohmann::json{{"steps", c.steps}, {"samples", c.samples}}.dump();
}
void section_text(const StepCount& c, const torchpilot::EpochSummary&,
                  std::vector<std::string>& lines) {
  lines.push_back("  step counter: " + std::to_string(c.steps) + " steps, " +
                  std::to_string(c.samples) + " samples");
}

struct StepSeen {
  static constexpr const char* kSectionName = "step_count";
  static constexpr const char* kRecordType = "step_count_step";
  int64_t index_in_epoch = 0;
};
std::string section_json(const StepSeen& s) {
  return nlohmann::json{{"index_in_epoch", s.index_in_epoch}}.dump();
}
void section_text(const StepSeen&, const torchpilot::EpochSummary&, std::vector<std::string>&) {}

class StepCounter final : public torchpilot::Collector {
 public:
  std::string name() const override { return "step_counter"; }
  void attach(torchpilot::CollectorHost* host) override { host_ = host; }
  void on_step_end(torchpilot::StepRecord& record) override {
    ++count_.steps;
    count_.samples += record.samples;
    record.metrics.set("step_count", "index", static_cast<double>(count_.steps - 1));
    // Published late, as a collector whose figures arrive after the step would.
    if (host_ != nullptr) {
      host_->publish(
          torchpilot::make_late_step(record.step, record.epoch, StepSeen{record.step_in_epoch}));
    }
  }
  void on_epoch_end(torchpilot::EpochSummary& summary) override {
    summary.sections.set(count_);
    count_ = {};
  }
  void on_window_request(int steps) override { window_requests += steps; }
  int window_requests = 0;
  torchpilot::CollectorHost* host_ = nullptr;

 private:
  StepCount count_;
};

}  // namespace toy

namespace torchpilot {
namespace {

TEST(ToyCollector, ItsFiguresReachEverySinkWithoutTouchingTheRuntime) {
  auto sink = std::make_shared<RecordingSink>();
  auto clock = std::make_shared<ManualClock>();
  PilotOptions options;
  options.clock = clock;
  options.sinks = {sink};
  auto counter = std::make_shared<toy::StepCounter>();
  options.collectors = {counter};
  Config config;
  Pilot pilot(config, options);
  EXPECT_EQ(pilot.collector<toy::StepCounter>(), counter.get());
  EXPECT_NE(counter->host_, nullptr);

  for (int i = 0; i < 3; ++i) {
    auto step = pilot.step(8);
    clock->advance(1'000'000);
  }
  pilot.request_window(5);
  EXPECT_EQ(counter->window_requests, 5);
  pilot.end_epoch();

  // The epoch section, typed.
  ASSERT_EQ(sink->epochs.size(), 1u);
  const toy::StepCount* c = sink->epochs[0].sections.get<toy::StepCount>();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->steps, 3);
  EXPECT_EQ(c->samples, 24);
  // ... in the advisory log and the epoch's JSON line.
  const auto lines = format_epoch(sink->epochs[0], {});
  EXPECT_NE(std::find(lines.begin(), lines.end(), "  step counter: 3 steps, 24 samples"),
            lines.end());
  const auto epoch = nlohmann::json::parse(epoch_json(sink->epochs[0], {}));
  EXPECT_EQ(epoch["step_count"]["steps"], 3);
  // The per-step metric, in the step's JSON line.
  ASSERT_EQ(sink->steps.size(), 3u);
  EXPECT_DOUBLE_EQ(sink->steps[2].metrics.get("step_count", "index"), 2.0);
  const auto step = nlohmann::json::parse(step_json(sink->steps[2], {}));
  EXPECT_EQ(step["step_count"]["index"], 2.0);
  // The late records, typed and as JSON lines of their own type.
  const auto seen = sink->late<toy::StepSeen>();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[1].index_in_epoch, 1);
  const auto late = nlohmann::json::parse(late_step_json(sink->late_steps[1]));
  EXPECT_EQ(late["type"], "step_count_step");
  EXPECT_EQ(late["step"], 1);
  EXPECT_EQ(late["index_in_epoch"], 1);
}

TEST(ToyCollector, AThrowingCollectorIsDroppedAndDetached) {
  struct Throws final : Collector {
    std::string name() const override { return "throws"; }
    void attach(CollectorHost* host) override { attached = host != nullptr; }
    void on_epoch_end(EpochSummary&) override { throw 42; }  // not even a std::exception
    bool attached = false;
  };
  auto clock = std::make_shared<ManualClock>();
  PilotOptions options;
  options.clock = clock;
  auto bad = std::make_shared<Throws>();
  options.collectors = {bad};
  Pilot pilot(Config{}, options);
  EXPECT_TRUE(bad->attached);
  { auto step = pilot.step(1); }
  pilot.end_epoch();  // must not throw into the loop
  EXPECT_FALSE(bad->attached);
  EXPECT_EQ(pilot.collector<Throws>(), nullptr);
  ASSERT_EQ(pilot.epoch_summaries().size(), 1u);
}

}  // namespace
}  // namespace torchpilot
