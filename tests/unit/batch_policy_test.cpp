// The micro-batch search (batch_policy.h) through the trial engine, against a simulated trainer
// whose step time and memory peak are known functions of the micro-batch: the search keeps the
// best samples/s within the memory headroom, not simply the largest micro-batch that fits.
#include "torchpilot/runtime/memory/batch_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "torchpilot/runtime/comm/rank_exchange.h"
#include "torchpilot/runtime/loader/loader_policy.h"
#include "torchpilot/runtime/tune/trial_engine.h"

namespace torchpilot {
namespace {

constexpr int64_t kBatch = 32;  // the rank's batch: every step runs 32 samples

struct SimTrainer {
  int64_t micro = 2;
  int64_t workers = 0;
  std::function<double(int64_t)> step_ms;        // by micro-batch
  std::function<double(int64_t)> peak_fraction;  // by micro-batch; null: no memory figures
  int64_t peak_bytes_since_reset = 0;
  static constexpr int64_t kCapacity = int64_t{1} << 30;
};

void register_micro(KnobRegistry& knobs, SimTrainer& sim, std::vector<int64_t> domain) {
  knobs.add({kMicroBatchKnob, std::move(domain), [&sim] { return sim.micro; },
             [&sim](int64_t v) { sim.micro = v; }});
}

MemoryProbe probe_of(SimTrainer& sim) {
  MemoryProbe p;
  p.reset = [&sim] { sim.peak_bytes_since_reset = 0; };
  p.read = [&sim]() -> std::optional<MemoryPeak> {
    return MemoryPeak{sim.peak_bytes_since_reset, SimTrainer::kCapacity};
  };
  return p;
}

struct Driver {
  SimTrainer& sim;
  int64_t step = 0;
  Nanos now = 0;
  std::vector<int64_t> micro_of_step;
  StepRecord next() {
    StepRecord r;
    r.step = step++;
    r.step_in_epoch = r.step;
    r.begin_ns = now;
    now += static_cast<Nanos>(std::llround(sim.step_ms(sim.micro) * 1e6));
    r.end_ns = now;
    r.samples = kBatch;  // one step = one optimizer step over the whole batch
    if (sim.peak_fraction) {
      const auto bytes =
          static_cast<int64_t>(sim.peak_fraction(sim.micro) * static_cast<double>(sim.kCapacity));
      sim.peak_bytes_since_reset = std::max(sim.peak_bytes_since_reset, bytes);
    }
    micro_of_step.push_back(sim.micro);
    return r;
  }
  void run(TrialEngine& engine, int64_t limit = 1000) {
    while (!engine.finished() && step < limit) engine.on_step(next());
  }
};

AutotuneConfig config_for_test() {
  AutotuneConfig c;
  c.settle_steps = 2;
  c.measure_steps = 5;
  c.min_window_ms = 0;
  c.warmup_seconds = 0;
  c.warmup_steps = 200;
  return c;
}

const std::vector<int64_t> kDomain = {1, 2, 4, 8, 16, 32};

int64_t chosen_micro(const TrialEngine& engine) {
  return engine.decision()->chosen.at(kMicroBatchKnob);
}

// The micro-batches the search proposed, in order (not the finalists' re-measurements after it).
std::vector<int64_t> tried(const TrialEngine& engine) {
  std::vector<int64_t> out;
  for (const auto& t : engine.decision()->trials) {
    if (!t.confirmation) out.push_back(t.setting.at(kMicroBatchKnob));
  }
  return out;
}

// Runs the simulated trainer until the engine decides (1000 steps at most), with the trainer's
// peak memory as the engine's probe where `probe` is set; true if the engine decided.
bool tune(TrialEngine& engine, SimTrainer& sim, bool probe) {
  if (probe) engine.memory_probe = probe_of(sim);
  Driver driver{sim};
  driver.run(engine);
  return engine.finished();
}

TEST(MicroBatchPolicy, KeepsTheBestThroughputNotTheLargest) {
  SimTrainer sim;
  // Fewer launches with larger micro-batches, but 16 and 32 fall off a cliff (say, a kernel that
  // stops fitting in cache): the best is 8.
  sim.step_ms = [](int64_t m) { return 16.0 + 64.0 / static_cast<double>(m) + (m >= 16 ? 8 : 0); };
  KnobRegistry knobs;
  register_micro(knobs, sim, kDomain);
  const AutotuneConfig config = config_for_test();
  TrialEngine engine(knobs, make_autotune_policy(config), config);
  ASSERT_TRUE(tune(engine, sim, false));
  EXPECT_EQ(chosen_micro(engine), 8);
  EXPECT_EQ(sim.micro, 8);  // applied
  // Larger ones than the best were measured (16 did not decline by 15%, so 32 was tried too);
  // smaller ones than the start were not (the start fits).
  EXPECT_EQ(tried(engine), (std::vector<int64_t>{2, 4, 8, 16, 32}));
  EXPECT_EQ(engine.decision()->policy, "micro-batch search");
  for (const auto& t : engine.decision()->trials) EXPECT_LT(t.peak_memory_fraction, 0);  // no probe
}

TEST(MicroBatchPolicy, StaysWithinTheMemoryHeadroom) {
  for (const double headroom : {0.9, 0.7}) {
    SimTrainer sim;
    sim.step_ms = [](int64_t m) { return 16.0 + 64.0 / static_cast<double>(m); };  // larger: faster
    sim.peak_fraction = [](int64_t m) { return 0.05 * static_cast<double>(m); };   // 16: 0.8
    KnobRegistry knobs;
    register_micro(knobs, sim, kDomain);
    AutotuneConfig config = config_for_test();
    config.memory_headroom = headroom;
    TrialEngine engine(knobs, make_autotune_policy(config), config);
    ASSERT_TRUE(tune(engine, sim, true));
    const int64_t expected = headroom == 0.9 ? 16 : 8;
    EXPECT_EQ(chosen_micro(engine), expected) << "headroom " << headroom;
    // The first micro-batch above the headroom failed, with its peak in the note, and nothing
    // larger was tried after it.
    const auto& trials = engine.decision()->trials;
    const TrialResult& last = trials.back();
    EXPECT_TRUE(last.failed);
    EXPECT_EQ(last.setting.at(kMicroBatchKnob), expected * 2);
    EXPECT_NE(last.note.find("autotune.memory_headroom"), std::string::npos) << last.note;
    EXPECT_NEAR(last.peak_memory_fraction, 0.05 * static_cast<double>(expected * 2), 1e-6);
    for (const auto& t : trials) EXPECT_LE(t.setting.at(kMicroBatchKnob), expected * 2);
  }
}

TEST(MicroBatchPolicy, GoesSmallerWhenTheStartDoesNotFit) {
  SimTrainer sim;
  sim.micro = 16;
  sim.step_ms = [](int64_t m) { return 16.0 + 64.0 / static_cast<double>(m); };
  sim.peak_fraction = [](int64_t m) { return 0.1 * static_cast<double>(m); };  // 8: 0.8, 16: 1.6
  KnobRegistry knobs;
  register_micro(knobs, sim, kDomain);
  const AutotuneConfig config = config_for_test();
  TrialEngine engine(knobs, make_autotune_policy(config), config);
  ASSERT_TRUE(tune(engine, sim, true));
  EXPECT_TRUE(engine.decision()->trials.front().failed);
  EXPECT_EQ(chosen_micro(engine), 8);
  EXPECT_EQ(tried(engine), (std::vector<int64_t>{16, 8}));
}

TEST(MicroBatchPolicy, AStartThatDoesNotFitIsRescuedBeforeTheLoaderSearch) {
  SimTrainer sim;
  sim.micro = 16;
  sim.step_ms = [&sim](int64_t m) {
    return std::max(16.0 + 64.0 / static_cast<double>(m), sim.workers == 0 ? 30.0 : 10.0);
  };
  sim.peak_fraction = [](int64_t m) { return 0.1 * static_cast<double>(m); };  // 16: 1.6
  KnobRegistry knobs;
  knobs.add({"loader.workers",
             {0, 1, 2},
             [&sim] { return sim.workers; },
             [&sim](int64_t v) { sim.workers = v; }});
  register_micro(knobs, sim, kDomain);
  const AutotuneConfig config = config_for_test();
  TrialEngine engine(knobs, make_autotune_policy(config), config);
  ASSERT_TRUE(tune(engine, sim, true));
  const auto& trials = engine.decision()->trials;
  ASSERT_GE(trials.size(), 3u);
  EXPECT_TRUE(trials[0].failed);
  // The first proposal is a smaller micro-batch, not a loader trial at the start that cannot fit.
  EXPECT_EQ(trials[1].setting.at(kMicroBatchKnob), 8);
  EXPECT_EQ(trials[1].setting.at("loader.workers"), 0);
  EXPECT_FALSE(trials[1].failed);
  for (const auto& t : trials) {
    if (t.setting.at(kMicroBatchKnob) == 16) EXPECT_EQ(&t, &trials[0]) << "16 tried again";
  }
  EXPECT_EQ(engine.decision()->chosen.at(kMicroBatchKnob), 8);
  EXPECT_GE(engine.decision()->chosen.at("loader.workers"), 1);
}

TEST(MicroBatchPolicy, AFailureFromOutsideRestoresTheIncumbentAtOnce) {
  SimTrainer sim;
  sim.step_ms = [](int64_t m) { return 16.0 + 64.0 / static_cast<double>(m); };
  KnobRegistry knobs;
  register_micro(knobs, sim, kDomain);
  const AutotuneConfig config = config_for_test();
  TrialEngine engine(knobs, make_autotune_policy(config), config);
  std::vector<std::pair<TrialResult, bool>> logged;
  engine.on_trial = [&](const TrialResult& t, bool kept) { logged.push_back({t, kept}); };
  Driver driver{sim};
  bool oom_seen = false;
  while (!engine.finished() && driver.step < 1000) {
    if (sim.micro == 16 && !oom_seen) {
      // A step at 16 runs out of memory mid-way (hooks/memory/accumulation.h calls this from the
      // step).
      oom_seen = true;
      EXPECT_TRUE(engine.fail_current_trial("out of memory at batch.micro=16"));
      EXPECT_EQ(sim.micro, 8) << "the incumbent must be back before the step runs again";
    }
    engine.on_step(driver.next());
  }
  ASSERT_TRUE(oom_seen);
  ASSERT_TRUE(engine.finished());
  EXPECT_EQ(chosen_micro(engine), 8);
  EXPECT_EQ(tried(engine), (std::vector<int64_t>{2, 4, 8, 16}));  // 32 not tried after 16 failed
  const TrialResult& failed = engine.decision()->trials.back();
  EXPECT_TRUE(failed.failed);
  EXPECT_EQ(failed.note, "out of memory at batch.micro=16");
  ASSERT_FALSE(logged.empty());
  EXPECT_TRUE(logged.back().first.failed);
  EXPECT_FALSE(logged.back().second);
  // Outside a trial nothing changes.
  EXPECT_FALSE(engine.fail_current_trial("late"));
}

TEST(MicroBatchPolicy, RunsAfterTheLoaderSearchAndBothAgainWhenItMoved) {
  SimTrainer sim;
  // Data-bound without a worker; one worker feeds a step of 40 ms, enough for the start's 48 ms
  // but not for a larger micro-batch's 18-32 ms: the first pass finds micro 4 (every larger one
  // waits for data), the second more workers and then the larger micro-batches.
  sim.step_ms = [&sim](int64_t m) {
    const double compute = 16.0 + 64.0 / static_cast<double>(m);
    return sim.workers == 0 ? compute + 40.0 : std::max(compute, 40.0 / sim.workers);
  };
  KnobRegistry knobs;
  knobs.add({"loader.workers",
             {0, 1, 2, 4},
             [&sim] { return sim.workers; },
             [&sim](int64_t v) { sim.workers = v; }});
  register_micro(knobs, sim, kDomain);
  const AutotuneConfig config = config_for_test();
  TrialEngine engine(knobs, make_autotune_policy(config), config);
  ASSERT_TRUE(tune(engine, sim, false));
  const TuningDecision& d = *engine.decision();
  EXPECT_EQ(d.policy, "loader coordinate search, then micro-batch search");
  // The grid's best is micro 32 with 4 workers (18 ms); two workers give 20 ms from micro 16 on,
  // and the search keeps the fewer workers on a tie: 16 or 32 with 2 or more workers. The first
  // pass alone stopped at 40 ms (micro 4, one worker).
  EXPECT_GE(d.chosen.at(kMicroBatchKnob), 16);
  EXPECT_GE(d.chosen.at("loader.workers"), 2);
  const double best = kBatch * 1e3 / 18.0;
  EXPECT_GE(d.chosen_throughput, 0.9 * best * 0.999) << d.chosen_throughput;
  EXPECT_GT(d.chosen_throughput, 1.9 * kBatch * 1e3 / 40.0);
  // The first micro-batch trial came after the first pass's loader trials, and the second pass
  // went back to the loader.
  size_t first_micro = 0, loader_after = 0;
  for (size_t i = 1; i < d.trials.size(); ++i) {
    const bool micro_changed = d.trials[i].setting.at(kMicroBatchKnob) != 2;
    if (micro_changed && first_micro == 0) first_micro = i;
    if (first_micro > 0 && d.trials[i].setting.at("loader.workers") > 1) {
      loader_after = loader_after == 0 ? i : loader_after;
    }
  }
  EXPECT_GT(first_micro, 1u);
  EXPECT_GT(loader_after, first_micro);
}

TEST(MicroBatchPolicy, WithoutTheKnobTheLoaderSearchRunsAsAlone) {
  SimTrainer sim;
  sim.step_ms = [&sim](int64_t) {
    return sim.workers == 0 ? 60.0 : std::max(10.0, 40.0 / sim.workers);
  };
  KnobRegistry a, b;
  for (KnobRegistry* k : {&a, &b}) {
    k->add({"loader.workers",
            {0, 1, 2, 4},
            [&sim] { return sim.workers; },
            [&sim](int64_t v) { sim.workers = v; }});
  }
  const AutotuneConfig config = config_for_test();
  TrialEngine alone(a, make_loader_policy(config), config);
  Driver da{sim};
  da.run(alone);
  sim.workers = 0;
  TrialEngine composed(b, make_autotune_policy(config), config);
  Driver db{sim};
  db.run(composed);
  ASSERT_TRUE(alone.finished());
  ASSERT_TRUE(composed.finished());
  EXPECT_EQ(composed.decision()->policy, "loader coordinate search");
  ASSERT_EQ(alone.decision()->trials.size(), composed.decision()->trials.size());
  for (size_t i = 0; i < alone.decision()->trials.size(); ++i) {
    EXPECT_EQ(alone.decision()->trials[i].setting, composed.decision()->trials[i].setting);
  }
}

TEST(MicroBatchPolicy, NothingWithoutTheKnob) {
  KnobRegistry knobs;
  auto policy = make_micro_batch_policy(AutotuneConfig{});
  std::vector<TrialResult> trials(1);
  EXPECT_FALSE(policy->propose(trials, 0, knobs).has_value());
}

// Two ranks: rank 0 runs out of memory at 16, rank 1 does not; both fail the trial at the
// window's end and take the same decision. The ranks' windows meet in a shared list, as the
// store would combine them.
TEST(MicroBatchPolicy, AnOutOfMemoryOnOneRankFailsTheTrialOnAll) {
  SimTrainer sims[2];
  KnobRegistry knobs[2];
  const AutotuneConfig config = config_for_test();
  std::vector<std::unique_ptr<TrialEngine>> engines;
  for (int r = 0; r < 2; ++r) {
    sims[r].step_ms = [](int64_t m) { return 16.0 + 64.0 / static_cast<double>(m); };
    register_micro(knobs[r], sims[r], kDomain);
    engines.push_back(
        std::make_unique<TrialEngine>(knobs[r], make_autotune_policy(config), config));
  }
  // Rank 0 runs first and keeps its windows (alone, its own window is its combination); rank 1
  // then combines each of its windows with rank 0's of the same trial and round, as the store
  // would.
  std::vector<TrialWindow> windows0;
  engines[0]->agreement = [&](const TrialWindow& w) -> std::optional<TrialWindow> {
    windows0.push_back(w);
    return w;
  };
  Driver d0{sims[0]}, d1{sims[1]};
  bool oom = false;
  while (!engines[0]->finished() && d0.step < 400) {
    if (sims[0].micro == 16 && !oom) {
      oom = true;
      EXPECT_TRUE(engines[0]->fail_current_trial("out of memory at batch.micro=16"));
      EXPECT_EQ(sims[0].micro, 8);  // this rank runs the rest of the window with the incumbent
    }
    engines[0]->on_step(d0.next());
  }
  ASSERT_TRUE(oom);
  // Rank 0's own window of the 16 trial says failed (the rank that ran out tells the others).
  const auto it =
      std::find_if(windows0.begin(), windows0.end(), [](const TrialWindow& w) { return w.failed; });
  ASSERT_NE(it, windows0.end());
  EXPECT_EQ(it->note, "out of memory at batch.micro=16");
  // Rank 1 never ran out: combined with rank 0's windows, its trial at 16 fails too.
  size_t next0 = 0;
  engines[1]->agreement = [&](const TrialWindow& w) -> std::optional<TrialWindow> {
    while (next0 < windows0.size() &&
           (windows0[next0].trial != w.trial || windows0[next0].round != w.round)) {
      ++next0;
    }
    if (next0 == windows0.size()) return std::nullopt;
    return combine_trial_windows({windows0[next0], w});
  };
  while (!engines[1]->finished() && d1.step < 400) engines[1]->on_step(d1.next());
  ASSERT_TRUE(engines[1]->finished());
  const auto& trials1 = engines[1]->decision()->trials;
  const auto failed16 = std::find_if(trials1.begin(), trials1.end(), [](const TrialResult& t) {
    return t.setting.at(kMicroBatchKnob) == 16;
  });
  ASSERT_NE(failed16, trials1.end());
  EXPECT_TRUE(failed16->failed);
  EXPECT_EQ(chosen_micro(*engines[1]), 8);
  EXPECT_EQ(chosen_micro(*engines[0]), 8);
}

TEST(MicroBatchPolicy, CombinedWindowsCarryTheLargestPeak) {
  TrialWindow a, b;
  a.peak_memory_fraction = 0.4;
  a.peak_memory_bytes = 40;
  b.peak_memory_fraction = 0.7;
  b.peak_memory_bytes = 70;
  const auto c = combine_trial_windows({a, b});
  ASSERT_TRUE(c.has_value());
  EXPECT_DOUBLE_EQ(c->peak_memory_fraction, 0.7);
  EXPECT_EQ(c->peak_memory_bytes, 70);
  TrialWindow parsed;
  ASSERT_TRUE(from_json(to_json(b), parsed));
  EXPECT_DOUBLE_EQ(parsed.peak_memory_fraction, 0.7);
}

}  // namespace
}  // namespace torchpilot
