// Pilot: step boundaries, phases, epochs, the advisory log, sinks, the ring buffer, mode off,
// JSON-lines records and autotune through an attached (fake) loader. Time is a ManualClock.
#include "torchpilot/runtime/core/pilot.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "epoch_checks.h"
#include "fakes/late_sink.h"
#include "fakes/text.h"
#include "temp_dir.h"
#include "torchpilot/runtime/cost/cost.h"
#include "torchpilot/runtime/loader/loader_probe.h"
#include "torchpilot/runtime/reports/sinks.h"

namespace torchpilot {
namespace {

namespace fs = std::filesystem;

constexpr Nanos kMs = 1000 * 1000;

using test::count_of;

// A clock, a recording sink and a logger that writes into a string.
class Harness {
 public:
  Harness() {
    logger_ = std::make_shared<spdlog::logger>(
        "pilot_test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log_));
    logger_->set_pattern("[%l] %v");
    logger_->set_level(spdlog::level::info);
  }
  PilotOptions options(std::vector<std::shared_ptr<Sink>> extra = {}) {
    PilotOptions o;
    o.clock = clock;
    o.logger = logger_;
    o.sinks = {recording};
    for (auto& s : extra) o.sinks.push_back(std::move(s));
    return o;
  }
  std::string log() {
    logger_->flush();
    return log_.str();
  }

  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>(1000 * kMs);
  std::shared_ptr<RecordingSink> recording = std::make_shared<RecordingSink>();

 private:
  std::ostringstream log_;
  std::shared_ptr<spdlog::logger> logger_;
};

// The loader blocks the training thread for `wait`, then the step computes for `work`.
void run_step(Pilot& pilot, ManualClock& clock, Nanos wait, Nanos work, int64_t samples = 32) {
  clock.advance(wait);
  if (wait > 0) pilot.record_data_wait(wait);
  auto step = pilot.step(samples);
  clock.advance(work);
}

Config advise_config() {
  Config c;
  c.mode = Mode::kAdvise;
  return c;
}

// Mode autotune with windows and budget in steps only.
Config autotune_config() {
  Config c;
  c.mode = Mode::kAutotune;
  c.autotune.min_window_ms = 0;
  c.autotune.warmup_seconds = 0;
  return c;
}

// An epoch of 20 steps, each `wait` of data wait then `work`, ended; what was logged.
std::string run_epoch_of_twenty(Pilot& pilot, Harness& h, Nanos wait, Nanos work) {
  for (int i = 0; i < 20; ++i) run_step(pilot, *h.clock, wait, work);
  pilot.end_epoch();
  return h.log();
}

TEST(PilotTest, StepBoundarySemantics) {
  Harness h;
  Pilot pilot(advise_config(), h.options());
  const Nanos t0 = h.clock->now_ns();

  // Step 0: waits 5 ms for its batch, then forward 12 ms and backward 8 ms.
  h.clock->advance(5 * kMs);
  pilot.record_data_wait(5 * kMs);
  {
    auto step = pilot.step(32);
    {
      auto p = pilot.phase("forward");
      h.clock->advance(12 * kMs);
    }
    {
      auto p = pilot.phase("backward");
      h.clock->advance(8 * kMs);
    }
  }
  // Between steps: 3 ms of waiting for the next batch (belongs to step 1) and 2 ms not waiting.
  h.clock->advance(3 * kMs);
  pilot.record_data_wait(3 * kMs);
  ASSERT_EQ(pilot.recent_steps().size(), 1u);
  EXPECT_EQ(pilot.recent_steps()[0].data_wait_ns, 5 * kMs);
  h.clock->advance(2 * kMs);
  {
    auto step = pilot.step(32);
    auto p = pilot.phase(pilot.phase_id("forward"));
    h.clock->advance(10 * kMs);
  }
  // Step 2: no wait; the phase is ended explicitly, samples set later.
  {
    auto step = pilot.step();
    auto p = pilot.phase("optimizer");
    h.clock->advance(4 * kMs);
    p.end();
    h.clock->advance(1 * kMs);
    step.set_samples(16);
  }

  const std::vector<StepRecord> steps = pilot.recent_steps();
  ASSERT_EQ(steps.size(), 3u);
  // The first step of the epoch starts where its wait started.
  EXPECT_EQ(steps[0].begin_ns, t0);
  EXPECT_EQ(steps[0].end_ns, t0 + 25 * kMs);
  EXPECT_EQ(steps[0].step_ns(), 25 * kMs);
  EXPECT_EQ(steps[0].data_wait_ns, 5 * kMs);
  EXPECT_EQ(steps[0].phase_ns[pilot.phase_id("forward")], 12 * kMs);
  EXPECT_EQ(steps[0].phase_ns[pilot.phase_id("backward")], 8 * kMs);
  // Later steps run boundary to boundary; the wait between them belongs to the next step.
  EXPECT_EQ(steps[1].begin_ns, steps[0].end_ns);
  EXPECT_EQ(steps[1].step_ns(), 15 * kMs);
  EXPECT_EQ(steps[1].data_wait_ns, 3 * kMs);
  EXPECT_EQ(steps[1].phase_ns[pilot.phase_id("forward")], 10 * kMs);
  EXPECT_EQ(steps[1].phase_ns[pilot.phase_id("backward")], 0);
  EXPECT_EQ(steps[2].begin_ns, steps[1].end_ns);
  EXPECT_EQ(steps[2].step_ns(), 5 * kMs);
  EXPECT_EQ(steps[2].data_wait_ns, 0);
  EXPECT_EQ(steps[2].samples, 16);
  EXPECT_EQ(steps[2].phase_ns[pilot.phase_id("optimizer")], 4 * kMs);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(steps[i].step, i);
    EXPECT_EQ(steps[i].step_in_epoch, i);
    EXPECT_EQ(steps[i].epoch, 0);
  }
  EXPECT_EQ(pilot.steps(), 3);
  EXPECT_EQ(h.recording->steps.size(), 3u);
  EXPECT_EQ(h.recording->steps[1].step_ns(), 15 * kMs);
}

TEST(PilotTest, EpochSummaryAndIdempotentEndEpoch) {
  Harness h;
  Pilot pilot(advise_config(), h.options());
  // Three steps: (wait, work) = (5, 20), (3, 20), (0, 12) ms; forward takes 10 ms of each.
  const std::vector<std::pair<Nanos, Nanos>> plan = {{5, 20}, {3, 20}, {0, 12}};
  for (const auto& [wait, work] : plan) {
    h.clock->advance(wait * kMs);
    if (wait > 0) pilot.record_data_wait(wait * kMs);
    auto step = pilot.step(32);
    auto p = pilot.phase("forward");
    h.clock->advance(10 * kMs);
    p.end();
    h.clock->advance((work - 10) * kMs);
  }
  pilot.end_epoch();
  ASSERT_EQ(pilot.epoch_summaries().size(), 1u);
  const EpochSummary& s = pilot.epoch_summaries()[0];
  test::expect_totals(s, 0, 3, 0, 96, 60 * kMs, 8 * kMs);
  EXPECT_DOUBLE_EQ(s.data_wait_fraction, 8.0 / 60.0);
  EXPECT_DOUBLE_EQ(s.samples_per_s, 96 / 0.060);
  EXPECT_DOUBLE_EQ(s.steps_per_s, 3 / 0.060);
  ASSERT_EQ(s.phases.size(), 1u);
  EXPECT_EQ(s.phases[0].name, "forward");
  EXPECT_EQ(s.phases[0].ns, 30 * kMs);
  EXPECT_EQ(pilot.epoch(), 1);
  ASSERT_EQ(h.recording->epochs.size(), 1u);
  EXPECT_EQ(h.recording->epochs[0].wall_ns, 60 * kMs);
  // 8/60 = 13% > 5%: a warning-level data-starvation advice.
  ASSERT_EQ(pilot.last_advice().size(), 1u);
  EXPECT_EQ(pilot.last_advice()[0].severity, Severity::kWarning);

  // A second end_epoch without steps does nothing.
  pilot.end_epoch();
  pilot.end_epoch();
  EXPECT_EQ(pilot.epoch_summaries().size(), 1u);
  EXPECT_EQ(h.recording->epochs.size(), 1u);
  EXPECT_EQ(pilot.epoch(), 1);
}

TEST(PilotTest, NewEpochStartsAtItsFirstWait) {
  Harness h;
  Pilot pilot(advise_config(), h.options());
  run_step(pilot, *h.clock, 2 * kMs, 10 * kMs);
  run_step(pilot, *h.clock, 2 * kMs, 10 * kMs);
  pilot.record_data_wait(7 * kMs);  // a wait after the last step: dropped with the epoch
  pilot.end_epoch();
  // Evaluation between epochs (not a step), then the first batch of epoch 1 takes 4 ms.
  h.clock->advance(500 * kMs);
  const Nanos wait_begin = h.clock->now_ns();
  run_step(pilot, *h.clock, 4 * kMs, 10 * kMs);
  const std::vector<StepRecord> steps = pilot.recent_steps();
  ASSERT_EQ(steps.size(), 3u);
  const StepRecord& first = steps[2];
  EXPECT_EQ(first.epoch, 1);
  EXPECT_EQ(first.step, 2);
  EXPECT_EQ(first.step_in_epoch, 0);
  EXPECT_EQ(first.begin_ns, wait_begin);
  EXPECT_EQ(first.step_ns(), 14 * kMs);
  EXPECT_EQ(first.data_wait_ns, 4 * kMs);
  pilot.end_epoch();
  ASSERT_EQ(pilot.epoch_summaries().size(), 2u);
  EXPECT_EQ(pilot.epoch_summaries()[1].first_step, 2);
  EXPECT_EQ(pilot.epoch_summaries()[1].wall_ns, 14 * kMs);
  EXPECT_EQ(pilot.epoch_summaries()[0].wall_ns, 24 * kMs);
  EXPECT_EQ(pilot.epoch_summaries()[0].data_wait_ns, 4 * kMs);
}

TEST(PilotTest, EndEpochClosesAnOpenStepOnce) {
  Harness h;
  Pilot pilot(advise_config(), h.options());
  auto step = pilot.step(8);
  h.clock->advance(6 * kMs);
  pilot.end_epoch();  // the step is still open: it ends here
  ASSERT_EQ(pilot.epoch_summaries().size(), 1u);
  EXPECT_EQ(pilot.epoch_summaries()[0].steps, 1);
  EXPECT_EQ(pilot.epoch_summaries()[0].wall_ns, 6 * kMs);
  h.clock->advance(3 * kMs);
  step.end();  // already closed by end_epoch: no second step
  EXPECT_EQ(pilot.steps(), 1);
  EXPECT_EQ(h.recording->steps.size(), 1u);
  // The next epoch starts clean.
  run_step(pilot, *h.clock, 2 * kMs, 10 * kMs);
  ASSERT_EQ(pilot.recent_steps().size(), 2u);
  EXPECT_EQ(pilot.recent_steps()[1].step_in_epoch, 0);
  EXPECT_EQ(pilot.recent_steps()[1].epoch, 1);
  EXPECT_EQ(pilot.recent_steps()[1].step_ns(), 12 * kMs);
  pilot.end_epoch();
  EXPECT_EQ(pilot.epoch_summaries()[1].steps, 1);
  EXPECT_EQ(pilot.epoch_summaries()[1].wall_ns, 12 * kMs);
}

TEST(PilotTest, StaleStepScopeDoesNotEndTheNextStep) {
  Harness h;
  Pilot pilot(advise_config(), h.options());
  std::optional<StepScope> first(pilot.step(1));
  h.clock->advance(5 * kMs);
  auto second = pilot.step(2);  // the first scope was left open: it is closed here
  h.clock->advance(7 * kMs);
  first.reset();  // the stale scope goes away: nothing happens
  h.clock->advance(1 * kMs);
  second.end();
  const std::vector<StepRecord> steps = pilot.recent_steps();
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].step_ns(), 5 * kMs);
  EXPECT_EQ(steps[1].step_ns(), 8 * kMs);
  EXPECT_EQ(steps[1].samples, 2);
  EXPECT_EQ(pilot.steps(), 2);
}

TEST(PilotTest, PhaseNamesAreInternedUpToTheLimit) {
  Harness h;
  Pilot pilot(advise_config(), h.options());
  EXPECT_EQ(pilot.phase_id("a"), 0);
  EXPECT_EQ(pilot.phase_id("b"), 1);
  EXPECT_EQ(pilot.phase_id("a"), 0);
  for (int i = 2; i < kMaxPhases; ++i) EXPECT_EQ(pilot.phase_id("p" + std::to_string(i)), i);
  EXPECT_EQ(pilot.phase_id("one too many"), -1);
  {
    auto step = pilot.step();
    auto p = pilot.phase("one too many");  // not timed, no crash
    auto q = pilot.phase(kMaxPhases);
    h.clock->advance(kMs);
  }
  EXPECT_EQ(pilot.recent_steps().size(), 1u);
}

TEST(PilotTest, PlantedStarvationGivesHighAdviceInTheLog) {
  Harness h;
  Pilot pilot(advise_config(), h.options());
  const std::string log = run_epoch_of_twenty(pilot, h, 60 * kMs, 40 * kMs);
  EXPECT_NE(log.find("ADVICE [high] data_starvation"), std::string::npos) << log;
  EXPECT_NE(log.find("data wait 60.0% of step time"), std::string::npos) << log;
  EXPECT_EQ(log.find("no advice"), std::string::npos) << log;
  ASSERT_EQ(pilot.last_advice().size(), 1u);
  const Advice& a = pilot.last_advice()[0];
  EXPECT_EQ(a.id, "data_starvation");
  EXPECT_EQ(a.severity, Severity::kHigh);
  EXPECT_EQ(a.epoch, 0);
  EXPECT_NEAR(a.expected_gain, 0.6 / 0.4, 1e-9);
  ASSERT_EQ(h.recording->advice.size(), 1u);
  ASSERT_EQ(h.recording->advice[0].size(), 1u);
  EXPECT_EQ(h.recording->advice[0][0].id, "data_starvation");
}

TEST(PilotTest, HealthyRunSaysNoAdvice) {
  Harness h;
  Pilot pilot(advise_config(), h.options());
  const std::string log = run_epoch_of_twenty(pilot, h, 1 * kMs, 99 * kMs);
  EXPECT_TRUE(pilot.last_advice().empty());
  EXPECT_NEAR(pilot.epoch_summaries()[0].data_wait_fraction, 0.01, 1e-12);
  EXPECT_EQ(pilot.epoch_summaries()[0].tuning_steps, 0);
  EXPECT_NE(log.find("no advice"), std::string::npos) << log;
  EXPECT_EQ(log.find("ADVICE"), std::string::npos) << log;
  EXPECT_EQ(log.find("auto-tune trials"), std::string::npos) << log;
}

TEST(PilotTest, RingBufferIsBoundedByStepHistory) {
  Harness h;
  Config config = advise_config();
  config.records.step_history = 16;
  Pilot pilot(config, h.options());
  for (int i = 0; i < 10; ++i) run_step(pilot, *h.clock, 0, (i + 1) * kMs);
  ASSERT_EQ(pilot.recent_steps().size(), 10u);
  for (int i = 10; i < 100; ++i) run_step(pilot, *h.clock, 0, (i + 1) * kMs);
  const std::vector<StepRecord> steps = pilot.recent_steps();
  ASSERT_EQ(steps.size(), 16u);
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].step, 84 + static_cast<int64_t>(i));  // oldest first
    EXPECT_EQ(steps[i].step_ns(), (85 + static_cast<Nanos>(i)) * kMs);
  }
  EXPECT_EQ(pilot.steps(), 100);
  EXPECT_EQ(h.recording->steps.size(), 100u);  // sinks still see every step
}

TEST(PilotTest, EmptyStepHistoryIsAConfigError) {
  Harness h;
  Config config = advise_config();
  config.records.step_history = 0;  // built in code: no loader checked the range
  try {
    Pilot pilot(config, h.options());
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "records.step_history");
  }
}

class ThrowingSink : public Sink {
 public:
  explicit ThrowingSink(bool std_exception) : std_exception_(std_exception) {}
  std::string name() const override { return std_exception_ ? "thrower" : "odd-thrower"; }
  void on_step(const StepRecord&, const std::vector<std::string>&) override {
    ++calls;
    if (std_exception_) throw std::runtime_error("boom");
    throw 42;
  }
  void on_epoch(const EpochSummary&, const std::vector<Advice>&) override { ++calls; }
  void flush() override { ++calls; }
  int calls = 0;

 private:
  bool std_exception_;
};

TEST(PilotTest, ThrowingSinkIsDisabledAfterOneErrorLine) {
  Harness h;
  auto thrower = std::make_shared<ThrowingSink>(true);
  auto odd = std::make_shared<ThrowingSink>(false);
  Pilot pilot(advise_config(), h.options({thrower, odd}));
  for (int i = 0; i < 5; ++i) run_step(pilot, *h.clock, 0, 10 * kMs);
  pilot.end_epoch();
  pilot.flush();
  EXPECT_EQ(thrower->calls, 1);
  EXPECT_EQ(odd->calls, 1);
  const std::string log = h.log();
  EXPECT_EQ(count_of(log, "sink 'thrower' failed in on_step and is disabled: boom"), 1u) << log;
  EXPECT_EQ(count_of(log, "sink 'odd-thrower' failed in on_step and is disabled"), 1u) << log;
  EXPECT_EQ(count_of(log, "failed in"), 2u) << log;
  // The others kept working.
  EXPECT_EQ(h.recording->steps.size(), 5u);
  EXPECT_EQ(h.recording->epochs.size(), 1u);
  EXPECT_NE(log.find("epoch 0: 5 steps"), std::string::npos) << log;
}

TEST(PilotTest, AddedSinkReceivesLaterRecords) {
  Harness h;
  Pilot pilot(advise_config(), h.options());
  run_step(pilot, *h.clock, 0, kMs);
  auto late = std::make_shared<RecordingSink>();
  pilot.add_sink(late);
  run_step(pilot, *h.clock, 0, kMs);
  pilot.end_epoch();
  EXPECT_EQ(late->steps.size(), 1u);
  EXPECT_EQ(late->steps[0].step, 1);
  EXPECT_EQ(late->epochs.size(), 1u);
}

TEST(PilotTest, ModeOffIsANoOp) {
  Harness h;
  Config config;
  config.mode = Mode::kOff;
  Pilot pilot(config, h.options());
  for (int i = 0; i < 10; ++i) {
    h.clock->advance(kMs);
    pilot.record_data_wait(kMs);
    auto step = pilot.step(32);
    auto p = pilot.phase("forward");
    h.clock->advance(10 * kMs);
  }
  pilot.end_epoch();
  pilot.flush();
  EXPECT_EQ(pilot.mode(), Mode::kOff);
  EXPECT_EQ(pilot.steps(), 0);
  EXPECT_EQ(pilot.epoch(), 0);
  EXPECT_TRUE(pilot.recent_steps().empty());
  EXPECT_TRUE(pilot.epoch_summaries().empty());
  EXPECT_TRUE(pilot.last_advice().empty());
  EXPECT_TRUE(h.recording->steps.empty());
  EXPECT_TRUE(h.recording->epochs.empty());
  EXPECT_FALSE(pilot.tuning_decision().has_value());
  EXPECT_EQ(h.log(), "");
}

TEST(PilotTest, JsonLinesSinkOnUnwritablePathThrows) {
  EXPECT_THROW(make_json_lines_sink("/nonexistent-dir/torchpilot/records.jsonl"),
               std::runtime_error);
  Harness h;
  Config config = advise_config();
  config.log.json_path = "/nonexistent-dir/torchpilot/records.jsonl";
  EXPECT_THROW(Pilot(config, h.options()), std::runtime_error);
}

// --- autotune through an attached loader ---------------------------------------------------------

// A loader that reports its settings and counters and exposes knobs; the test's step-time model
// reads its settings.
class FakeLoader : public LoaderProbe {
 public:
  LoaderStats stats() const override {
    LoaderStats s;
    s.name = "fake";
    s.tunable = true;
    s.settings = settings;
    s.max_workers = 8;
    s.batches = batches;
    s.produce_count = batches;
    s.produce_ns = batches * 45 * kMs;
    s.blocked_count = batches;
    s.wait_ns = wait_ns;
    return s;
  }
  void forget_pilot() override { pilot_gone = true; }
  std::vector<Knob> knobs() {
    std::vector<int64_t> workers, prefetch;
    for (int64_t w = 0; w <= 8; ++w) workers.push_back(w);
    for (int64_t p = 1; p <= 64; ++p) prefetch.push_back(p);
    return {{"loader.workers", workers, [this] { return int64_t{settings.workers}; },
             [this](int64_t v) { settings.workers = static_cast<int>(v); }},
            {"loader.prefetch", prefetch, [this] { return int64_t{settings.prefetch}; },
             [this](int64_t v) { settings.prefetch = static_cast<int>(v); }},
            {"loader.pin_memory",
             {0},
             [this] { return int64_t{settings.pin_memory}; },
             [this](int64_t v) { settings.pin_memory = v != 0; }}};
  }

  LoaderSettings settings;  // workers 0, prefetch 2
  int64_t batches = 0;
  Nanos wait_ns = 0;
  bool pilot_gone = false;
};

// Step time of the fake loader: 10 ms compute; 45 ms batches hidden by workers; shallow prefetch
// costs up to 3 ms.
Nanos model_step_ns(const LoaderSettings& s) {
  const double compute = 10, batch = 45;
  double ms = std::max(compute, batch / std::max(1, s.workers));
  if (s.workers == 0) ms += batch;
  if (s.workers > 0) ms += 3.0 * std::max(0, 8 - s.prefetch) / 8.0;
  return static_cast<Nanos>(std::llround(ms * 1e6));
}

// One training step with the fake loader: the part beyond 10 ms of compute is data wait.
void run_model_step(Pilot& pilot, ManualClock& clock, FakeLoader& loader) {
  const Nanos step = model_step_ns(loader.settings);
  const Nanos compute = 10 * kMs;
  run_step(pilot, clock, step - compute, compute, 32);
  loader.batches += 1;
  loader.wait_ns += step - compute;
}

using torchpilot_test::TempDir;

TEST(PilotTest, ALoaderWhoseSettersThrowAnythingAttachesWithoutThrowing) {
  // Tuning decided; a new loader gets the decided setting through its knobs' setters, which
  // throw something that is not a std::exception (issue 41): attaching must not throw.
  Harness h;
  FakeLoader loader;
  auto pilot = std::make_unique<Pilot>(autotune_config(), h.options());
  attach_loader(*pilot, &loader, loader.knobs());
  for (int64_t steps = 0; !pilot->tuning_finished() && steps < 1000; ++steps) {
    run_model_step(*pilot, *h.clock, loader);
  }
  ASSERT_TRUE(pilot->tuning_finished());
  FakeLoader other;
  std::vector<Knob> knobs = other.knobs();
  for (auto& k : knobs) k.set = [](int64_t) { throw 42; };
  EXPECT_NO_THROW(attach_loader(*pilot, &other, std::move(knobs)));
  EXPECT_NE(h.log().find("an exception that is not a std::exception"), std::string::npos)
      << h.log();
  for (int i = 0; i < 3; ++i) run_model_step(*pilot, *h.clock, other);
  detach_loader(*pilot, &other);
}

TEST(PilotTest, AutotuneWithAttachedLoader) {
  Harness h;
  FakeLoader loader;
  Config config = autotune_config();
  auto pilot = std::make_unique<Pilot>(config, h.options());
  attach_loader(*pilot, &loader, loader.knobs());
  EXPECT_EQ(pilot->knobs().knobs().size(), 3u);
  int64_t steps = 0;
  while (!pilot->tuning_finished() && steps < 1000) {
    run_model_step(*pilot, *h.clock, loader);
    ++steps;
  }
  ASSERT_TRUE(pilot->tuning_finished());
  EXPECT_LE(steps, config.autotune.warmup_steps);
  for (int i = 0; i < 20; ++i) run_model_step(*pilot, *h.clock, loader);
  pilot->end_epoch();

  ASSERT_EQ(h.recording->decisions.size(), 1u);
  const TuningDecision& d = h.recording->decisions[0];
  ASSERT_TRUE(pilot->tuning_decision().has_value());
  EXPECT_EQ(pilot->tuning_decision()->chosen, d.chosen);
  EXPECT_EQ(d.chosen.at("loader.workers"), loader.settings.workers);
  EXPECT_EQ(d.chosen.at("loader.prefetch"), loader.settings.prefetch);
  EXPECT_EQ(d.baseline.at("loader.workers"), 0);
  EXPECT_DOUBLE_EQ(d.chosen_throughput, 32 * 1e9 / model_step_ns(loader.settings));
  LoaderSettings baseline;
  EXPECT_DOUBLE_EQ(d.baseline_throughput, 32 * 1e9 / model_step_ns(baseline));
  // The best the model allows is a 10 ms step (>= 5 workers, prefetch >= 8).
  EXPECT_GE(d.chosen_throughput, 0.95 * 32 * 1e9 / (10 * kMs));
  EXPECT_EQ(h.recording->trials.size(), d.trials.size());
  EXPECT_EQ(d.decided_at_step, steps - 1);

  const std::string log = h.log();
  EXPECT_NE(log.find("autotune decision"), std::string::npos) << log;
  EXPECT_EQ(count_of(log, "autotune trial ["), d.trials.size()) << log;

  // The epoch summary carries the loader's counters for the epoch.
  ASSERT_EQ(pilot->epoch_summaries().size(), 1u);
  const EpochSummary& s = pilot->epoch_summaries()[0];
  ASSERT_TRUE((s.sections.get<LoaderStats>() != nullptr));
  EXPECT_EQ(s.sections.get<LoaderStats>()->batches, steps + 20);
  EXPECT_EQ(s.sections.get<LoaderStats>()->settings.workers, loader.settings.workers);
  EXPECT_EQ(s.steps, steps + 20);
  EXPECT_EQ(s.tuning_steps, steps);  // every step up to the decision ran under trials
  EXPECT_NE(log.find(std::to_string(steps) + " of these steps ran auto-tune trials"),
            std::string::npos)
      << log;

  // Destroying the pilot tells the loader.
  pilot.reset();
  EXPECT_TRUE(loader.pilot_gone);
}

TEST(PilotTest, AutotuneWithoutKnobsWarnsOnce) {
  Harness h;
  Config config = autotune_config();
  config.autotune.warmup_steps = 20;  // how long it waits for a loader to be attached
  Pilot pilot(config, h.options());
  for (int i = 0; i < 30; ++i) run_step(pilot, *h.clock, 0, 5 * kMs);
  EXPECT_TRUE(pilot.tuning_finished());
  EXPECT_TRUE(h.recording->decisions.empty());
  EXPECT_EQ(count_of(h.log(), "nothing to tune"), 1u) << h.log();
}

TEST(PilotTest, AttachingAnotherLoaderMakesTheFirstForgetThePilot) {
  Harness h;
  FakeLoader first, second;
  Pilot pilot(advise_config(), h.options());
  attach_loader(pilot, &first, first.knobs());
  attach_loader(pilot, &second, second.knobs());
  EXPECT_TRUE(first.pilot_gone);  // it must no longer report or detach itself from this pilot
  EXPECT_FALSE(second.pilot_gone);
  EXPECT_EQ(pilot.knobs().knobs().size(), 3u);  // the second loader's knobs only
}

TEST(PilotTest, DetachLoaderRemovesItsKnobs) {
  Harness h;
  FakeLoader loader;
  {
    Pilot pilot(advise_config(), h.options());
    pilot.knobs().add({"other.knob", {0, 1}, [] { return int64_t{0}; }, [](int64_t) {}});
    attach_loader(pilot, &loader, loader.knobs());
    EXPECT_EQ(pilot.knobs().knobs().size(), 4u);
    detach_loader(pilot, &loader);
    ASSERT_EQ(pilot.knobs().knobs().size(), 1u);
    EXPECT_EQ(pilot.knobs().knobs()[0].name, "other.knob");
    run_step(pilot, *h.clock, 0, kMs);
    pilot.end_epoch();
    EXPECT_EQ(pilot.epoch_summaries()[0].sections.get<LoaderStats>(), nullptr);
  }
  EXPECT_FALSE(loader.pilot_gone);  // detached first: not told
}

TEST(PilotTest, JsonLinesRecordsAreValidJsonWithDocumentedTypes) {
  TempDir dir;
  const std::string path = dir.file("records.jsonl");
  Harness h;
  FakeLoader loader;
  Config config = autotune_config();
  config.log.json_path = path;
  int64_t steps = 0;
  size_t trials = 0;
  {
    Pilot pilot(config, h.options());
    attach_loader(pilot, &loader, loader.knobs());
    while (!pilot.tuning_finished() && steps < 1000) {
      run_model_step(pilot, *h.clock, loader);
      ++steps;
    }
    for (int i = 0; i < 5; ++i, ++steps) run_model_step(pilot, *h.clock, loader);
    pilot.end_epoch();
    ASSERT_TRUE(pilot.tuning_decision().has_value());
    trials = pilot.tuning_decision()->trials.size();
  }
  std::ifstream in(path);
  ASSERT_TRUE(in.good());
  std::map<std::string, int64_t> counts;
  std::string line;
  int64_t expected_step = 0;
  while (std::getline(in, line)) {
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(line)) << line;
    ASSERT_TRUE(j.is_object()) << line;
    ASSERT_TRUE(j.contains("type")) << line;
    EXPECT_EQ(j.at("v"), 1) << line;
    const std::string type = j.at("type");
    ++counts[type];
    if (type == "step") {
      EXPECT_EQ(j.at("step").get<int64_t>(), expected_step++);
      EXPECT_GT(j.at("step_ms").get<double>(), 0.0);
      EXPECT_EQ(j.at("samples").get<int64_t>(), 32);
    } else if (type == "epoch") {
      EXPECT_EQ(j.at("steps").get<int64_t>(), steps);
      EXPECT_TRUE(j.at("loader").is_object());
      EXPECT_TRUE(j.at("advice").is_array());
    } else if (type == "tuning_trial") {
      EXPECT_TRUE(j.at("setting").contains("loader.workers")) << line;
      EXPECT_TRUE(j.contains("kept"));
    } else if (type == "tuning_decision") {
      EXPECT_EQ(j.at("trials").size(), trials);
      EXPECT_GT(j.at("chosen_throughput").get<double>(), j.at("baseline_throughput").get<double>());
      EXPECT_EQ(j.at("unit"), "samples/s");
    }
  }
  EXPECT_EQ(counts["step"], steps);
  EXPECT_EQ(counts["epoch"], 1);
  EXPECT_EQ(counts["tuning_trial"], static_cast<int64_t>(trials));
  EXPECT_EQ(counts["tuning_decision"], 1);
  EXPECT_EQ(counts["run"], 1);
  EXPECT_EQ(counts.size(), 5u) << "only the documented record types";
}

TEST(PilotTest, InvalidUtf8InRecordsIsReplacedNotThrown) {
  StepRecord r;
  r.end_ns = kMs;
  const std::vector<std::string> names = {"fwd\xff\xfe"};  // not UTF-8
  std::string line;
  ASSERT_NO_THROW(line = step_json(r, names));
  EXPECT_TRUE(nlohmann::json::accept(line));
  TrialResult t;
  t.failed = true;
  t.note = "cannot open /data/caf\xe9.bin";  // a Latin-1 path in an error message
  EXPECT_TRUE(nlohmann::json::accept(trial_json(t, false)));
}

TEST(PilotTest, ReMeasurementTrialsAreMarkedInLogAndRecords) {
  TrialResult t;
  t.setting = {{"loader.workers", 4}};
  t.throughput = 3000;
  t.unit = "samples/s";
  EXPECT_EQ(format_trial(t, false).rfind("autotune trial [loader.workers=4]: ", 0), 0u);
  EXPECT_FALSE(nlohmann::json::parse(trial_json(t, false))["confirmation"].get<bool>());
  t.confirmation = true;
  EXPECT_EQ(format_trial(t, false).rfind("autotune trial [loader.workers=4] re-measurement: ", 0),
            0u)
      << format_trial(t, false);
  EXPECT_TRUE(nlohmann::json::parse(trial_json(t, false))["confirmation"].get<bool>());
  t.failed = true;
  t.note = "out of memory";
  EXPECT_EQ(format_trial(t, false),
            "autotune trial [loader.workers=4] re-measurement failed: out of memory");
}

TEST(PilotTest, RecordFormattersAreSingleLineJson) {
  StepRecord r;
  r.step = 3;
  r.begin_ns = 0;
  r.end_ns = 12 * kMs;
  r.data_wait_ns = 3 * kMs;
  r.phase_ns[0] = 4 * kMs;
  const std::string s = step_json(r, {"forward \"quoted\"\n"});
  EXPECT_EQ(s.find('\n'), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(s);
  EXPECT_DOUBLE_EQ(j.at("step_ms").get<double>(), 12.0);
  EXPECT_DOUBLE_EQ(j.at("data_wait_ms").get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(j.at("phases_ms").at("forward \"quoted\"\n").get<double>(), 4.0);
}

}  // namespace
}  // namespace torchpilot

namespace torchpilot {
namespace {

// Under ASan or TSan (scripts/sanitize.sh) resident memory is not the program's: ASan holds freed
// blocks back in its quarantine (up to 256 MiB by default) and both map shadow memory. There the
// soak test bounds the heap the program holds live instead, as the sanitizer's allocator counts
// it (freed blocks in the quarantine not included): the same claim, measured without the noise.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TORCHPILOT_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TORCHPILOT_SANITIZER_ALLOCATOR 1
#endif
#endif
#ifdef TORCHPILOT_SANITIZER_ALLOCATOR
extern "C" size_t __sanitizer_get_current_allocated_bytes();
const char* const kMemoryMeasure = "live heap (sanitizer allocator)";
long memory_kib() { return static_cast<long>(__sanitizer_get_current_allocated_bytes() / 1024); }
#else
const char* const kMemoryMeasure = "resident memory";
// Resident set size of this process, from /proc (Linux).
long memory_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}
#endif

// The memory budget: a million steps do not grow memory. The step history is a ring buffer and
// epoch statistics are fixed-size histograms. A first epoch, ended, comes before the baseline:
// the ring buffer fills, and what the first step and the first epoch's summary allocate once
// (advisors, sinks, the logger, the allocator's own pools) is not counted as growth per step.
TEST(PilotSoak, AMillionStepsKeepMemoryBounded) {
  auto clock = std::make_shared<ManualClock>(0);
  Config config;
  config.log.level = "off";
  PilotOptions options;
  options.clock = clock;
  Pilot pilot(config, options);
  const int forward = pilot.phase_id("forward");
  auto run = [&](int steps) {
    for (int i = 0; i < steps; ++i) {
      pilot.record_data_wait(100);
      auto step = pilot.step(32);
      {
        auto p = pilot.phase(forward);
        clock->advance(1000);
      }
      clock->advance(500);
    }
  };
  constexpr int kWarmup = 100000;  // well past the ring buffer's capacity
  ASSERT_GT(kWarmup, config.records.step_history);
  run(kWarmup);
  pilot.end_epoch();
  const long before = memory_kib();
  ASSERT_GT(before, 0);
  for (int epoch = 0; epoch < 4; ++epoch) {  // a million steps in four epochs
    run(250000);
    pilot.end_epoch();
  }
  const long after = memory_kib();
  EXPECT_EQ(pilot.steps(), kWarmup + 1000000);
  EXPECT_EQ(pilot.recent_steps().size(), static_cast<size_t>(config.records.step_history));
  EXPECT_LT(after - before, 1024) << kMemoryMeasure << " grew by " << (after - before)
                                  << " KiB over a million steps (from " << before << " KiB)";
}

struct LateSeen {
  static constexpr const char* kSectionName = "late_seen";
  static constexpr const char* kRecordType = "late_seen_step";
  int64_t step = 0;
};
std::string section_json(const LateSeen& s) { return nlohmann::json{{"step", s.step}}.dump(); }
void section_text(const LateSeen&, const EpochSummary&, std::vector<std::string>&) {}

// Publishes a late record for the step before each one that ends (as the GPU monitor does).
class LatePublisher final : public Collector {
 public:
  std::string name() const override { return "late"; }
  unsigned step_hooks() const override { return kHookStepEnd; }
  void attach(CollectorHost* host) override { host_ = host; }
  void on_step_end(StepRecord& r) override {
    if (host_ != nullptr && publish && r.step > 0) {
      host_->publish(make_late_step(r.step - 1, r.epoch, LateSeen{r.step - 1}));
    }
  }
  bool publish = false;

 private:
  CollectorHost* host_ = nullptr;
};

TEST(PilotTest, ShortStepsReachTheSinksInBatchesInOrder) {
  Harness h;
  Pilot pilot(advise_config(), h.options());
  for (int i = 0; i < 40; ++i) run_step(pilot, *h.clock, 0, 1 * kMs);  // below 5 ms
  // Batches of 32: the first 32 steps are out, the rest wait.
  ASSERT_EQ(h.recording->steps.size(), 32u);
  EXPECT_EQ(pilot.recent_steps().size(), 40u) << "the history includes the waiting steps";
  EXPECT_EQ(h.recording->steps.size(), 40u) << "recent_steps() took them first";
  pilot.flush();
  ASSERT_EQ(h.recording->steps.size(), 40u);
  for (size_t i = 0; i < 40; ++i) EXPECT_EQ(h.recording->steps[i].step, static_cast<int64_t>(i));
  run_step(pilot, *h.clock, 0, 1 * kMs);
  pilot.end_epoch();  // an epoch's end takes its steps first
  EXPECT_EQ(h.recording->steps.size(), 41u);
  ASSERT_EQ(h.recording->epochs.size(), 1u);
  EXPECT_EQ(h.recording->epochs[0].steps, 41);
}

TEST(PilotTest, AnEpochEndCountsTheShortStepsItTakesAsItsOwn) {
  Harness h;
  Pilot pilot(advise_config(), h.options());
  for (int i = 0; i < 5; ++i) run_step(pilot, *h.clock, 0, 1 * kMs);
  EXPECT_EQ(h.recording->steps.size(), 0u);
  pilot.end_epoch();
  EXPECT_EQ(h.recording->steps.size(), 5u);
  ASSERT_EQ(h.recording->epochs.size(), 1u);
  const auto* cost = h.recording->epochs[0].sections.get<CostStats>();
  ASSERT_NE(cost, nullptr);
  const bool has_steps = std::any_of(cost->epoch_end_parts.begin(), cost->epoch_end_parts.end(),
                                     [](const auto& p) { return p.first == "steps"; });
  EXPECT_TRUE(has_steps) << "the batch taken at the epoch end is a part of its time";
}

TEST(PilotTest, LongStepsReachTheSinksAtOnce) {
  Harness h;
  Pilot pilot(advise_config(), h.options());
  for (int i = 0; i < 3; ++i) {
    run_step(pilot, *h.clock, 0, 6 * kMs);
    EXPECT_EQ(h.recording->steps.size(), static_cast<size_t>(i + 1));
  }
}

TEST(PilotTest, ALateRecordComesAfterItsStep) {
  Harness h;
  auto late = std::make_shared<LatePublisher>();
  late->publish = true;
  PilotOptions o = h.options();
  o.collectors.push_back(late);
  o.default_collectors = false;
  Pilot pilot(advise_config(), std::move(o));
  for (int i = 0; i < 5; ++i) run_step(pilot, *h.clock, 0, 1 * kMs);
  // Each late record (for step n - 1, published at step n's end) found step n - 1 delivered.
  ASSERT_EQ(h.recording->late_steps.size(), 4u);
  EXPECT_EQ(h.recording->steps.size(), 4u);
  for (const auto& r : h.recording->late_steps) EXPECT_LT(r.step, 4);
}

// Writes down the order of its calls ("e3": on_step_end of step 3, "r3": on_step_record, "c3":
// on_step_complete, "L3": a late record of step 3 reached the sink), and can ask for steps at
// once, publish late records from on_step_record, and take time there.
class OrderSink final : public Sink {
 public:
  explicit OrderSink(std::vector<std::string>* log) : log_(log) {}
  std::string name() const override { return "order"; }
  void on_step(const StepRecord& r, const std::vector<std::string>&) override {
    log_->push_back("s" + std::to_string(r.step));
  }
  void on_late_step(const LateStepRecord& r) override {
    log_->push_back("L" + std::to_string(r.step));
  }
  void on_epoch(const EpochSummary&, const std::vector<Advice>&) override {}

 private:
  std::vector<std::string>* log_;
};

class RecordCollector final : public Collector {
 public:
  explicit RecordCollector(std::vector<std::string>* log) : log_(log) {}
  std::string name() const override { return "record"; }
  unsigned step_hooks() const override {
    return kHookStepEnd | kHookStepRecord | kHookStepComplete;
  }
  void attach(CollectorHost* host) override { host_ = host; }
  void on_step_end(StepRecord& r) override {
    log_->push_back("e" + std::to_string(r.step));
    if (host_ != nullptr && r.step == take_now_at) host_->take_step_now();
  }
  void on_step_record(StepRecord& r) override {
    log_->push_back("r" + std::to_string(r.step));
    r.metrics.set("test", "step", static_cast<double>(r.step));
    if (host_ != nullptr && publish)
      host_->publish(make_late_step(r.step, r.epoch, LateSeen{r.step}));
    if (clock != nullptr) clock->advance(record_ns);
  }
  void on_step_complete(const StepRecord& r) override {
    log_->push_back("c" + std::to_string(r.step));
    EXPECT_EQ(r.metrics.get("test", "step"), static_cast<double>(r.step))
        << "on_step_complete sees what on_step_record added";
  }
  int64_t take_now_at = -1;
  bool publish = false;
  ManualClock* clock = nullptr;
  Nanos record_ns = 0;

 private:
  std::vector<std::string>* log_;
  CollectorHost* host_ = nullptr;
};

size_t position(const std::vector<std::string>& log, const std::string& what) {
  const auto it = std::find(log.begin(), log.end(), what);
  return it == log.end() ? log.size() : static_cast<size_t>(it - log.begin());
}

TEST(PilotTest, StepRecordsComeInOrderBeforeTheStepIsCompleteAndInBatches) {
  Harness h;
  std::vector<std::string> log;
  PilotOptions o = h.options({std::make_shared<OrderSink>(&log)});
  o.collectors.push_back(std::make_shared<RecordCollector>(&log));
  o.default_collectors = false;
  Pilot pilot(advise_config(), std::move(o));
  for (int i = 0; i < 31; ++i) run_step(pilot, *h.clock, 0, 1 * kMs);
  EXPECT_EQ(position(log, "r0"), log.size()) << "short steps wait for their batch";
  run_step(pilot, *h.clock, 0, 1 * kMs);
  for (int i = 0; i < 32; ++i) {
    const std::string n = std::to_string(i);
    ASSERT_LT(position(log, "e" + n), position(log, "r" + n)) << i;
    ASSERT_LT(position(log, "r" + n), position(log, "c" + n)) << i;
    ASSERT_LT(position(log, "c" + n), position(log, "s" + n)) << i;
    if (i > 0) ASSERT_LT(position(log, "r" + std::to_string(i - 1)), position(log, "r" + n));
  }
  run_step(pilot, *h.clock, 0, 6 * kMs);  // a long step: all of it at once
  EXPECT_LT(position(log, "s32"), log.size());
}

TEST(PilotTest, ACollectorCanHaveTheEndingStepTakenAtOnce) {
  Harness h;
  std::vector<std::string> log;
  auto c = std::make_shared<RecordCollector>(&log);
  c->take_now_at = 3;
  PilotOptions o = h.options({std::make_shared<OrderSink>(&log)});
  o.collectors.push_back(c);
  o.default_collectors = false;
  Pilot pilot(advise_config(), std::move(o));
  for (int i = 0; i < 3; ++i) run_step(pilot, *h.clock, 0, 1 * kMs);
  EXPECT_EQ(h.recording->steps.size(), 0u);
  run_step(pilot, *h.clock, 0, 1 * kMs);
  // Step 3 and the steps that waited before it, in order.
  ASSERT_EQ(h.recording->steps.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(h.recording->steps[i].step, i);
  run_step(pilot, *h.clock, 0, 1 * kMs);
  EXPECT_EQ(h.recording->steps.size(), 4u) << "only the step that asked";
}

TEST(PilotTest, ALateRecordPublishedWhileStepsAreTakenComesAfterThem) {
  Harness h;
  std::vector<std::string> log;
  auto c = std::make_shared<RecordCollector>(&log);
  c->publish = true;  // its own step's, from on_step_record: before the step reached the sinks
  PilotOptions o = h.options({std::make_shared<OrderSink>(&log)});
  o.collectors.push_back(c);
  o.default_collectors = false;
  Pilot pilot(advise_config(), std::move(o));
  for (int i = 0; i < 40; ++i) run_step(pilot, *h.clock, 0, i % 2 == 0 ? 1 * kMs : 6 * kMs);
  pilot.flush();
  for (int i = 0; i < 40; ++i) {
    const std::string n = std::to_string(i);
    ASSERT_LT(position(log, "L" + n), log.size()) << i;
    EXPECT_LT(position(log, "s" + n), position(log, "L" + n)) << i;
  }
}

TEST(PilotTest, AStepRecordsTimeIsItsCollectorsPartOfTheStepCalls) {
  Harness h;
  std::vector<std::string> log;
  auto c = std::make_shared<RecordCollector>(&log);
  c->clock = h.clock.get();
  c->record_ns = 100000;  // 0.1 ms a step, in batches of 32
  PilotOptions o = h.options();
  o.collectors.push_back(c);
  o.default_collectors = false;
  Pilot pilot(advise_config(), std::move(o));
  for (int i = 0; i < 64; ++i) run_step(pilot, *h.clock, 0, 1 * kMs);
  pilot.end_epoch();
  ASSERT_EQ(h.recording->epochs.size(), 1u);
  const auto* cost = h.recording->epochs[0].sections.get<CostStats>();
  ASSERT_NE(cost, nullptr);
  Nanos part = -1;
  for (const auto& [name, ns] : cost->step_parts) {
    if (name == "record") part = ns;
  }
  EXPECT_EQ(part, 64 * 100000) << "two batches of 32, timed as the collector's";
}

// Writes "<letter><step>" at each on_step_end it gets; marks the steps in `periods` at a period
// (as the stall tracker does) and those in `probes` probe_syncs (as the GPU monitor after a
// window); sets its hooks to 0 at step `quiet_after` and to every step end at `every_from`.
class StepEndLogger final : public Collector {
 public:
  StepEndLogger(std::vector<std::string>* log, char letter, unsigned hooks)
      : log_(log), letter_(letter), hooks_(hooks) {}
  std::string name() const override { return std::string(1, letter_); }
  unsigned step_hooks() const override { return hooks_; }
  void attach(CollectorHost* host) override { host_ = host; }
  void on_step_end(StepRecord& r) override {
    log_->push_back(letter_ + std::to_string(r.step));
    if (std::find(periods.begin(), periods.end(), r.step) != periods.end()) r.at_period = true;
    if (std::find(probes.begin(), probes.end(), r.step) != probes.end()) r.probe_syncs = true;
    if (host_ == nullptr) return;
    if (r.step == quiet_after) host_->set_step_hooks(*this, 0);
    if (r.step == every_from) host_->set_step_hooks(*this, kHookStepEnd);
  }
  std::vector<int64_t> periods, probes;
  int64_t quiet_after = -1, every_from = -1;

 private:
  std::vector<std::string>* log_;
  char letter_;
  unsigned hooks_;
  CollectorHost* host_ = nullptr;
};

TEST(PilotTest, ACollectorIsCalledOnlyAtTheStepHooksItSetsAndAtPeriodStepsWhenItAsks) {
  Harness h;
  std::vector<std::string> log;
  auto marker = std::make_shared<StepEndLogger>(&log, 'm', kHookStepEnd);
  marker->periods = {2};
  marker->probes = {5};  // a probe asked for brings the listener as a period does
  marker->quiet_after = 7;
  auto listener = std::make_shared<StepEndLogger>(&log, 'p', kHookPeriodStepEnd);
  listener->every_from = 5;
  PilotOptions o = h.options();
  o.collectors = {marker, listener};
  o.default_collectors = false;
  Pilot pilot(advise_config(), std::move(o));
  for (int i = 0; i < 10; ++i) run_step(pilot, *h.clock, 0, 1 * kMs);
  const std::vector<std::string> want = {"m0", "m1", "m2", "p2", "m3", "m4", "m5",
                                         "p5", "m6", "p6", "m7", "p7", "p8", "p9"};
  EXPECT_EQ(log, want) << "the listener at the marked steps (2, 5), then at every step from its "
                          "own request; the marker not after it set no hooks (step 7)";
}

// Declares only on_step_end at first; hands the test its host (the Pilot is one privately).
struct LateHookCollector final : Collector {
  std::string name() const override { return "late_hook"; }
  unsigned step_hooks() const override { return kHookStepEnd; }
  void attach(CollectorHost* h) override { host = h; }
  CollectorHost* host = nullptr;
};

TEST(PilotTest, LateStepsAreWantedWhileASinkOrACollectorWithTheHookReadsThem) {
  Harness h;
  auto quiet = std::make_shared<test::LateSink>(false);
  PilotOptions o;
  o.clock = h.clock;
  o.sinks = {quiet};
  o.default_collectors = false;
  Pilot pilot(advise_config(), std::move(o));
  auto collector = std::make_shared<LateHookCollector>();
  pilot.add_collector(collector);
  CollectorHost& host = *collector->host;
  EXPECT_FALSE(host.late_steps_wanted()) << "the advisory log and this sink read none";
  host.set_step_hooks(*collector, kHookStepEnd | kHookLateStep);
  EXPECT_TRUE(host.late_steps_wanted());
  host.set_step_hooks(*collector, kHookStepEnd);
  EXPECT_FALSE(host.late_steps_wanted());
  pilot.add_sink(std::make_shared<test::LateSink>(true));
  EXPECT_TRUE(host.late_steps_wanted());
}
}  // namespace
}  // namespace torchpilot
