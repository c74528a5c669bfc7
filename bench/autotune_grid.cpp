// autotune_grid: how close does auto-tune get to the best loader setting an exhaustive grid finds?
//
// On the JPEG example's trainer:
//  1. Screen: each round runs every grid point (workers x prefetch x pinning/GPU prefetch) for a
//     fixed number of steps, plus one auto-tuned run from LibTorch's default (workers 0), in a
//     shuffled order (A/B interleaved in one process).
//  2. Final: the best grid points of the screen, the default, and every setting auto-tune chose
//     are measured again, interleaved, with longer runs and more rounds. The maximum of many noisy
//     screen medians overstates the best (winner's curse); the final round measures the
//     candidates and the auto-tuned settings the same way.
//  3. Held out: the final round's best is itself the largest of several near-equal noisy medians
//     (the same curse, one stage later), so the best grid setting and the auto-tuned settings are
//     measured once more in fresh interleaved rounds, and their ratio is read there. Both ratios
//     are reported.
// Throughput = samples / wall time of the measured steps (a run's first steps, which fill the
// pipeline, are skipped). Figures are medians over rounds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "harness.h"
#include "torchpilot/hooks/loader/torch_transfer.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/loader/loader_core.h"
#include "trainer.h"

namespace {

using bench::median;

using nlohmann::json;
using torchpilot::LoaderSettings;

struct Args {
  std::string data_dir = "data/jpeg_classifier";
  bench::RunFlags run;    // --machine, --commit, --out
  int screen_rounds = 3;  // each also runs auto-tune --autotune-runs times
  int autotune_runs = 1;  // auto-tuned runs per screen round
  int screen_steps = 64;
  int final_rounds = 5;
  int final_steps = 480;
  int top = 5;              // screen leaders re-measured in the final
  int holdout_rounds = 3;   // fresh rounds of the final's best and the auto-tuned settings
  int after_decision = 96;  // auto-tune steps measured after its decision
  int max_workers = 0;      // 0: affinity CPUs
};

// Samples per second over the history's records from `from` on.
double throughput(const std::vector<torchpilot::StepRecord>& steps, size_t from) {
  int64_t samples = 0;
  torchpilot::Nanos ns = 0;
  for (size_t i = from; i < steps.size(); ++i) {
    samples += steps[i].samples;
    ns += steps[i].step_ns();
  }
  return ns > 0 ? samples * 1e9 / static_cast<double>(ns) : 0.0;
}

std::string label(const LoaderSettings& s) {
  return "w" + std::to_string(s.workers) + " p" + std::to_string(s.prefetch) +
         (s.pin_memory ? " pin" : "") + (s.device_prefetch ? " gpu-prefetch" : "");
}

bool same(const LoaderSettings& a, const LoaderSettings& b) {
  return a.workers == b.workers && a.prefetch == b.prefetch && a.pin_memory == b.pin_memory &&
         a.device_prefetch == b.device_prefetch;
}

torchpilot::Config quiet(torchpilot::Mode mode) {
  torchpilot::Config c;
  c.mode = mode;
  c.log.level = "warn";
  return c;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// One run with a fixed setting; samples/s over its steps after the first quarter.
double fixed_run(jpeg_example::Trainer& trainer, const LoaderSettings& s, int steps) {
  torchpilot::Pilot pilot(quiet(torchpilot::Mode::kAdvise));
  trainer.run(pilot, steps, s);
  return throughput(pilot.recent_steps(), static_cast<size_t>(steps / 4));
}

// Every setting once per round for `steps` steps, each round in a shuffled order: samples/s of
// each setting's runs, in the settings' order.
std::vector<std::vector<double>> interleaved_runs(jpeg_example::Trainer& trainer,
                                                  const std::vector<LoaderSettings>& settings,
                                                  int rounds, int steps, std::mt19937& rng) {
  std::vector<std::vector<double>> runs(settings.size());
  bench::interleave_shuffled(rounds, settings.size(), rng, [&](size_t i) {
    runs[i].push_back(fixed_run(trainer, settings[i], steps));
  });
  return runs;
}

// The median of `s`'s runs (0 when `s` is not among `settings`).
double median_for(const std::vector<LoaderSettings>& settings,
                  const std::vector<std::vector<double>>& runs, const LoaderSettings& s) {
  for (size_t i = 0; i < settings.size(); ++i) {
    if (same(settings[i], s)) return median(runs[i]);
  }
  return 0.0;
}

// A knob setting as the grid names it (knobs absent from it: off, 0).
LoaderSettings loader_settings(const torchpilot::Setting& s) {
  auto get = [&](const char* k) { return s.count(k) ? s.at(k) : 0; };
  return LoaderSettings{static_cast<int>(get("loader.workers")),
                        static_cast<int>(get("loader.prefetch")), get("loader.pin_memory") != 0,
                        get("loader.device_prefetch") != 0};
}

struct AutoRun {
  LoaderSettings chosen;
  int64_t steps_used = 0;
  double seconds_used = 0;
  size_t trials = 0;
  double trial_samples_per_s = 0;   // the chosen trial's own figure
  double after_samples_per_s = 0;   // measured in the same run after the decision
  json trial_list = json::array();  // every trial, for diagnosing a run
};

AutoRun autotuned_run(jpeg_example::Trainer& trainer, int max_workers, int after) {
  torchpilot::Config config = quiet(torchpilot::Mode::kAutotune);
  config.autotune.max_workers = max_workers;
  torchpilot::Pilot pilot(config);
  auto stop = [&pilot, after] {
    const auto& d = pilot.tuning_decision();
    return d && pilot.steps() >= d->decided_at_step + 1 + after;
  };
  trainer.run(pilot, 1000000, LoaderSettings{}, stop);  // starts at LibTorch's default
  const auto& d = pilot.tuning_decision();
  if (!d || d->trials.empty()) throw std::runtime_error("auto-tune made no decision");
  AutoRun r;
  r.chosen = loader_settings(d->chosen);
  r.steps_used = d->steps_used;
  r.trials = d->trials.size();
  for (const auto& t : d->trials) {
    r.trial_list.push_back({{"setting", label(loader_settings(t.setting))},
                            {"samples_per_s", t.throughput},
                            {"relative_error", t.relative_error},
                            {"supply_limited", t.supply_limited},
                            {"confirmation", t.confirmation},
                            {"failed", t.failed}});
  }
  r.trial_samples_per_s = d->chosen_throughput;
  const auto steps = pilot.recent_steps();
  for (const auto& s : steps) {
    if (s.step <= d->decided_at_step) r.seconds_used += static_cast<double>(s.step_ns()) / 1e9;
  }
  // After the decision, skip a few steps while the chosen setting's pipeline fills.
  r.after_samples_per_s =
      throughput(steps, static_cast<size_t>(d->decided_at_step + 1 + after / 4));
  return r;
}

int run(int argc, char** argv) {
  Args a;
  CLI::App app(
      "autotune_grid: how close auto-tune gets to the best loader setting an exhaustive grid "
      "finds, on the JPEG example's trainer (bench/README.md).",
      "autotune_grid");
  example_cli::last_wins(app);
  example_cli::add_path(app, "--data", a.data_dir, "DIR",
                        "image folder; generated (10 classes x 160 images) if it has no images")
      ->check(example_cli::DirectoryOrAbsent())
      ->capture_default_str();
  bench::add_run_flags(app, a.run, "write the results here (JSON)");
  bench::int_flag(app, "--screen-rounds", a.screen_rounds, 1, 1000,
                  "screen rounds (each runs every grid point and auto-tune --autotune-runs "
                  "times)");
  bench::int_flag(app, "--autotune-runs", a.autotune_runs, 1, 100,
                  "auto-tuned runs per screen round (more runs, one screen: the spread of "
                  "auto-tune's choices at less cost)");
  bench::int_flag(app, "--screen-steps", a.screen_steps, 1, 1000000, "steps per screen run");
  bench::int_flag(app, "--final-rounds", a.final_rounds, 1, 1000, "final rounds");
  bench::int_flag(app, "--final-steps", a.final_steps, 1, 1000000, "steps per final run");
  bench::int_flag(app, "--top", a.top, 1, 1000, "screen leaders re-measured in the final");
  bench::int_flag(app, "--holdout-rounds", a.holdout_rounds, 0, 1000,
                  "fresh rounds of the final's best grid setting and the auto-tuned settings "
                  "(0: none)");
  bench::int_flag(app, "--after-decision", a.after_decision, 1, 1000000,
                  "auto-tune steps measured after its decision");
  bench::int_flag(app, "--max-workers", a.max_workers, 0, torchpilot::LoaderCore::kMaxWorkers,
                  "largest worker count of the grid and of auto-tune (0: the CPUs in this "
                  "process's affinity)");
  example_cli::parse_or_exit(app, argc, argv);

  const int cpus = torchpilot::affinity_cpu_count();
  const int max_workers = a.max_workers > 0 ? a.max_workers : cpus;

  jpeg_example::TrainOptions options;
  options.data_dir = a.data_dir;
  jpeg_example::Trainer trainer(options);

  // The grid: every worker count up to 8, then every second one; prefetch 1..8; pinning and GPU
  // prefetch where this build and machine have them. Prefetch means nothing without workers.
  std::vector<int> worker_counts;
  for (int w = 0; w <= max_workers; ++w) {
    if (w <= 8 || w % 2 == 0 || w == max_workers) worker_counts.push_back(w);
  }
  std::vector<std::pair<bool, bool>> transfer = {{false, false}};
  if (torchpilot::detail::pin_memory_available()) {
    transfer = {{false, false}, {true, false}, {true, true}};
  }
  std::vector<LoaderSettings> grid;
  for (int w : worker_counts) {
    for (int p : {1, 2, 4, 8}) {
      if (w == 0 && p != 2) continue;
      for (auto [pin, dev] : transfer) grid.push_back(LoaderSettings{w, p, pin, dev});
    }
  }
  std::printf("autotune_grid: %s, %d CPUs, device %s, %zu grid points\n", a.run.machine.c_str(),
              cpus, trainer.device().c_str(), grid.size());
  std::fflush(stdout);
  const auto started = bench::Clock::now();
  std::mt19937 rng(12345);

  // 1. Screen, with the auto-tuned runs interleaved (indices from grid.size() on).
  std::vector<std::vector<double>> screen(grid.size());
  std::vector<AutoRun> autos;
  const size_t screen_items = grid.size() + static_cast<size_t>(a.autotune_runs);
  bench::interleave_shuffled(a.screen_rounds, screen_items, rng, [&](size_t item) {
    if (item < grid.size()) {
      screen[item].push_back(fixed_run(trainer, grid[item], a.screen_steps));
      return;
    }
    autos.push_back(autotuned_run(trainer, max_workers, a.after_decision));
    const AutoRun& r = autos.back();
    std::printf(
        "  auto-tune run %zu: chose [%s] in %lld steps (%.1f s), %zu trials; %.0f "
        "samples/s after the decision\n",
        autos.size(), label(r.chosen).c_str(), static_cast<long long>(r.steps_used), r.seconds_used,
        r.trials, r.after_samples_per_s);
    std::fflush(stdout);
  });

  // 2. Final: screen leaders, the default and the auto-tuned settings, measured alike.
  std::vector<size_t> by_screen(grid.size());
  for (size_t i = 0; i < grid.size(); ++i) by_screen[i] = i;
  std::sort(by_screen.begin(), by_screen.end(),
            [&](size_t x, size_t y) { return median(screen[x]) > median(screen[y]); });
  std::vector<LoaderSettings> finalists;
  std::vector<std::string> roles;
  auto add = [&](const LoaderSettings& s, const std::string& role) {
    for (size_t i = 0; i < finalists.size(); ++i) {
      if (same(finalists[i], s)) {
        roles[i] += "+" + role;
        return;
      }
    }
    finalists.push_back(s);
    roles.push_back(role);
  };
  for (int k = 0; k < a.top && k < static_cast<int>(by_screen.size()); ++k) {
    add(grid[by_screen[static_cast<size_t>(k)]], "grid-top" + std::to_string(k + 1));
  }
  add(LoaderSettings{}, "default");
  for (const auto& r : autos) add(r.chosen, "auto-tuned");
  const std::vector<std::vector<double>> final_tp =
      interleaved_runs(trainer, finalists, a.final_rounds, a.final_steps, rng);
  auto final_of = [&](const LoaderSettings& s) { return median_for(finalists, final_tp, s); };
  size_t best = 0;
  for (size_t i = 0; i < finalists.size(); ++i) {
    if (roles[i].find("grid-top") != std::string::npos &&
        (roles[best].find("grid-top") == std::string::npos ||
         median(final_tp[i]) > median(final_tp[best]))) {
      best = i;
    }
  }
  const double best_tp = median(final_tp[best]);
  const double default_tp = final_of(LoaderSettings{});
  std::vector<double> auto_tp, auto_steps, auto_seconds, auto_after;
  for (const auto& r : autos) {
    auto_tp.push_back(final_of(r.chosen));
    auto_steps.push_back(static_cast<double>(r.steps_used));
    auto_seconds.push_back(r.seconds_used);
    auto_after.push_back(r.after_samples_per_s);
  }
  const double tuned_tp = median(auto_tp);

  // 3. Held out: the final's best and the auto-tuned settings, fresh rounds (selection and
  // evaluation on separate runs).
  std::vector<LoaderSettings> held{finalists[best]};
  for (const auto& r : autos) {
    if (std::none_of(held.begin(), held.end(),
                     [&](const LoaderSettings& h) { return same(h, r.chosen); })) {
      held.push_back(r.chosen);
    }
  }
  const std::vector<std::vector<double>> held_tp =
      interleaved_runs(trainer, held, a.holdout_rounds, a.final_steps, rng);
  auto held_of = [&](const LoaderSettings& s) { return median_for(held, held_tp, s); };
  std::vector<double> auto_held;
  for (const auto& r : autos) auto_held.push_back(held_of(r.chosen));
  const double best_held = a.holdout_rounds > 0 ? median(held_tp[0]) : 0.0;
  const double tuned_held = a.holdout_rounds > 0 ? median(auto_held) : 0.0;
  const double held_fraction = best_held > 0 ? tuned_held / best_held : 0.0;
  const double elapsed = bench::seconds_since(started);

  std::printf("\nfinal round (%d rounds of %d steps, medians):\n", a.final_rounds, a.final_steps);
  for (size_t i = 0; i < finalists.size(); ++i) {
    std::printf("  %-26s %-28s %8.0f samples/s\n", label(finalists[i]).c_str(), roles[i].c_str(),
                median(final_tp[i]));
  }
  std::printf("\n| figure | value |\n|---|---|\n");
  std::printf("| best grid setting (final round) | %s: %.0f samples/s |\n",
              label(finalists[best]).c_str(), best_tp);
  std::printf("| auto-tuned settings (median of %zu runs) | %.0f samples/s = %.1f%% of best |\n",
              autos.size(), tuned_tp, 100 * tuned_tp / best_tp);
  if (a.holdout_rounds > 0) {
    std::printf(
        "| held out (%d fresh rounds): best grid setting, auto-tuned (median of %zu runs) | %.0f, "
        "%.0f samples/s = %.1f%% of best |\n",
        a.holdout_rounds, autos.size(), best_held, tuned_held, 100 * held_fraction);
  }
  std::printf("| auto-tuned, measured in-run after the decision | %.0f samples/s |\n",
              median(auto_after));
  std::printf("| warm-up used (median) | %.0f steps, %.1f s |\n", median(auto_steps),
              median(auto_seconds));
  std::printf("| LibTorch default (workers 0) | %.0f samples/s; auto-tuned is x%.2f |\n",
              default_tp, tuned_tp / default_tp);
  std::printf("| bench wall time | %.0f s |\n", elapsed);

  if (!a.run.out.empty()) {
    json grid_json = json::array();
    for (size_t i = 0; i < grid.size(); ++i) {
      grid_json.push_back({{"setting", label(grid[i])},
                           {"screen_median_samples_per_s", median(screen[i])},
                           {"screen_runs", screen[i]}});
    }
    json finals = json::array();
    for (size_t i = 0; i < finalists.size(); ++i) {
      finals.push_back({{"setting", label(finalists[i])},
                        {"role", roles[i]},
                        {"median_samples_per_s", median(final_tp[i])},
                        {"runs", final_tp[i]}});
    }
    json auto_json = json::array();
    for (const auto& r : autos) {
      auto_json.push_back({{"chosen", label(r.chosen)},
                           {"steps_used", r.steps_used},
                           {"seconds_used", r.seconds_used},
                           {"trials", r.trials},
                           {"trial_list", r.trial_list},
                           {"trial_samples_per_s", r.trial_samples_per_s},
                           {"after_decision_samples_per_s", r.after_samples_per_s},
                           {"final_round_samples_per_s", final_of(r.chosen)},
                           {"holdout_samples_per_s", held_of(r.chosen)}});
    }
    json held_json = json::array();
    for (size_t i = 0; i < held.size(); ++i) {
      held_json.push_back({{"setting", label(held[i])},
                           {"role", i == 0 ? "best grid setting of the final" : "auto-tuned"},
                           {"median_samples_per_s", median(held_tp[i])},
                           {"runs", held_tp[i]}});
    }
    json j = bench::run_header("autotune_grid", a.run);
    j.update({{"cpu", cpu_model()},
              {"cpus_in_affinity", cpus},
              {"device", trainer.device()},
              {"method",
               "screen: every grid point and --autotune-runs auto-tuned runs per round, shuffled; "
               "final: screen "
               "top points, the default and the auto-tuned settings re-measured alike, shuffled; "
               "held out: the final's best grid setting and the auto-tuned settings in fresh "
               "rounds, shuffled; medians over rounds; throughput = samples / wall time of a "
               "run's steps after its first quarter"},
              {"batch_size", options.batch_size},
              {"screen",
               {{"rounds", a.screen_rounds},
                {"steps", a.screen_steps},
                {"autotune_runs_per_round", a.autotune_runs}}},
              {"final", {{"rounds", a.final_rounds}, {"steps", a.final_steps}}},
              {"best_grid", {{"setting", label(finalists[best])}, {"samples_per_s", best_tp}}},
              {"default_workers0_samples_per_s", default_tp},
              {"autotuned_samples_per_s", tuned_tp},
              {"autotuned_fraction_of_best", tuned_tp / best_tp},
              {"speedup_over_default", tuned_tp / default_tp},
              {"warmup_steps_used_median", median(auto_steps)},
              {"warmup_seconds_used_median", median(auto_seconds)},
              {"autotune_runs", auto_json},
              {"final_round", finals},
              {"holdout",
               {{"rounds", a.holdout_rounds},
                {"steps", a.final_steps},
                {"best_grid_samples_per_s", best_held},
                {"autotuned_samples_per_s", tuned_held},
                {"autotuned_fraction_of_best", held_fraction},
                {"settings", held_json}}},
              {"grid", grid_json},
              {"wall_s", elapsed}});
    bench::write_results("autotune_grid", a.run, j);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("autotune_grid", argc, argv, run); }
