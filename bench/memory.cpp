// bench/memory: the micro-batch search on the GPT example (docs/memory.md). Measures, each in
// its own run of the same model:
//   start  the starting setting (micro-batch --micro x accumulation batch/micro), mode advise,
//          offloading off (--offload-activations: only auto-tune may turn it on);
//   tuned  mode autotune from the same start until the decision (failed trials, out-of-memory
//          recoveries), then the tuned setting measured in the same process;
//   grid   each micro-batch of --grid in mode advise, offloading off (an out-of-memory point is
//          recorded as such);
// tokens/s of each (device synchronized around the measured steps), the tuned/start ratio and the
// tuned setting against the grid's best (goal: within 5%). JSON with machine, date and commit.
//
// GPU (the reference model, bf16): build/bench/memory --batch 32 --micro 2 --out
// bench/runs/memory-<machine>.json --machine <machine> --commit $(git rev-parse --short HEAD)
// CPU smoke (tiny sizes): --device cpu --d-model 32 --layers 1 --heads 2 --seq 16 --batch 8
// --micro 2 --steps 5 --warmup-steps 40 --settle-steps 1 --measure-steps 3 --min-window-ms 0
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_cuda.h"
#include "gpt_cli.h"
#include "gpt_trainer.h"
#include "harness.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/memory/batch_policy.h"

namespace {

using nlohmann::json;

struct Args {
  gpt_example::TrainOptions train;
  int64_t micro = 2;
  std::vector<int64_t> grid;   // empty: powers of two up to the batch
  int steps = 50;              // measured steps per setting
  int prime = 5;               // untimed steps before each measurement
  int max_tune_steps = 2000;   // the search's steps at most (it decides within its budget)
  double memory_fraction = 1;  // of the device's memory the caching allocator may use
  torchpilot::AutotuneConfig autotune;
  bench::RunFlags run;  // --machine, --commit, --out
};

torchpilot::Config config_for(const Args& a, torchpilot::Mode mode) {
  torchpilot::Config c;
  c.mode = mode;
  c.log.level = mode == torchpilot::Mode::kAutotune ? "info" : "warn";
  c.autotune = a.autotune;
  return c;
}

bool is_oom(const std::string& what) { return what.find("out of memory") != std::string::npos; }

// The start and the grid run without offloading (an offload made from options starts on): the
// search starts without it too, and only auto-tune may turn it on.
void without_offloading(gpt_example::Trainer& trainer) {
  if (trainer.offload() != nullptr) trainer.offload()->set_enabled(false);
}

// tokens/s over `steps` steps after `prime` untimed ones.
double measure(gpt_example::Trainer& trainer, torchpilot::Pilot& pilot, const Args& a) {
  trainer.train(pilot, a.prime);
  trainer.synchronize();
  const auto t0 = bench::Clock::now();
  trainer.train(pilot, a.steps);
  trainer.synchronize();
  const double s = bench::seconds_since(t0);
  return static_cast<double>(a.steps * a.train.batch * a.train.seq) / s;
}

json trials_json(const torchpilot::TuningDecision& d) {
  json out = json::array();
  for (const auto& t : d.trials) {
    out.push_back(
        {{"micro_batch", t.setting.count(torchpilot::kMicroBatchKnob)
                             ? json(t.setting.at(torchpilot::kMicroBatchKnob))
                             : json(nullptr)},
         {"offload", t.setting.count("offload.enabled") ? json(t.setting.at("offload.enabled") != 0)
                                                        : json(nullptr)},
         {"throughput", t.throughput},
         {"unit", t.unit},
         {"peak_memory_fraction",
          t.peak_memory_fraction >= 0 ? json(t.peak_memory_fraction) : json(nullptr)},
         {"failed", t.failed},
         {"note", t.note}});
  }
  return out;
}

int run(int argc, char** argv) {
  Args a;
  a.train = gpt_example::reference_options(32);
  std::string precision = "bf16";
  CLI::App app{"bench/memory: the micro-batch search against its start and a grid"};
  example_cli::last_wins(app);
  gpt_example::add_shape_flags(app, a.train, "the rank's batch (rows per optimizer step)");
  bench::int_flag(app, "--micro", a.micro, 1, 65536, "the starting micro-batch");
  app.add_option("--grid", a.grid, "micro-batches of the grid; default powers of two to --batch")
      ->delimiter(',');
  gpt_example::add_precision_flags(app, precision);
  app.add_option("--device", a.train.device, "cpu, cuda or cuda:N; default cuda when available");
  bench::int_flag(app, "--steps", a.steps, 1, 1000000, "measured steps per setting");
  bench::int_flag(app, "--prime", a.prime, 0, 1000000, "untimed steps before each");
  bench::int_flag(app, "--max-tune-steps", a.max_tune_steps, 1, 10000000,
                  "most steps the search may take");
  bench::int_flag(app, "--warmup-steps", a.autotune.warmup_steps, 0, 1000000000,
                  "autotune.warmup_steps");
  bench::number_flag(app, "--warmup-seconds", a.autotune.warmup_seconds, -1e-9, 86400,
                     "autotune.warmup_seconds");
  bench::int_flag(app, "--settle-steps", a.autotune.settle_steps, 0, 10000,
                  "autotune.settle_steps");
  bench::int_flag(app, "--measure-steps", a.autotune.measure_steps, 3, 10000,
                  "autotune.measure_steps");
  bench::number_flag(app, "--min-window-ms", a.autotune.min_window_ms, -1e-9, 600000,
                     "autotune.min_window_ms");
  bench::number_flag(app, "--headroom", a.autotune.memory_headroom, 0.05, 1,
                     "autotune.memory_headroom");
  app.add_flag("--offload-activations", a.train.offload_activations,
               "the GPT example's activation offloading (its knob joins the search)");
  bench::add_memory_fraction_flag(app, a.memory_fraction);
  bench::add_run_flags(app, a.run, "write the results here (JSON)", false);
  example_cli::parse_or_exit(app, argc, argv);
  if (a.micro > a.train.batch) example_cli::fail(app, "--micro", "larger than --batch");
  gpt_example::apply_precision_flags(a.train, precision);
  if (a.grid.empty()) {
    for (int64_t m = 1; m <= a.train.batch; m *= 2) a.grid.push_back(m);
    if (a.grid.back() != a.train.batch) a.grid.push_back(a.train.batch);
  }

  const bool capped = a.memory_fraction < 1 && bench::cap_device_memory(a.memory_fraction);
  if (capped) {
    std::printf("memory: the caching allocator is capped at %.3f of the device's memory\n",
                a.memory_fraction);
  }

  auto options_with = [&](int64_t micro) {
    gpt_example::TrainOptions o = a.train;
    o.micro_batch = micro;
    o.micro_choices = a.grid;
    return o;
  };

  // start
  double start_tps = 0;
  std::string device;
  {
    torchpilot::Pilot pilot(config_for(a, torchpilot::Mode::kAdvise));
    gpt_example::Trainer trainer(options_with(a.micro));
    without_offloading(trainer);
    device = trainer.device();
    precision = gpt_example::to_string(trainer.precision());  // fp32 on the CPU
    start_tps = measure(trainer, pilot, a);
    trainer.detach_pilot();
  }
  std::printf("memory: start micro %lld x %lld: %.0f tokens/s\n", static_cast<long long>(a.micro),
              static_cast<long long>((a.train.batch + a.micro - 1) / a.micro), start_tps);

  // tuned
  json tuned = json::object();
  double tuned_tps = 0;
  int64_t tuned_micro = 0;
  {
    torchpilot::Pilot pilot(config_for(a, torchpilot::Mode::kAutotune));
    gpt_example::Trainer trainer(options_with(a.micro));
    int64_t steps = 0;
    while (!pilot.tuning_finished() && steps < a.max_tune_steps) {
      trainer.train(pilot, 1);
      ++steps;
    }
    trainer.synchronize();
    tuned_micro = trainer.micro_batch();
    tuned["search_steps"] = steps;
    tuned["oom_recoveries"] = trainer.oom_recoveries();
    if (pilot.tuning_decision()) {
      const auto& d = *pilot.tuning_decision();
      tuned["trials"] = trials_json(d);
      tuned["reason"] = d.reason;
      int64_t failed = 0;
      for (const auto& t : d.trials) failed += t.failed ? 1 : 0;
      tuned["failed_trials"] = failed;
    }
    tuned_tps = measure(trainer, pilot, a);
    tuned["micro_batch"] = tuned_micro;
    tuned["accumulation"] = trainer.accumulation();
    tuned["offload"] = trainer.offload() != nullptr && trainer.offload()->enabled();
    tuned["tokens_per_s"] = tuned_tps;
    trainer.detach_pilot();
  }
  std::printf(
      "memory: tuned micro %lld: %.0f tokens/s (%.3fx the start), %lld out-of-memory "
      "recoveries\n",
      static_cast<long long>(tuned_micro), tuned_tps, tuned_tps / start_tps,
      static_cast<long long>(tuned["oom_recoveries"].get<int64_t>()));

  // grid
  json grid = json::array();
  double best = 0;
  int64_t best_micro = 0;
  for (int64_t m : a.grid) {
    json point = {{"micro_batch", m}};
    try {
      torchpilot::Pilot pilot(config_for(a, torchpilot::Mode::kAdvise));
      gpt_example::Trainer trainer(options_with(m));
      without_offloading(trainer);
      const double tps = measure(trainer, pilot, a);
      trainer.detach_pilot();
      point["tokens_per_s"] = tps;
      if (tps > best) {
        best = tps;
        best_micro = m;
      }
      std::printf("memory: grid micro %lld: %.0f tokens/s\n", static_cast<long long>(m), tps);
    } catch (const std::exception& e) {
      if (!is_oom(e.what())) throw;
      point["out_of_memory"] = true;
      std::printf("memory: grid micro %lld: out of memory\n", static_cast<long long>(m));
    }
    grid.push_back(point);
  }
  const double within = best > 0 ? tuned_tps / best : 0;
  std::printf("memory: tuned/start %.3f; tuned/grid best (micro %lld) %.3f (goal >= 0.95)\n",
              tuned_tps / start_tps, static_cast<long long>(best_micro), within);

  if (!a.run.out.empty()) {
    json j = bench::run_header("memory", a.run);
    j["benchmark"] = j["bench"];  // this file has always named it "benchmark"
    j.erase("bench");
    j.update({{"device", device},
              {"model",
               {{"d_model", a.train.d_model},
                {"layers", a.train.layers},
                {"heads", a.train.heads},
                {"seq", a.train.seq},
                {"batch", a.train.batch},
                {"precision", precision},
                {"offload_activations", a.train.offload_activations},
                {"memory_fraction", capped ? a.memory_fraction : 1.0}}},
              {"autotune",
               {{"warmup_steps", a.autotune.warmup_steps},
                {"warmup_seconds", a.autotune.warmup_seconds},
                {"settle_steps", a.autotune.settle_steps},
                {"measure_steps", a.autotune.measure_steps},
                {"min_window_ms", a.autotune.min_window_ms},
                {"memory_headroom", a.autotune.memory_headroom}}},
              {"steps", a.steps},
              {"start",
               {{"micro_batch", a.micro},
                {"accumulation", (a.train.batch + a.micro - 1) / a.micro},
                {"tokens_per_s", start_tps}}},
              {"tuned", tuned},
              {"tuned_vs_start", tuned_tps / start_tps},
              {"grid", grid},
              {"grid_best_micro_batch", best_micro},
              {"tuned_vs_grid_best", within}});
    bench::write_json(a.run.out, j);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("memory", argc, argv, run); }
