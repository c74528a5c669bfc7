// TrialEngine + the loader policy against a simulated loader whose step time is a known function
// of its knobs, so the true best setting is known by exhaustive evaluation.
#include "torchpilot/runtime/tune/trial_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/loader/loader_policy.h"
#include "torchpilot/runtime/reports/sinks.h"

namespace torchpilot {
namespace {

// A loader whose step time depends on its knobs:
//   step = max(compute, batch / max(1, workers)) + (workers == 0 ? batch : 0)
//          + (workers > 0 ? stall * max(0, 8 - prefetch) / 8 : 0)
// i.e. workers hide the batch production behind compute, and shallow prefetch leaves the queue
// dry now and then.
struct SimLoader {
  double compute_ms = 10;
  double batch_ms = 45;
  double stall_ms = 0;
  int64_t batch_size = 32;
  int64_t workers = 0;
  int64_t prefetch = 2;
  int64_t pin = 0;

  double step_ms(int64_t w, int64_t p) const {
    double ms = std::max(compute_ms, batch_ms / static_cast<double>(std::max<int64_t>(1, w)));
    if (w == 0) ms += batch_ms;
    if (w > 0) ms += stall_ms * static_cast<double>(std::max<int64_t>(0, 8 - p)) / 8.0;
    return ms;
  }
  Nanos step_ns(int64_t w, int64_t p) const {
    return static_cast<Nanos>(std::llround(step_ms(w, p) * 1e6));
  }
  // samples/s exactly as the engine computes it from a noise-free window.
  double throughput(int64_t w, int64_t p) const {
    return static_cast<double>(batch_size) * 1e9 / static_cast<double>(step_ns(w, p));
  }
  double throughput(const Setting& s) const {
    return throughput(s.at("loader.workers"), s.at("loader.prefetch"));
  }
  // The best throughput over the whole knob grid.
  double best_throughput() const {
    double best = 0;
    for (int64_t w = 0; w <= 8; ++w) {
      for (int64_t p = 1; p <= 64; ++p) best = std::max(best, throughput(w, p));
    }
    return best;
  }
};

std::vector<int64_t> range(int64_t lo, int64_t hi) {
  std::vector<int64_t> v;
  for (int64_t x = lo; x <= hi; ++x) v.push_back(x);
  return v;
}

// A knob over `domain` that reads and writes `value`.
Knob value_knob(std::string name, std::vector<int64_t> domain, int64_t& value) {
  return {std::move(name), std::move(domain), [&value] { return value; },
          [&value](int64_t v) { value = v; }};
}

void register_knobs(KnobRegistry& knobs, SimLoader& sim) {
  knobs.add(value_knob("loader.workers", range(0, 8), sim.workers));
  knobs.add(value_knob("loader.prefetch", range(1, 64), sim.prefetch));
  knobs.add(value_knob("loader.pin_memory", {0}, sim.pin));
}

// Feeds the engine steps `first`, `first` + 1, ... (below `limit`) until it decides, each starting
// where the last ended and lasting `make(i, r)` ns; `make` may fill r's other fields.
template <typename Make>
void run_steps(TrialEngine& engine, int64_t limit, Make make, int64_t first = 0) {
  Nanos now = 0;
  for (int64_t i = first; i < limit && !engine.finished(); ++i) {
    StepRecord r;
    r.step = i;
    r.begin_ns = now;
    now += make(i, r);
    r.end_ns = now;
    engine.on_step(r);
  }
}

// Feeds the engine steps whose duration follows the simulated loader's current knob values.
struct Driver {
  SimLoader& sim;
  double noise = 0;  // relative, uniform in [-noise, +noise]
  std::mt19937_64 rng{1};
  int64_t step = 0;
  Nanos now = 0;
  std::vector<std::pair<int64_t, int64_t>> ran;  // (workers, prefetch) of each step

  StepRecord next() {
    double ms = sim.step_ms(sim.workers, sim.prefetch);
    if (noise > 0) ms *= 1.0 + std::uniform_real_distribution<double>(-noise, noise)(rng);
    StepRecord r;
    r.step = step++;
    r.step_in_epoch = r.step;
    r.begin_ns = now;
    const Nanos ns = static_cast<Nanos>(std::llround(ms * 1e6));
    now += ns;
    r.end_ns = now;
    // What the step does not compute, it waits for data.
    r.data_wait_ns =
        std::max<Nanos>(0, ns - static_cast<Nanos>(std::llround(sim.compute_ms * 1e6)));
    r.samples = sim.batch_size;
    ran.emplace_back(sim.workers, sim.prefetch);
    return r;
  }

  // Steps until the engine decides (or a generous limit); returns the steps run.
  int64_t run(TrialEngine& engine, int64_t limit) {
    while (!engine.finished() && step < limit) engine.on_step(next());
    return step;
  }
};

AutotuneConfig default_autotune() {
  AutotuneConfig c;    // warm-up 200, margin 3%, prefetch {1, 2, 4, 8}
  c.settle_steps = 4;  // fixed here: step arithmetic below counts on 4 + 10 per trial
  c.measure_steps = 10;
  c.min_window_ms = 0;  // windows and budget in steps only
  c.warmup_seconds = 0;
  return c;
}

// default_autotune() with other settling and measuring windows.
AutotuneConfig autotune_windows(int64_t settle_steps, int64_t measure_steps) {
  AutotuneConfig c = default_autotune();
  c.settle_steps = settle_steps;
  c.measure_steps = measure_steps;
  return c;
}

// The simulated loader tuned by a TrialEngine: knobs registered on the loader (a test may replace
// them before start), every trial as on_trial saw it, with whether it was kept.
struct Tuning {
  explicit Tuning(SimLoader& sim, double noise = 0, uint64_t seed = 1)
      : driver{sim, noise, std::mt19937_64(seed)} {
    register_knobs(knobs, sim);
  }
  Tuning(const Tuning&) = delete;
  Tuning& operator=(const Tuning&) = delete;

  // The engine under `config`, with the loader policy unless another is given.
  TrialEngine& start(const AutotuneConfig& config, std::unique_ptr<TuningPolicy> policy = nullptr) {
    engine = std::make_unique<TrialEngine>(
        knobs, policy ? std::move(policy) : make_loader_policy(config), config);
    engine->on_trial = [this](const TrialResult& t, bool kept) { trials.push_back({t, kept}); };
    return *engine;
  }
  // Starts the engine and runs the loader until it decides (1000 steps at most); true if it did.
  bool run(const AutotuneConfig& config) {
    driver.run(start(config), 1000);
    return engine->finished();
  }
  const TuningDecision& decision() const { return *engine->decision(); }

  KnobRegistry knobs;
  std::unique_ptr<TrialEngine> engine;
  std::vector<std::pair<TrialResult, bool>> trials;
  Driver driver;
};

TEST(TrialEngineTest, ReachesBestThroughputWithinWarmup) {
  SimLoader sim;
  sim.stall_ms = 3;
  Tuning tuning(sim);
  const AutotuneConfig config = default_autotune();
  ASSERT_TRUE(tuning.run(config));
  const TuningDecision& d = tuning.decision();
  const Driver& driver = tuning.driver;
  EXPECT_LE(d.steps_used, config.warmup_steps);
  EXPECT_LT(d.decided_at_step, config.warmup_steps);
  EXPECT_EQ(driver.step, d.decided_at_step + 1);
  EXPECT_EQ(d.policy, "loader coordinate search");
  EXPECT_EQ(d.unit, "samples/s");
  // The search ended, then its finalists were re-measured (as far as the budget allowed).
  EXPECT_EQ(d.reason.rfind("search complete; top ", 0), 0u) << d.reason;

  // The chosen setting is applied and reaches >= 95% of the grid's best.
  EXPECT_EQ(tuning.knobs.snapshot(), d.chosen);
  const double best = sim.best_throughput();
  const double chosen = sim.throughput(d.chosen);
  EXPECT_GE(chosen, 0.95 * best) << to_string(d.chosen) << ": " << chosen << " vs best " << best;
  // The search actually moved: the baseline (workers 0) is far below.
  EXPECT_LT(sim.throughput(d.baseline), 0.5 * best);

  // The decision's numbers are the model's.
  EXPECT_EQ(d.baseline,
            (Setting{{"loader.pin_memory", 0}, {"loader.prefetch", 2}, {"loader.workers", 0}}));
  EXPECT_DOUBLE_EQ(d.baseline_throughput, sim.throughput(d.baseline));
  EXPECT_DOUBLE_EQ(d.chosen_throughput, chosen);

  // Every trial measured exactly its own setting, after settling; trials[0] is the baseline.
  ASSERT_EQ(d.trials.size(), tuning.trials.size());
  ASSERT_GE(d.trials.size(), 4u);
  for (size_t i = 0; i < d.trials.size(); ++i) {
    const TrialResult& t = d.trials[i];
    ASSERT_FALSE(t.failed);
    EXPECT_EQ(t.mean_step_ns,
              sim.step_ns(t.setting.at("loader.workers"), t.setting.at("loader.prefetch")))
        << to_string(t.setting);
    EXPECT_DOUBLE_EQ(t.throughput, sim.throughput(t.setting));
    EXPECT_NEAR(t.data_wait_fraction,
                1.0 - sim.compute_ms / sim.step_ms(t.setting.at("loader.workers"),
                                                   t.setting.at("loader.prefetch")),
                1e-9);
    EXPECT_EQ(t.last_step - t.first_step + 1, config.measure_steps);
    for (int64_t s = t.first_step; s <= t.last_step; ++s) {
      EXPECT_EQ(driver.ran[s].first, t.setting.at("loader.workers")) << "step " << s;
      EXPECT_EQ(driver.ran[s].second, t.setting.at("loader.prefetch")) << "step " << s;
    }
    const int64_t previous_end = i == 0 ? 0 : d.trials[i - 1].last_step;
    EXPECT_EQ(t.first_step - previous_end - 1, config.settle_steps) << "trial " << i;
    EXPECT_EQ(tuning.trials[i].first.setting, t.setting);
  }
  // The search tries no setting twice; re-measurements come after it, of settings it tried.
  std::set<Setting> distinct;
  size_t searched = 0;
  for (const auto& t : d.trials) {
    if (t.confirmation) {
      EXPECT_EQ(distinct.count(t.setting), 1u) << to_string(t.setting);
    } else {
      EXPECT_EQ(searched, distinct.size()) << "a search trial after a re-measurement";
      distinct.insert(t.setting);
      ++searched;
    }
  }
  EXPECT_EQ(distinct.size(), searched);
  EXPECT_LT(searched, d.trials.size());
  // Kept trials improve monotonically by more than the margin; re-measurements are never kept,
  // and the finalists' best median is at least the search's own best.
  double incumbent = 0;
  for (const auto& [t, kept] : tuning.trials) {
    if (t.confirmation) EXPECT_FALSE(kept);
    if (kept) {
      EXPECT_GT(t.throughput, incumbent * (1 + config.noise_margin));
      incumbent = t.throughput;
    }
  }
  EXPECT_GE(d.chosen_throughput, incumbent);
}

// Several loaders, with and without seeded +-5% noise: always >= 95% of the grid's best.
struct Scenario {
  double compute_ms, batch_ms, stall_ms;
};

TEST(TrialEngineTest, ReachesNinetyFivePercentAcrossModelsAndNoise) {
  // {10, 60, 1}: with 8 workers prefetch 4 gains 2.4% (under the 3% margin) and prefetch 8 gains
  // 7.5%; a search that stops at the first depth that does not win ends at 93%.
  const std::vector<Scenario> scenarios = {{10, 45, 3}, {20, 30, 0},  {5, 100, 2}, {30, 10, 1},
                                           {8, 33, 6},  {12, 200, 0}, {10, 60, 1}};
  for (const Scenario& sc : scenarios) {
    for (double noise : {0.0, 0.05}) {
      for (uint64_t seed = 1; seed <= 20; ++seed) {
        if (noise == 0 && seed > 1) continue;
        SimLoader sim{sc.compute_ms, sc.batch_ms, sc.stall_ms};  // compute, batch, stall (ms)
        Tuning tuning(sim, noise, seed);
        const AutotuneConfig config = default_autotune();
        const bool decided = tuning.run(config);
        SCOPED_TRACE("compute " + std::to_string(sc.compute_ms) + " batch " +
                     std::to_string(sc.batch_ms) + " stall " + std::to_string(sc.stall_ms) +
                     " noise " + std::to_string(noise) + " seed " + std::to_string(seed));
        ASSERT_TRUE(decided);
        const TuningDecision& d = tuning.decision();
        EXPECT_LE(d.steps_used, config.warmup_steps);
        EXPECT_EQ(tuning.knobs.snapshot(), d.chosen);
        EXPECT_GE(sim.throughput(d.chosen), 0.95 * sim.best_throughput()) << to_string(d.chosen);
        // With noise the measured figures are the model's within the noise.
        EXPECT_NEAR(d.chosen_throughput / sim.throughput(d.chosen), 1.0, noise + 1e-9);
        EXPECT_NEAR(d.baseline_throughput / sim.throughput(d.baseline), 1.0, noise + 1e-9);
      }
    }
  }
}

TEST(TrialEngineTest, GainBelowNoiseMarginIsNotKept) {
  // Four workers give 10.2 ms, eight 10 ms: eight are 2% faster, below the 3% margin.
  SimLoader sim{10, 40.8};  // compute, batch (ms)
  Tuning tuning(sim);
  AutotuneConfig config = default_autotune();
  config.prefetch_choices = {};  // workers only
  config.confirm_rounds = 0;     // the margin decides, not a re-measurement of the finalists
  ASSERT_TRUE(tuning.run(config));

  bool tried_eight = false;
  for (const auto& [t, kept] : tuning.trials) {
    if (t.setting.at("loader.workers") > 4) {
      tried_eight = tried_eight || t.setting.at("loader.workers") == 8;
      EXPECT_GT(t.throughput, sim.throughput(4, 2));  // faster...
      EXPECT_FALSE(kept) << to_string(t.setting);     // ...but not by the margin
    }
  }
  EXPECT_TRUE(tried_eight);
  EXPECT_EQ(tuning.decision().chosen.at("loader.workers"), 4);
  EXPECT_EQ(sim.workers, 4);

  // The same model with a 1% margin keeps eight workers.
  SimLoader sim2 = sim;
  sim2.workers = 0;
  Tuning tuning2(sim2);
  config.noise_margin = 0.01;
  ASSERT_TRUE(tuning2.run(config));
  EXPECT_EQ(tuning2.decision().chosen.at("loader.workers"), 8);
}

// One knob, loader.workers in {0, 1}, no settling; step time given per (workers, step number).
// Returns every trial with whether it was kept, and the knob's final value.
struct TwoLevelRun {
  std::vector<std::pair<TrialResult, bool>> trials;
  std::optional<TuningDecision> decision;
  int64_t value = 0;
};

template <typename StepNs>
TwoLevelRun run_two_level(StepNs step_ns) {
  TwoLevelRun run;
  KnobRegistry knobs;
  knobs.add(value_knob("loader.workers", {0, 1}, run.value));
  AutotuneConfig config = default_autotune();
  config.settle_steps = 0;
  config.confirm_rounds = 0;  // the margin decides, not a re-measurement of the finalists
  TrialEngine engine(knobs, make_loader_policy(config), config);
  engine.on_trial = [&](const TrialResult& t, bool kept) { run.trials.push_back({t, kept}); };
  run_steps(engine, 100, [&](int64_t i, StepRecord& r) {
    r.samples = 1;
    return step_ns(run.value, i);
  });
  run.decision = engine.decision();
  return run;
}

TEST(TrialEngineTest, NoisyIncumbentRaisesTheMargin) {
  // Alternating 10 / 14 ms steps give the baseline a relative standard error of 5.6%, above the
  // 3% margin; a steady candidate 4% faster is then not kept.
  const TwoLevelRun run = run_two_level([](int64_t workers, int64_t i) -> Nanos {
    return workers == 0 ? (i % 2 ? 14 : 10) * 1000000 : 11520000;  // 12 / 1.04 ms
  });
  ASSERT_TRUE(run.decision.has_value());
  ASSERT_EQ(run.trials.size(), 2u);
  EXPECT_GT(run.trials[0].first.relative_error, 0.04);
  EXPECT_EQ(run.trials[1].first.relative_error, 0.0);
  EXPECT_GT(run.trials[1].first.throughput, run.trials[0].first.throughput * 1.035);
  EXPECT_FALSE(run.trials[1].second);
  EXPECT_EQ(run.decision->chosen.at("loader.workers"), 0);
  EXPECT_EQ(run.value, 0);
}

TEST(TrialEngineTest, NoiseMarginIsCappedAtTenPercent) {
  // A wildly varying baseline (2 / 22 ms, relative standard error ~28%) does not block every
  // candidate: the margin is capped at 10%, and a steady candidate 14% faster is kept.
  const TwoLevelRun run = run_two_level([](int64_t workers, int64_t i) -> Nanos {
    return workers == 0 ? (i % 2 ? 22 : 2) * 1000000 : 10500000;
  });
  ASSERT_TRUE(run.decision.has_value());
  ASSERT_EQ(run.trials.size(), 2u);
  EXPECT_GT(run.trials[0].first.relative_error, 0.2);
  EXPECT_NEAR(run.trials[1].first.throughput / run.trials[0].first.throughput, 12.0 / 10.5, 1e-9);
  EXPECT_TRUE(run.trials[1].second);
  EXPECT_EQ(run.decision->chosen.at("loader.workers"), 1);
  EXPECT_EQ(run.value, 1);
}

TEST(TrialEngineTest, ThrowingSetterFailsTrialAndRestoresIncumbent) {
  SimLoader sim;
  sim.stall_ms = 3;
  Tuning tuning(sim);
  KnobRegistry& knobs = tuning.knobs;
  // Four workers "run out of memory"; prefetch 4 is half applied, then throws.
  knobs.add({"loader.workers", range(0, 8), [&sim] { return sim.workers; },
             [&sim](int64_t v) {
               if (v == 4) throw std::runtime_error("simulated out of memory");
               sim.workers = v;
             }});
  knobs.add({"loader.prefetch", range(1, 64), [&sim] { return sim.prefetch; },
             [&sim](int64_t v) {
               sim.prefetch = v;
               if (v == 4) throw std::runtime_error("prefetch refused");
             }});
  ASSERT_TRUE(tuning.run(default_autotune()));
  const TuningDecision& d = tuning.decision();

  int failed = 0;
  for (const auto& [t, kept] : tuning.trials) {
    if (!t.failed) continue;
    ++failed;
    EXPECT_FALSE(kept);
    EXPECT_EQ(t.mean_step_ns, 0);
    const bool workers4 = t.setting.at("loader.workers") == 4;
    const bool prefetch4 = t.setting.at("loader.prefetch") == 4;
    EXPECT_TRUE(workers4 || prefetch4) << to_string(t.setting);
    EXPECT_NE(t.note.find(workers4 ? "simulated out of memory" : "prefetch refused"),
              std::string::npos)
        << t.note;
  }
  EXPECT_EQ(failed, 2);
  // No step ever ran with a failed setting: the half-applied prefetch was rolled back at once.
  for (const auto& [w, p] : tuning.driver.ran) {
    EXPECT_NE(w, 4);
    EXPECT_NE(p, 4);
  }
  // The search went on around the failed workers trial (bisection to 3 workers); the failed
  // prefetch trial counts as a loss, so the prefetch stage stops there.
  bool tried_three = false;
  for (const auto& t : d.trials) tried_three = tried_three || t.setting.at("loader.workers") == 3;
  EXPECT_TRUE(tried_three);
  EXPECT_EQ(knobs.snapshot(), d.chosen);
  EXPECT_NE(d.chosen.at("loader.workers"), 4);
  EXPECT_EQ(d.chosen.at("loader.workers"), 3);
  EXPECT_EQ(d.chosen.at("loader.prefetch"), 2);
  EXPECT_DOUBLE_EQ(d.chosen_throughput, sim.throughput(d.chosen));
}

// Proposes the given workers counts in order, whatever the results; counts the calls made after
// it said it had nothing more (the engine must make none).
class ScriptedPolicy final : public TuningPolicy {
 public:
  explicit ScriptedPolicy(std::vector<int64_t> workers, int* calls_after_end = nullptr)
      : workers_(std::move(workers)), calls_after_end_(calls_after_end) {}
  std::string name() const override { return "scripted"; }
  std::optional<Setting> propose(const std::vector<TrialResult>& trials, size_t,
                                 const KnobRegistry&) override {
    if (next_ >= workers_.size()) {
      if (ended_ && calls_after_end_ != nullptr) ++*calls_after_end_;
      ended_ = true;
      return std::nullopt;
    }
    Setting s = trials.front().setting;
    s["loader.workers"] = workers_[next_++];
    return s;
  }

 private:
  std::vector<int64_t> workers_;
  int* calls_after_end_;
  size_t next_ = 0;
  bool ended_ = false;
};

// An out-of-memory in a trial's step: that step runs again with the incumbent (which fits), and
// only then does the next proposal start, even when it is already known.
TEST(TrialEngineTest, AStepThatFailedInATrialRunsAgainWithTheIncumbent) {
  SimLoader sim;
  Tuning tuning(sim);
  AutotuneConfig config = default_autotune();
  // A time floor for windows: the budget's estimate of the next trial must not come from the
  // failed one (no step time), which would make the next window endless and end the search.
  config.min_window_ms = 50;
  TrialEngine& engine =
      tuning.start(config, std::make_unique<ScriptedPolicy>(std::vector<int64_t>{2, 6, 3}));
  Driver& driver = tuning.driver;
  bool failed_once = false;
  std::vector<int64_t> after_failure;  // workers of the steps that follow the failure
  while (!engine.finished() && driver.step < 1000) {
    if (sim.workers == 6 && !failed_once) {
      failed_once = true;
      EXPECT_TRUE(engine.fail_current_trial("out of memory at loader.workers=6"));
      EXPECT_EQ(sim.workers, 2) << "the incumbent (2 workers beat none) reruns the step";
      // A failure in the rerun is the step's own, not a trial's.
      EXPECT_FALSE(engine.fail_current_trial("again"));
    }
    if (failed_once && after_failure.size() < 2) after_failure.push_back(sim.workers);
    engine.on_step(driver.next());
  }
  ASSERT_TRUE(failed_once);
  ASSERT_TRUE(engine.finished());
  EXPECT_EQ(after_failure, (std::vector<int64_t>{2, 3}))
      << "the rerun with the incumbent, then the next trial";
  std::vector<int64_t> tried;
  for (const auto& t : engine.decision()->trials) tried.push_back(t.setting.at("loader.workers"));
  EXPECT_EQ(tried, (std::vector<int64_t>{0, 2, 6, 3}));
  EXPECT_TRUE(engine.decision()->trials[2].failed);
  EXPECT_EQ(engine.decision()->chosen.at("loader.workers"), 3);
}

// Throughputs scripted per measurement: the n-th window measured with workers w runs at
// script[w][n] samples/s (the last figure repeats), whatever came before.
struct ScriptedSim {
  std::map<int64_t, std::vector<double>> script;
  int64_t workers = 0;
  std::map<int64_t, size_t> windows;    // windows measured (or failed) per workers value
  std::function<void(int64_t)> on_set;  // may throw: the setter fails
};

struct ScriptedRun {
  std::vector<std::pair<TrialResult, bool>> trials;  // as on_trial saw them
  std::optional<TuningDecision> decision;
  std::vector<int64_t> ran;  // workers of each step
  int proposals_after_end = 0;
};

ScriptedRun run_scripted(ScriptedSim& sim, const AutotuneConfig& config, std::vector<int64_t> order,
                         const std::function<void(TrialEngine&)>& before_step = {}) {
  ScriptedRun run;
  KnobRegistry knobs;
  knobs.add({"loader.workers", range(0, 4), [&sim] { return sim.workers; },
             [&sim](int64_t v) {
               if (sim.on_set) sim.on_set(v);
               sim.workers = v;
             }});
  TrialEngine engine(
      knobs, std::make_unique<ScriptedPolicy>(std::move(order), &run.proposals_after_end), config);
  engine.on_trial = [&](const TrialResult& t, bool kept) {
    run.trials.push_back({t, kept});
    ++sim.windows[t.setting.at("loader.workers")];
  };
  run_steps(engine, 1000, [&](int64_t, StepRecord& r) {
    if (before_step) before_step(engine);
    const std::vector<double>& script = sim.script.at(sim.workers);
    const double samples_per_s = script[std::min(sim.windows[sim.workers], script.size() - 1)];
    r.samples = 1;
    run.ran.push_back(sim.workers);
    return static_cast<Nanos>(std::llround(1e9 / samples_per_s));
  });
  run.decision = engine.decision();
  return run;
}

AutotuneConfig confirm_config() {
  AutotuneConfig c = default_autotune();  // 3 finalists, 2 rounds
  c.settle_steps = 0;
  c.measure_steps = 5;
  return c;
}

// Workers 1 is truly best (~110) but measured low once (97); workers 2 is truly 100 but measured
// lucky once (112); workers 3 is 100. The baseline (50) is far below.
ScriptedSim lucky_and_unlucky() {
  ScriptedSim sim;
  sim.script = {{0, {50}}, {1, {97, 110, 109}}, {2, {112, 100, 101}}, {3, {100, 99, 100}}};
  return sim;
}

// That script, the search proposing workers 1, 2, 3 under confirm_config() as `adjust` changes
// it: the run, the config, and the simulated loader after it (the setting applied).
struct LuckyRun : ScriptedRun {
  ScriptedSim sim = lucky_and_unlucky();
  AutotuneConfig config = confirm_config();
};
LuckyRun run_lucky(const std::function<void(AutotuneConfig&)>& adjust = {}) {
  LuckyRun r;
  if (adjust) adjust(r.config);
  static_cast<ScriptedRun&>(r) = run_scripted(r.sim, r.config, {1, 2, 3});
  return r;
}

std::vector<int64_t> confirmation_workers(const ScriptedRun& run) {
  std::vector<int64_t> out;
  for (const auto& [t, kept] : run.trials) {
    if (t.confirmation) out.push_back(t.setting.at("loader.workers"));
  }
  return out;
}

TEST(TrialEngineConfirmation, ReMeasuringTheFinalistsUndoesTheWinnersCurse) {
  // Without the stage the lucky single window wins.
  {
    const LuckyRun run = run_lucky([](AutotuneConfig& c) { c.confirm_rounds = 0; });
    ASSERT_TRUE(run.decision);
    EXPECT_EQ(run.decision->chosen.at("loader.workers"), 2);
    EXPECT_NEAR(run.decision->chosen_throughput, 112, 0.01);
    EXPECT_EQ(run.decision->reason, "search complete");
    EXPECT_TRUE(confirmation_workers(run).empty());
    EXPECT_EQ(run.decision->trials.size(), 4u);
  }
  // With it, the setting that is better on the median of its measurements wins.
  const LuckyRun run = run_lucky();
  ASSERT_TRUE(run.decision);
  const TuningDecision& d = *run.decision;
  EXPECT_EQ(d.chosen.at("loader.workers"), 1);
  EXPECT_EQ(run.sim.workers, 1);                // applied
  EXPECT_NEAR(d.chosen_throughput, 109, 0.01);  // median of 97, 110, 109
  EXPECT_EQ(d.reason, "search complete; top 3 settings re-measured 2 times, interleaved");
  EXPECT_EQ(run.proposals_after_end, 0);
  // The search's trials, then 2 rounds over the 3 finalists (ranked 112, 100, 97), each rotated.
  ASSERT_EQ(d.trials.size(), 4u + 6u);
  EXPECT_EQ(confirmation_workers(run), (std::vector<int64_t>{2, 3, 1, 3, 1, 2}));
  for (size_t i = 0; i < d.trials.size(); ++i) {
    const TrialResult& t = d.trials[i];
    EXPECT_EQ(t.confirmation, i >= 4) << i;
    EXPECT_FALSE(t.failed);
    if (t.confirmation) EXPECT_FALSE(run.trials[i].second) << "a re-measurement is never kept";
    // Each window ran its own setting.
    for (int64_t s = t.first_step; s <= t.last_step; ++s) {
      EXPECT_EQ(run.ran[static_cast<size_t>(s)], t.setting.at("loader.workers")) << "step " << s;
    }
  }
  EXPECT_LE(d.steps_used, run.config.warmup_steps);
}

TEST(TrialEngineConfirmation, EachRoundStartsAtTheNextFinalist) {
  const LuckyRun run = run_lucky([](AutotuneConfig& c) { c.confirm_rounds = 3; });
  ASSERT_TRUE(run.decision);
  EXPECT_EQ(confirmation_workers(run), (std::vector<int64_t>{2, 3, 1, 3, 1, 2, 1, 2, 3}));
  EXPECT_NE(run.decision->reason.find("re-measured 3 times, interleaved"), std::string::npos)
      << run.decision->reason;
  // Two finalists at most: the third (97) is left out.
  const LuckyRun run2 = run_lucky([](AutotuneConfig& c) {
    c.confirm_rounds = 3;
    c.confirm_settings = 2;
  });
  EXPECT_EQ(confirmation_workers(run2), (std::vector<int64_t>{2, 3, 3, 2, 2, 3}));
  EXPECT_EQ(run2.decision->chosen.at("loader.workers"), 2);
  // One finalist is no confirmation.
  const LuckyRun run3 = run_lucky([](AutotuneConfig& c) {
    c.confirm_rounds = 3;
    c.confirm_settings = 1;
  });
  EXPECT_TRUE(confirmation_workers(run3).empty());
  EXPECT_EQ(run3.decision->reason, "search complete");
}

TEST(TrialEngineConfirmation, SettingsThatClearlyLostAreNotReMeasured) {
  ScriptedSim sim;
  // 80 is below 0.85 x 112: only two finalists.
  sim.script = {{0, {50}}, {1, {80, 110}}, {2, {112, 100}}, {3, {100, 104}}};
  const ScriptedRun run = run_scripted(sim, confirm_config(), {1, 2, 3});
  ASSERT_TRUE(run.decision);
  EXPECT_EQ(confirmation_workers(run), (std::vector<int64_t>{2, 3, 3, 2}));
  EXPECT_NE(run.decision->reason.find("top 2 settings"), std::string::npos) << run.decision->reason;
  // 3: median of 100, 104, 104 = 104; 2: median of 112, 100, 100 = 100.
  EXPECT_EQ(run.decision->chosen.at("loader.workers"), 3);
  EXPECT_NEAR(run.decision->chosen_throughput, 104, 0.01);
}

TEST(TrialEngineConfirmation, TheBudgetCutsTheReMeasurementsShort) {
  // The first step, the baseline and three trials take 1 + 4 x 5 = 21 steps; re-measurements take
  // 5 steps each.
  {
    // In 34 the search stops after two trials: a third (5 steps at 16) would leave no room for
    // a round of re-measuring three settings (15 steps). Two finalists (112, 97), 3 of their 4
    // re-measurements fit; the whole first round counts.
    const LuckyRun run = run_lucky([](AutotuneConfig& c) { c.warmup_steps = 34; });
    ASSERT_TRUE(run.decision);
    const TuningDecision& d = *run.decision;
    EXPECT_EQ(confirmation_workers(run), (std::vector<int64_t>{2, 1, 1}));
    EXPECT_EQ(d.steps_used, 31);
    EXPECT_LE(d.steps_used, run.config.warmup_steps);
    EXPECT_EQ(d.reason,
              "warm-up budget reached (34 steps or 0 s, whichever is larger); top 2 settings "
              "re-measured, interleaved, until the warm-up budget ran out (3 of 4 "
              "re-measurements; 1 whole round counted)");
    // 2: (112 + 100) / 2 = 106; 1: (97 + 110) / 2 = 103.5, its 109 of round 2 left out.
    EXPECT_EQ(d.chosen.at("loader.workers"), 2);
    EXPECT_NEAR(d.chosen_throughput, 106, 0.01);
    EXPECT_EQ(run.sim.workers, 2);
  }
  {
    // Without a reserve (confirmation off) the same budget runs the third trial instead.
    const LuckyRun run = run_lucky([](AutotuneConfig& c) {
      c.warmup_steps = 34;
      c.confirm_rounds = 0;
    });
    ASSERT_TRUE(run.decision);
    EXPECT_EQ(run.decision->trials.size(), 4u);
    EXPECT_EQ(run.decision->reason, "search complete");
  }
  // Four fit in 44: the first round is whole and counts, the second's one re-measurement (3) not.
  const LuckyRun run = run_lucky([](AutotuneConfig& c) { c.warmup_steps = 44; });
  ASSERT_TRUE(run.decision);
  const TuningDecision& d = *run.decision;
  EXPECT_EQ(confirmation_workers(run), (std::vector<int64_t>{2, 3, 1, 3}));
  EXPECT_EQ(d.steps_used, 41);
  EXPECT_EQ(d.reason,
            "search complete; top 3 settings re-measured, interleaved, until the warm-up budget "
            "ran out (4 of 6 re-measurements; 1 whole round counted)");
  // 2: (112 + 100) / 2 = 106; 1: (97 + 110) / 2 = 103.5; 3: (100 + 99) / 2, its 100 of round 2
  // left out.
  EXPECT_EQ(d.chosen.at("loader.workers"), 2);
  EXPECT_NEAR(d.chosen_throughput, 106, 0.01);
}

TEST(TrialEngineConfirmation, AtTheBudgetTheFinalistsAreReMeasuredWhileOneFits) {
  // Budget in time only. After workers 3 (slow: 50 ms steps) the policy's next trial, estimated
  // at 3 x 50 ms, does not fit the 330 ms; a re-measurement of workers 1 (3 x 10 ms) does.
  ScriptedSim sim;
  sim.script = {{0, {50}}, {1, {100}}, {2, {100}}, {3, {20}}, {4, {100}}};
  AutotuneConfig config = confirm_config();
  config.measure_steps = 3;
  config.warmup_steps = 0;
  config.warmup_seconds = 0.33;  // 290 ms when workers 3 ends, +30 ms per re-measurement
  const ScriptedRun run = run_scripted(sim, config, {1, 2, 3, 4});
  ASSERT_TRUE(run.decision);
  const TuningDecision& d = *run.decision;
  EXPECT_EQ(confirmation_workers(run), (std::vector<int64_t>{1}));
  EXPECT_EQ(d.reason.rfind("warm-up budget reached", 0), 0u) << d.reason;
  EXPECT_NE(d.reason.find("(1 of 4): the search's choice stands"), std::string::npos) << d.reason;
  EXPECT_EQ(std::count(run.ran.begin(), run.ran.end(), 4), 0) << "the policy was not asked again";
  // No whole round: the search's own choice, workers 1 (2 did not beat it), stands.
  EXPECT_EQ(d.chosen.at("loader.workers"), 1);
}

TEST(TrialEngineConfirmation, ASetterFailingInAReMeasurementDropsThatFinalist) {
  ScriptedSim sim = lucky_and_unlucky();
  sim.on_set = [&sim](int64_t v) {
    if (v == 3 && sim.windows[3] >= 1) throw std::runtime_error("out of memory at workers 3");
  };
  const ScriptedRun run = run_scripted(sim, confirm_config(), {1, 2, 3});
  ASSERT_TRUE(run.decision);
  const TuningDecision& d = *run.decision;
  // 3's re-measurement failed at once; the rounds went on without it.
  EXPECT_EQ(confirmation_workers(run), (std::vector<int64_t>{2, 3, 1, 1, 2}));
  const auto failed =
      std::find_if(d.trials.begin(), d.trials.end(), [](const TrialResult& t) { return t.failed; });
  ASSERT_NE(failed, d.trials.end());
  EXPECT_TRUE(failed->confirmation);
  EXPECT_EQ(failed->setting.at("loader.workers"), 3);
  EXPECT_NE(failed->note.find("out of memory at workers 3"), std::string::npos) << failed->note;
  for (size_t s = static_cast<size_t>(d.trials[3].last_step) + 1; s < run.ran.size(); ++s) {
    EXPECT_NE(run.ran[s], 3) << "step " << s;
  }
  EXPECT_EQ(d.chosen.at("loader.workers"), 1);  // 109 against 101
  EXPECT_NEAR(d.chosen_throughput, 109, 0.01);
  EXPECT_EQ(d.reason,
            "search complete; top 3 settings re-measured 2 times, interleaved; 1 dropped (a "
            "re-measurement failed)");
}

TEST(TrialEngineConfirmation, AnOutOfMemoryInTheIncumbentsReMeasurementFallsBackToAnother) {
  ScriptedSim sim = lucky_and_unlucky();
  bool failed_once = false;
  const ScriptedRun run = run_scripted(sim, confirm_config(), {1, 2, 3}, [&](TrialEngine& e) {
    // Workers 2, the search's incumbent, runs out of memory in its re-measurement.
    if (sim.workers == 2 && sim.windows[2] == 1 && !failed_once) {
      failed_once = true;
      EXPECT_TRUE(e.fail_current_trial("out of memory at workers 2"));
      // Not back to 2: to the best other finalist so far (3: 100 against 1's 97).
      EXPECT_EQ(sim.workers, 3);
    }
  });
  ASSERT_TRUE(failed_once);
  ASSERT_TRUE(run.decision);
  const TuningDecision& d = *run.decision;
  EXPECT_EQ(confirmation_workers(run), (std::vector<int64_t>{2, 3, 1, 3, 1}));
  EXPECT_EQ(d.chosen.at("loader.workers"), 1);
  EXPECT_EQ(sim.workers, 1);
  EXPECT_NE(d.reason.find("1 dropped"), std::string::npos) << d.reason;
}

TEST(TrialEngineTest, EverySetterThrowingKeepsTheBaseline) {
  SimLoader sim;
  Tuning tuning(sim);
  tuning.knobs = KnobRegistry();
  for (Knob knob : {value_knob("loader.workers", range(0, 8), sim.workers),
                    value_knob("loader.prefetch", range(1, 64), sim.prefetch)}) {
    knob.set = [](int64_t) { throw std::runtime_error("no"); };
    tuning.knobs.add(knob);
  }
  ASSERT_TRUE(tuning.run(default_autotune()));
  const TuningDecision& d = tuning.decision();
  EXPECT_EQ(d.chosen, d.baseline);
  EXPECT_DOUBLE_EQ(d.chosen_throughput, d.baseline_throughput);
  EXPECT_GT(d.trials.size(), 1u);
  for (size_t i = 1; i < d.trials.size(); ++i) EXPECT_TRUE(d.trials[i].failed);
  // Only the baseline was measured: the decision came right after it.
  EXPECT_EQ(d.decided_at_step, d.trials[0].last_step);
}

TEST(TrialEngineTest, EmptyRegistryConcludesAfterAWarmUpWithoutKnobs) {
  KnobRegistry knobs;
  AutotuneConfig config = default_autotune();
  config.warmup_steps = 3;  // a loader may still be attached within this many steps
  TrialEngine engine(knobs, make_loader_policy(config), config);
  StepRecord r;
  for (int64_t step = 7; step < 9; ++step) {
    r.step = step;
    engine.on_step(r);
    EXPECT_FALSE(engine.finished());
  }
  r.step = 9;
  engine.on_step(r);
  ASSERT_TRUE(engine.finished());
  const TuningDecision& d = *engine.decision();
  EXPECT_NE(d.reason.find("no tunable knobs"), std::string::npos) << d.reason;
  EXPECT_TRUE(d.trials.empty());
  EXPECT_EQ(d.decided_at_step, 9);
  EXPECT_EQ(d.steps_used, 0);
  EXPECT_TRUE(d.chosen.empty());
  // Further steps change nothing.
  r.step = 10;
  engine.on_step(r);
  EXPECT_EQ(engine.decision()->decided_at_step, 9);
}

TEST(TrialEngineTest, KnobsRegisteredAfterTheFirstStepsAreTuned) {
  KnobRegistry knobs;
  AutotuneConfig config = default_autotune();
  TrialEngine engine(knobs, make_loader_policy(config), config);
  StepRecord r;
  for (int64_t step = 0; step < 5; ++step) {  // steps before the loader is attached
    r.step = step;
    engine.on_step(r);
  }
  ASSERT_FALSE(engine.finished());
  int64_t workers = 0;
  knobs.add(value_knob("loader.workers", range(0, 2), workers));
  run_steps(
      engine, 500, [&](int64_t, StepRecord&) { return 10000000 / (1 + workers); }, 5);
  ASSERT_TRUE(engine.finished());
  EXPECT_EQ(engine.decision()->chosen.at("loader.workers"), 2);
  EXPECT_EQ(engine.decision()->trials.front().first_step, 5 + config.settle_steps + 1);
}

TEST(TrialEngineTest, BudgetStopsTheSearchAndAppliesTheIncumbent) {
  SimLoader sim{10, 45};  // compute, batch (ms)
  Tuning tuning(sim);
  AutotuneConfig config = default_autotune();
  config.warmup_steps = 40;  // the first step, the baseline and one trial (1 + 14 + 14 = 29)
  config.confirm_rounds =
      0;  // the search's own budget (the confirmation's reserve is tested below)
  ASSERT_TRUE(tuning.run(config));
  const TuningDecision& d = tuning.decision();
  EXPECT_NE(d.reason.find("budget"), std::string::npos) << d.reason;
  EXPECT_LE(d.steps_used, config.warmup_steps);
  EXPECT_EQ(d.trials.size(), 2u);
  EXPECT_EQ(d.steps_used, 29);
  EXPECT_EQ(d.chosen.at("loader.workers"), 1);  // the only trial, and better than 0 workers
  EXPECT_EQ(sim.workers, 1);
}

TEST(TrialEngineTest, BudgetRestoresIncumbentWhenLastTrialLost) {
  // A loader where more workers only hurt: the last trial loses and the baseline is restored.
  KnobRegistry knobs;
  int64_t workers = 2;
  knobs.add(value_knob("loader.workers", range(0, 8), workers));
  AutotuneConfig config = default_autotune();
  config.warmup_steps = 30;   // baseline and one trial
  config.confirm_rounds = 0;  // the search's own budget
  TrialEngine engine(knobs, make_loader_policy(config), config);
  run_steps(engine, 100, [&](int64_t, StepRecord&) { return (10 + 5 * workers) * 1000000; });
  ASSERT_TRUE(engine.finished());
  const TuningDecision& d = *engine.decision();
  ASSERT_EQ(d.trials.size(), 2u);
  EXPECT_EQ(d.trials[1].setting.at("loader.workers"), 4);
  EXPECT_EQ(d.chosen.at("loader.workers"), 2);
  EXPECT_EQ(workers, 2);
  EXPECT_EQ(d.unit, "steps/s");  // no samples reported
  EXPECT_DOUBLE_EQ(d.baseline_throughput, 1e9 / 20e6);
}

TEST(TrialEngineTest, StepsWithoutSamplesUseStepsPerSecond) {
  KnobRegistry knobs;
  int64_t v = 0;
  knobs.add(value_knob("loader.workers", {0}, v));
  AutotuneConfig config = autotune_windows(1, 3);
  TrialEngine engine(knobs, make_loader_policy(config), config);
  run_steps(engine, 10, [](int64_t, StepRecord&) { return Nanos{25000000}; });
  ASSERT_TRUE(engine.finished());
  EXPECT_EQ(engine.decision()->trials.size(), 1u);
  EXPECT_DOUBLE_EQ(engine.decision()->baseline_throughput, 40.0);
  EXPECT_EQ(engine.decision()->unit, "steps/s");
  EXPECT_EQ(engine.decision()->reason, "search complete");
}

// Steps served from a backlog look fast; the loader's measured capacity caps the trial.
TEST(TrialEngineTest, SupplyCapacityCapsATrialFedFromABacklog) {
  int64_t workers = 0;
  KnobRegistry knobs;
  knobs.add(value_knob("loader.workers", range(0, 4), workers));
  AutotuneConfig config = autotune_windows(1, 12);  // three batches produced at one per 4 steps
  config.warmup_steps = 1 + 13 + 13;                // the baseline and one trial (workers 1)
  config.confirm_rounds = 0;                        // no room kept for re-measurements
  TrialEngine engine(knobs, make_loader_policy(config), config);
  // The producer: with one worker it makes a batch every 40 ms (capacity 25 batches/s), and
  // with none the training thread makes them itself (parallelism 0: nothing to cap).
  TrialEngine::SupplySample supply;
  engine.supply_probe = [&] {
    TrialEngine::SupplySample s = supply;
    s.parallelism = static_cast<int>(workers);
    return s;
  };
  run_steps(engine, 100, [&](int64_t i, StepRecord& r) {
    r.samples = 10;
    if (workers == 1 && i % 4 == 0) {  // one batch per 4 steps = per 40 ms of production
      supply.units += 1;
      supply.busy_ns += 40 * 1000000;
    }
    return Nanos{10 * 1000000};  // 10 ms steps throughout: with workers 1 they eat a backlog
  });
  ASSERT_TRUE(engine.finished());
  const auto& trials = engine.decision()->trials;
  ASSERT_EQ(trials.size(), 2u);
  EXPECT_FALSE(trials[0].supply_limited);           // workers 0: not measurable, not capped
  EXPECT_NEAR(trials[0].throughput, 1000.0, 1e-6);  // 10 samples per 10 ms
  ASSERT_TRUE(trials[1].supply_limited) << trials[1].supply_capacity;
  EXPECT_NEAR(trials[1].supply_capacity, 250.0, 1e-6);  // 25 batches/s x 10 samples
  EXPECT_NEAR(trials[1].throughput, 250.0, 1e-6);
  EXPECT_EQ(engine.decision()->chosen.at("loader.workers"), 0);  // the backlog did not fool it
}

TEST(TrialEngineTest, TooLittleProductionIsNotACap) {
  int64_t workers = 2;
  KnobRegistry knobs;
  knobs.add(value_knob("loader.workers", range(0, 2), workers));
  AutotuneConfig config = autotune_windows(0, 5);
  config.warmup_steps = 6;
  TrialEngine engine(knobs, make_loader_policy(config), config);
  // An epoch's end: everything was produced ahead, nothing is produced in the window.
  engine.supply_probe = [&] { return TrialEngine::SupplySample{7, 70 * 1000000, 2}; };
  run_steps(engine, 20, [](int64_t, StepRecord&) { return Nanos{1000000}; });
  ASSERT_TRUE(engine.finished());
  EXPECT_FALSE(engine.decision()->trials[0].supply_limited);
  EXPECT_EQ(engine.decision()->trials[0].supply_capacity, 0.0);
}

// Fast steps: windows last min_window_ms, and the budget in seconds outlasts the one in steps.
TEST(TrialEngineTest, FastStepsGetTimeFloorsForWindowsAndBudget) {
  int64_t workers = 0;
  KnobRegistry knobs;
  knobs.add(value_knob("loader.workers", range(0, 4), workers));
  AutotuneConfig config = autotune_windows(1, 3);
  config.min_window_ms = 20;    // 20 one-millisecond steps per window
  config.warmup_steps = 10;     // would allow no trial at all ...
  config.warmup_seconds = 0.5;  // ... but half a second allows several
  TrialEngine engine(knobs, make_loader_policy(config), config);
  // More workers, faster steps.
  run_steps(engine, 2000, [&](int64_t, StepRecord&) { return 1000000 / (1 + workers); });
  ASSERT_TRUE(engine.finished());
  const TuningDecision& d = *engine.decision();
  ASSERT_GE(d.trials.size(), 3u);
  for (const auto& t : d.trials) {
    EXPECT_GE((t.last_step - t.first_step + 1) * t.mean_step_ns, 20 * 1000000 - t.mean_step_ns);
  }
  EXPECT_GT(d.steps_used, config.warmup_steps);
  EXPECT_EQ(d.chosen.at("loader.workers"), 4);
}

// Pinning moves the host-to-device copy's cost from the training thread to the workers: it
// raises the consumer's ceiling but lowers the workers' capacity. At the worker count that is
// best without pinning, pinning loses for lack of workers; the policy must try it again with more.
TEST(TrialEngineTest, PinningThatStarvesTheWorkersIsRetriedWithMoreWorkers) {
  int64_t workers = 0, pin = 0;
  KnobRegistry knobs;
  knobs.add(value_knob("loader.workers", range(0, 16), workers));
  knobs.add(value_knob("loader.pin_memory", {0, 1}, pin));
  AutotuneConfig config = default_autotune();
  config.warmup_steps = 2000;
  TrialEngine engine(knobs, make_loader_policy(config), config);
  // Steady state: a step takes max(consumer, batch production / workers).
  auto model = [&](int64_t w, int64_t p, double* wait_ms) {
    const double consumer = p ? 2.0 : 2.5;   // ms: the pageable copy costs the training thread
    const double produce = p ? 14.0 : 10.0;  // ms per batch on one worker: pinning costs it
    const double step = w == 0 ? consumer + produce : std::max(consumer, produce / w);
    *wait_ms = step - consumer;
    return step;
  };
  TrialEngine::SupplySample supply;
  engine.supply_probe = [&] {
    TrialEngine::SupplySample s = supply;
    s.parallelism = static_cast<int>(workers);
    return s;
  };
  run_steps(engine, 5000, [&](int64_t, StepRecord& r) {
    double wait_ms = 0;
    const double step_ms = model(workers, pin, &wait_ms);
    r.samples = 32;
    r.data_wait_ns = static_cast<Nanos>(wait_ms * 1e6);
    supply.units += 1;  // one batch per step, each taking `produce` on its worker
    supply.busy_ns += static_cast<Nanos>((pin ? 14.0 : 10.0) * 1e6);
    return static_cast<Nanos>(step_ms * 1e6);
  });
  ASSERT_TRUE(engine.finished());
  const TuningDecision& d = *engine.decision();
  std::string trials;
  for (const auto& t : d.trials) trials += format_trial(t, false) + "\n";
  SCOPED_TRACE(trials);
  EXPECT_EQ(d.chosen.at("loader.pin_memory"), 1);
  double wait = 0;
  EXPECT_NEAR(model(d.chosen.at("loader.workers"), 1, &wait), 2.0, 1e-9);  // the pinned ceiling
}

}  // namespace
}  // namespace torchpilot

namespace torchpilot {
namespace {

TEST(LoaderPolicyTest, PinningSettlesUntilEveryBatchInFlightHasItsPinnedBlock) {
  AutotuneConfig config;
  const auto policy = make_loader_policy(config);
  const Setting unpinned = {
      {"loader.workers", 8}, {"loader.prefetch", 2}, {"loader.pin_memory", 0}};
  Setting pinned = unpinned;
  pinned["loader.pin_memory"] = 1;
  EXPECT_EQ(policy->extra_settle_steps(unpinned, pinned), 8 * 2 + 2);
  Setting deeper = pinned;
  deeper["loader.prefetch"] = 4;
  EXPECT_EQ(policy->extra_settle_steps(pinned, deeper), 8 * 4 + 2);  // more blocks in flight
  Setting fewer = pinned;
  fewer["loader.workers"] = 4;
  EXPECT_EQ(policy->extra_settle_steps(pinned, fewer), 0);  // its blocks are cached already
  EXPECT_EQ(policy->extra_settle_steps(pinned, unpinned), 0);
}

TEST(LoaderPolicyTest, BucketSizesAreTriedAroundTheStartAndTheBestIsKept) {
  // A data-parallel step's time by all-reduce bucket size (MiB): small buckets pay per message,
  // large ones start late and overlap less. 16 is best; the run starts at 25.
  const std::map<int64_t, double> step_ms{{1, 20}, {4, 13}, {16, 10}, {25, 11}, {64, 12}};
  int64_t bucket = 25;
  KnobRegistry knobs;
  knobs.add(value_knob("grad_sync.bucket_mb", {1, 4, 16, 25, 64}, bucket));
  const AutotuneConfig config = default_autotune();
  TrialEngine engine(knobs, make_loader_policy(config), config);
  run_steps(engine, 1000, [&](int64_t step, StepRecord& r) {
    r.step_in_epoch = step;
    r.samples = 8;
    return static_cast<Nanos>(step_ms.at(bucket) * 1e6);
  });
  ASSERT_TRUE(engine.finished());
  const TuningDecision& d = *engine.decision();
  EXPECT_EQ(d.chosen.at("grad_sync.bucket_mb"), 16) << to_string(d.chosen);
  EXPECT_EQ(bucket, 16);
  // 25 (start), 64 (up: no win, no clear decline, end of the choices), 16 (down: wins), 4 (clear
  // decline ends the walk); 1 is never tried. (Re-measurements of the finalists come after.)
  std::vector<int64_t> tried;
  for (const TrialResult& t : d.trials) {
    if (!t.confirmation) tried.push_back(t.setting.at("grad_sync.bucket_mb"));
  }
  EXPECT_EQ(tried, (std::vector<int64_t>{25, 64, 16, 4}));
}

}  // namespace
}  // namespace torchpilot
