// Every guard in the Pilot has a test that fails when the guard is removed (issue 41, item 16).
// A guard's test drives the code it protects with a fault; the guards and their tests:
//
//   pilot.cpp       GuardedClock (the program's clock)       GuardPaths.ACustomClockThatThrows...
//                   GuardedClock (the program's CPU clock)   ACpuClockThatThrows...
//                   the config resolvers                     AConfigResolverThatThrows...
//                   ~Pilot: the last period                  APilotWhoseLastPeriodFails...
//                   ~Pilot: on_close (for_each_collector)    ACollectorThatThrowsInOnClose...
//                   ~Pilot: detaching the collectors         ACollectorThatThrowsWhenDetached...
//                   end_step: the tuner's on_step            ATunerThatThrowsInAStep...
//   pilot_internal  for_each_collector                       FaultInjection.ACollectorThatThrows...
//                   for_each_sink                            FaultInjection.ASinkThatThrows...
//   pilot_hosting   start(): default collector factories     ADefaultCollectorFactoryThatThrows...
//                   start(): default sink factories          ADefaultSinkFactoryThatThrows...
//                   insert_collector: attach                 FaultInjection.ACollectorThatThrows...
//                   insert_collector: detach after that      ACollectorThatThrowsOnEveryAttach...
//                   drop_collector: detach                   ACollectorThatThrowsWhenDropped...
//                   insert_collector: step_hooks             ACollectorWhoseStepHooksThrow...
//                   knobs_changed, fail_trial (the tuner)    ATunerThatThrowsWhenKnobsChange...,
//                                                            ATunerThatThrowsFailingATrial...
//                   stop_tuning: abandon                     ATunerThatThrowsInAStep...
//   pilot_periods   close_interval: the ranks' agreement     IntervalTest.RanksThatCannotAgree...
//                   end_period: the epoch's summary          AnEpochSummaryThatThrowsIsSkipped...
//                   summarize_epoch: the advisors            AnAdvicePassThatThrows...
//   guard.h         name_of                                  GuardPaths.*WhoseNameThrows*
//
// failure_of's own inner guards (describing the exception) and the summary's guard against the
// Pilot's own errors (an allocation failing) are reached only by an allocation failure: untested.
//
// Collectors and sinks are caught by their own guards first: the summary's guard is reached by
// the one part it calls bare, the cost meter (register_cost_meter). Global registrations made
// here do nothing until a test arms them (Armed).
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include "fakes/pilot_parts.h"
#include "fakes/text.h"
#include "torchpilot/runtime/core/advisor_registry.h"
#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/cost_meter.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/core/tuning.h"

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1'000'000;

// The fault one test arms; the fakes below throw only at theirs.
enum class Fault {
  kNone,
  kResolver,
  kCollectorFactory,
  kSinkFactory,
  kAdvicePass,
  kMeterSummary,
  kMeterEpochEnd,
  kTunerStep,
  kTunerStepAndAbandon,
  kTunerKnobs,
  kTunerFailTrial,
};
Fault g_fault = Fault::kNone;

struct Armed {
  explicit Armed(Fault f) { g_fault = f; }
  ~Armed() { g_fault = Fault::kNone; }
  Armed(const Armed&) = delete;
  Armed& operator=(const Armed&) = delete;
};

void fail_at(Fault f, const char* what) {
  if (g_fault == f) throw std::runtime_error(what);
}

const bool kRegistered = [] {
  register_config_resolver(
      [](Config&, spdlog::logger&, bool) { fail_at(Fault::kResolver, "resolver boom"); });
  register_default_collector(
      "guard-test", 1000,
      [](CollectorHost&) -> std::unique_ptr<Collector> {
        if (g_fault == Fault::kCollectorFactory) throw 42;  // not even a std::exception
        return nullptr;
      },
      /*always=*/true);
  register_default_sink(
      "guard-test", 1000,
      [](const Config&, const std::shared_ptr<spdlog::logger>&) -> std::shared_ptr<Sink> {
        fail_at(Fault::kSinkFactory, "sink factory boom");
        return nullptr;
      });
  register_advice_pass(
      [](std::vector<Advice>&, const EpochSummary&) { fail_at(Fault::kAdvicePass, "pass boom"); });
  return true;
}();

struct Rig : test::PilotParts {
  explicit Rig(Config c = {}, std::vector<std::shared_ptr<Collector>> collectors = {}) {
    c.gpu.enabled = false;
    PilotOptions o = options("guards");
    o.collectors = std::move(collectors);
    o.default_collectors = false;
    pilot = std::make_unique<Pilot>(std::move(c), std::move(o));
  }
  void steps(int n) {
    for (int i = 0; i < n; ++i) {
      auto s = pilot->step(8);
      clock->advance(10 * kMs);
    }
  }
  size_t count(const std::string& text) const { return test::count_of(log.str(), text); }
};

TEST(PilotGuards, AConfigResolverThatThrowsIsLoggedAndTheStartGoesOn) {
  ASSERT_TRUE(kRegistered);
  Armed armed(Fault::kResolver);
  std::unique_ptr<Rig> rig;
  ASSERT_NO_THROW(rig = std::make_unique<Rig>());
  EXPECT_EQ(rig->count("a setting could not be resolved: resolver boom"), 1u) << rig->log.str();
  rig->steps(2);
  EXPECT_EQ(rig->sink->steps.size(), 2u);
}

TEST(PilotGuards, ADefaultCollectorFactoryThatThrowsLeavesItOut) {
  Armed armed(Fault::kCollectorFactory);
  std::unique_ptr<Rig> rig;
  ASSERT_NO_THROW(rig = std::make_unique<Rig>());
  EXPECT_EQ(rig->count("a default collector failed to start"), 1u) << rig->log.str();
  rig->steps(2);
  EXPECT_NO_THROW(rig->pilot->end_epoch());
  EXPECT_EQ(rig->sink->epochs.size(), 1u);
}

TEST(PilotGuards, ADefaultSinkFactoryThatThrowsLeavesItOut) {
  Armed armed(Fault::kSinkFactory);
  std::unique_ptr<Rig> rig;
  ASSERT_NO_THROW(rig = std::make_unique<Rig>());
  EXPECT_EQ(rig->count("sink 'guard-test' failed to start: sink factory boom"), 1u)
      << rig->log.str();
  rig->steps(2);
  EXPECT_EQ(rig->sink->steps.size(), 2u);
}

TEST(PilotGuards, AnAdvicePassThatThrowsLosesTheAdviceNotTheSummary) {
  Rig rig;
  rig.steps(3);
  {
    Armed armed(Fault::kAdvicePass);
    EXPECT_NO_THROW(rig.pilot->end_epoch());
  }
  EXPECT_EQ(rig.count("advisors failed for epoch 0: pass boom"), 1u) << rig.log.str();
  ASSERT_EQ(rig.sink->epochs.size(), 1u) << "the summary still reaches the sinks";
  EXPECT_TRUE(rig.sink->advice[0].empty());
}

// A cost meter (the library's own is registered by runtime/cost) that throws where armed.
class ThrowingMeter final : public CostMeter {
 public:
  void summarize(EpochSummary&, Nanos, Nanos, std::vector<std::pair<std::string, Nanos>>,
                 const std::vector<Collector*>&) override {
    fail_at(Fault::kMeterSummary, "meter summary boom");
  }
  void epoch_end_finished(Nanos, Nanos, Nanos) override {
    fail_at(Fault::kMeterEpochEnd, "meter end boom");
  }
};

// Registers ThrowingMeter for the Pilots made in its lifetime, then the meter before it again.
struct WithThrowingMeter {
  WithThrowingMeter() : before(cost_meter_factory()) {
    register_cost_meter([](const Config&) -> std::unique_ptr<CostMeter> {
      return std::make_unique<ThrowingMeter>();
    });
  }
  ~WithThrowingMeter() { register_cost_meter(before); }
  CostMeterFactory before;
};

TEST(PilotGuards, AnEpochSummaryThatThrowsIsSkippedAndTheNextOneComes) {
  WithThrowingMeter meter;
  Rig rig;
  rig.steps(3);
  {
    Armed armed(Fault::kMeterSummary);
    EXPECT_NO_THROW(rig.pilot->end_epoch());
  }
  EXPECT_EQ(rig.count("the summary of epoch 0 failed and is skipped: meter summary boom"), 1u)
      << rig.log.str();
  EXPECT_TRUE(rig.sink->epochs.empty());
  EXPECT_NO_THROW(rig.steps(3));
  EXPECT_NO_THROW(rig.pilot->end_epoch());
  ASSERT_EQ(rig.sink->epochs.size(), 1u);
  EXPECT_EQ(rig.sink->epochs[0].epoch, 1);
  EXPECT_EQ(rig.sink->steps.size(), 6u);
}

// Counts the calls it gets at the Pilot's end; throws from the one it is told to.
class Closing final : public Collector {
 public:
  Closing(std::string name, bool throw_on_close, bool throw_on_detach)
      : name_(std::move(name)), close_(throw_on_close), detach_(throw_on_detach) {}
  std::string name() const override { return name_; }
  void attach(CollectorHost* host) override {
    if (host == nullptr) {
      ++detached;
      if (detach_) throw std::runtime_error("detach boom");
    }
  }
  void on_step_end(StepRecord&) override {
    if (throw_at_step) throw std::runtime_error("step boom");
  }
  void on_close() override {
    ++closed;
    if (close_) throw std::runtime_error("close boom");
  }
  int closed = 0;
  int detached = 0;
  bool throw_at_step = false;

 private:
  std::string name_;
  bool close_;
  bool detach_;
};

TEST(PilotGuards, APilotWhoseLastPeriodFailsStillClosesItsCollectors) {
  WithThrowingMeter meter;
  auto c = std::make_shared<Closing>("closing", false, false);
  Armed armed(Fault::kMeterEpochEnd);
  {
    Rig rig({}, {c});
    rig.steps(3);
    rig.pilot.reset();  // the last period's end throws, in a destructor
  }
  EXPECT_EQ(c->closed, 1);
  EXPECT_EQ(c->detached, 1);
}

TEST(PilotGuards, ACollectorThatThrowsInOnCloseDoesNotKeepTheOthersOpen) {
  auto bad = std::make_shared<Closing>("bad-close", true, false);
  auto good = std::make_shared<Closing>("good", false, false);
  std::ostringstream log;
  {
    Rig rig({}, {bad, good});
    rig.steps(2);
    rig.pilot.reset();
    log << rig.log.str();
  }
  EXPECT_EQ(good->closed, 1);
  EXPECT_EQ(good->detached, 1);
  EXPECT_EQ(test::count_of(log.str(), "collector 'bad-close' failed in on_close and is removed"),
            1u)
      << log.str();
}

TEST(PilotGuards, ACollectorThatThrowsWhenDetachedAtTheEndIsLetGo) {
  auto bad = std::make_shared<Closing>("bad-detach", false, true);
  auto good = std::make_shared<Closing>("good", false, false);
  {
    Rig rig({}, {bad, good});
    rig.steps(2);
  }  // ~Pilot detaches both: the first throws
  EXPECT_EQ(bad->detached, 1);
  EXPECT_EQ(good->detached, 1);
}

TEST(PilotGuards, ACollectorThatThrowsWhenDroppedIsDroppedAllTheSame) {
  auto bad = std::make_shared<Closing>("bad-drop", false, true);
  bad->throw_at_step = true;
  Rig rig({}, {bad});
  EXPECT_NO_THROW(rig.steps(3));  // dropped at the first step; detaching it throws too
  EXPECT_EQ(rig.count("collector 'bad-drop' failed in on_step_end and is removed"), 1u)
      << rig.log.str();
  EXPECT_EQ(bad->detached, 1);
  EXPECT_EQ(rig.sink->steps.size(), 3u);
}

class NeverAttaches final : public Collector {
 public:
  std::string name() const override { return "never-attaches"; }
  void attach(CollectorHost*) override { throw std::runtime_error("attach boom"); }
};

TEST(PilotGuards, ACollectorThatThrowsOnEveryAttachIsNotUsed) {
  std::unique_ptr<Rig> rig;
  ASSERT_NO_THROW(rig = std::make_unique<Rig>(Config{}, std::vector<std::shared_ptr<Collector>>{
                                                            std::make_shared<NeverAttaches>()}));
  EXPECT_EQ(rig->count("collector 'never-attaches' failed to attach and is not used"), 1u)
      << rig->log.str();
  NeverAttaches later;
  EXPECT_NO_THROW(rig->pilot->add_collector(&later));
  EXPECT_NO_THROW(rig->steps(2));
}

// A tuner (the library's own is registered by runtime/tune) that throws where armed.
class ThrowingTuner final : public Tuner {
 public:
  void on_step(const StepRecord&) override {
    if (g_fault == Fault::kTunerStep || g_fault == Fault::kTunerStepAndAbandon)
      throw std::runtime_error("tuner step boom");
  }
  bool finished() const override { return false; }
  const std::optional<TuningDecision>& decision() const override { return decision_; }
  void abandon(const std::string&) override {
    fail_at(Fault::kTunerStepAndAbandon, "abandon boom");
  }
  bool fail_trial(const std::string&) override {
    fail_at(Fault::kTunerFailTrial, "fail_trial boom");
    return true;
  }
  void set_memory_probe(MemoryProbe) override {}
  void set_agreement(TrialAgreement) override {}
  void knobs_changed() override { fail_at(Fault::kTunerKnobs, "knobs boom"); }

 private:
  std::optional<TuningDecision> decision_;
};

struct WithThrowingTuner {
  WithThrowingTuner() : before(tuner_factory()) {
    register_tuner(
        [](TunerHost&) -> std::unique_ptr<Tuner> { return std::make_unique<ThrowingTuner>(); });
  }
  ~WithThrowingTuner() { register_tuner(before); }
  TunerFactory before;
};

Config autotune() {
  Config c;
  c.mode = Mode::kAutotune;
  return c;
}

TEST(PilotGuards, ATunerThatThrowsInAStepStopsTuningNotTheStep) {
  WithThrowingTuner tuner;
  for (Fault f : {Fault::kTunerStep, Fault::kTunerStepAndAbandon}) {
    Rig rig(autotune());
    ASSERT_EQ(rig.pilot->mode(), Mode::kAutotune);
    Armed armed(f);
    EXPECT_NO_THROW(rig.steps(3));
    EXPECT_EQ(rig.count("autotune stopped after an internal error: tuner step boom"), 1u)
        << rig.log.str();
    EXPECT_EQ(rig.pilot->mode(), Mode::kAdvise);
    EXPECT_EQ(rig.sink->steps.size(), 3u);
    // Restoring the best setting throws too: one more line, and still no throw.
    EXPECT_EQ(rig.count("autotune could not restore the best setting: abandon boom"),
              f == Fault::kTunerStepAndAbandon ? 1u : 0u)
        << rig.log.str();
  }
}

TEST(PilotGuards, ATunerThatThrowsWhenKnobsChangeStopsTuning) {
  WithThrowingTuner tuner;
  Rig rig(autotune());
  Armed armed(Fault::kTunerKnobs);
  EXPECT_NO_THROW(rig.pilot->knobs_changed());
  EXPECT_EQ(rig.count("autotune stopped after an internal error: knobs boom"), 1u) << rig.log.str();
  EXPECT_EQ(rig.pilot->mode(), Mode::kAdvise);
}

TEST(PilotGuards, ATunerThatThrowsFailingATrialStopsTuning) {
  WithThrowingTuner tuner;
  Rig rig(autotune());
  Armed armed(Fault::kTunerFailTrial);
  bool failed = true;
  EXPECT_NO_THROW(failed = rig.pilot->fail_trial("out of memory"));
  EXPECT_FALSE(failed);
  EXPECT_EQ(rig.count("autotune stopped after an internal error: fail_trial boom"), 1u)
      << rig.log.str();
  EXPECT_EQ(rig.pilot->mode(), Mode::kAdvise);
}

// Throws from its fourth read on.
class FailingCpuClock final : public Clock {
 public:
  Nanos now_ns() const override {
    if (++reads_ > 3) throw std::runtime_error("cpu clock gone");
    return reads_ * kMs;
  }

 private:
  mutable int reads_ = 0;
};

TEST(PilotGuards, ACpuClockThatThrowsNeitherThrowsNorStopsTheSteps) {
  test::PilotParts parts;
  PilotOptions o = parts.options("cpu-clock");
  o.cpu_clock = std::make_shared<FailingCpuClock>();
  o.default_collectors = false;
  Config c;
  c.gpu.enabled = false;
  parts.pilot = std::make_unique<Pilot>(c, o);
  for (int i = 0; i < 10; ++i) {
    EXPECT_NO_THROW({
      auto s = parts.pilot->step(1);
      parts.clock->advance(10 * kMs);
    });
  }
  EXPECT_NO_THROW(parts.pilot->end_epoch());
  EXPECT_EQ(parts.sink->steps.size(), 10u);
  EXPECT_EQ(test::count_of(parts.log.str(), "the CPU clock failed"), 1u) << parts.log.str();
}

// Counts its per-step calls; says it implements `hooks` (or throws when asked).
class Hooked final : public Collector {
 public:
  Hooked(unsigned hooks, bool throw_hooks) : hooks_(hooks), throw_(throw_hooks) {}
  std::string name() const override { return "hooked"; }
  unsigned step_hooks() const override {
    if (throw_) throw std::runtime_error("hooks boom");
    return hooks_;
  }
  void on_step_begin(int64_t, Nanos) override { ++begins; }
  void on_phase_begin(int, const std::string&) override { ++phases; }
  void on_step_end(StepRecord&) override { ++ends; }
  void on_step_complete(const StepRecord&) override { ++completes; }
  int begins = 0, phases = 0, ends = 0, completes = 0;

 private:
  unsigned hooks_;
  bool throw_;
};

TEST(PilotGuards, ACollectorIsCalledOnlyAtTheStepHooksItNames) {
  auto end_only = std::make_shared<Hooked>(kHookStepEnd, false);
  auto all = std::make_shared<Hooked>(kAllStepHooks, false);
  Rig rig({}, {end_only, all});
  for (int i = 0; i < 3; ++i) {
    auto s = rig.pilot->step(8);
    auto p = rig.pilot->phase("forward");
    rig.clock->advance(10 * kMs);
  }
  EXPECT_EQ(end_only->ends, 3);
  EXPECT_EQ(end_only->begins + end_only->phases + end_only->completes, 0);
  EXPECT_EQ(all->begins, 3);
  EXPECT_EQ(all->phases, 3);
  EXPECT_EQ(all->ends, 3);
  EXPECT_EQ(all->completes, 3);
}

TEST(PilotGuards, ACollectorWhoseStepHooksThrowIsCalledAtEveryHook) {
  auto bad = std::make_shared<Hooked>(0, true);
  Rig rig({}, {bad});
  rig.steps(2);
  EXPECT_EQ(bad->begins, 2);
  EXPECT_EQ(bad->ends, 2);
  EXPECT_EQ(bad->completes, 2);
  EXPECT_EQ(rig.sink->steps.size(), 2u);
}

}  // namespace
}  // namespace torchpilot
