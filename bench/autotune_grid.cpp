// autotune_grid: how close does auto-tune get to the best loader setting an exhaustive grid finds?
//
// On the JPEG example's trainer, each round runs every grid point (workers x prefetch x
// pinning/GPU prefetch) for a fixed number of steps and one auto-tuned run, in a shuffled order
// (A/B interleaved in one process); figures are medians over rounds. Throughput is samples over
// wall time of the measured steps (the first steps of each run, which fill the pipeline, are
// skipped). The auto-tuned figure is measured after its decision, on the steps that follow.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "torchpilot/loader_core.h"
#include "torchpilot/pilot.h"
#include "torchpilot/torch_transfer.h"
#include "trainer.h"

namespace {

using nlohmann::json;
using torchpilot::LoaderSettings;

struct Args {
  std::string data_dir = "data/jpeg_classifier";
  std::string out;         // JSON results file
  std::string machine = "unnamed";
  std::string commit = "unknown";
  int rounds = 3;
  int steps = 64;          // per grid run
  int skip = 16;           // steps not measured at the start of each run
  int after_decision = 64; // auto-tune steps measured after the decision
  int max_workers = 0;     // 0: affinity CPUs
};

// Samples per second over records [from, to) of the pilot's history.
double throughput(const std::vector<torchpilot::StepRecord>& steps, size_t from) {
  int64_t samples = 0;
  torchpilot::Nanos ns = 0;
  for (size_t i = from; i < steps.size(); ++i) {
    samples += steps[i].samples;
    ns += steps[i].step_ns();
  }
  return ns > 0 ? samples * 1e9 / static_cast<double>(ns) : 0.0;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string label(const LoaderSettings& s) {
  return "w" + std::to_string(s.workers) + " p" + std::to_string(s.prefetch) + (s.pin_memory ? " pin" : "") +
         (s.device_prefetch ? " gpu-prefetch" : "");
}

torchpilot::Config quiet(torchpilot::Mode mode) {
  torchpilot::Config c;
  c.mode = mode;
  c.log_level = "warn";
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

}  // namespace

int run(int argc, char** argv);

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "autotune_grid: %s\n", e.what());
    return 1;
  }
}

int run(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const std::string v = argv[i + 1];
    if (f == "--data") a.data_dir = v;
    else if (f == "--out") a.out = v;
    else if (f == "--machine") a.machine = v;
    else if (f == "--commit") a.commit = v;
    else if (f == "--rounds") a.rounds = std::stoi(v);
    else if (f == "--steps") a.steps = std::stoi(v);
    else if (f == "--skip") a.skip = std::stoi(v);
    else if (f == "--after-decision") a.after_decision = std::stoi(v);
    else if (f == "--max-workers") a.max_workers = std::stoi(v);
    else {
      std::fprintf(stderr, "autotune_grid: unknown option %s\n", f.c_str());
      return 2;
    }
  }
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
  if (torchpilot::detail::pin_memory_available()) transfer = {{false, false}, {true, false}, {true, true}};
  std::vector<LoaderSettings> grid;
  for (int w : worker_counts) {
    for (int p : {1, 2, 4, 8}) {
      if (w == 0 && p != 2) continue;
      for (auto [pin, dev] : transfer) grid.push_back(LoaderSettings{w, p, pin, dev});
    }
  }
  std::printf("autotune_grid: %s, %d CPUs, device %s, %zu grid points, %d rounds\n",
              a.machine.c_str(), cpus, trainer.device().c_str(), grid.size(), a.rounds);
  std::fflush(stdout);

  std::vector<std::vector<double>> grid_tp(grid.size());
  std::vector<double> auto_tp, auto_steps;
  json auto_runs = json::array();
  std::mt19937 rng(12345);
  const auto started = std::chrono::steady_clock::now();
  for (int round = 0; round < a.rounds; ++round) {
    // Index grid.size() is the auto-tuned run; the order is shuffled every round.
    std::vector<size_t> order(grid.size() + 1);
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t item : order) {
      if (item < grid.size()) {
        torchpilot::Pilot pilot(quiet(torchpilot::Mode::kAdvise));
        trainer.run(pilot, a.steps, grid[item]);
        grid_tp[item].push_back(throughput(pilot.recent_steps(), static_cast<size_t>(a.skip)));
        continue;
      }
      torchpilot::Config config = quiet(torchpilot::Mode::kAutotune);
      config.autotune.max_workers = max_workers;
      torchpilot::Pilot pilot(config);
      LoaderSettings start;  // LibTorch's default: workers 0
      trainer.run(pilot, config.autotune.warmup_steps + a.after_decision, start);
      const auto& d = pilot.tuning_decision();
      if (!d) {
        std::fprintf(stderr, "autotune_grid: auto-tune did not decide within its budget\n");
        return 1;
      }
      // Measure from a few steps after the decision (the new setting's pipeline fills first).
      const auto steps = pilot.recent_steps();
      const size_t from = static_cast<size_t>(d->decided_at_step + 1 + config.autotune.settle_steps);
      const double tp = throughput(steps, std::min(from, steps.size()));
      auto_tp.push_back(tp);
      auto_steps.push_back(static_cast<double>(d->steps_used));
      json chosen = json::object();
      for (const auto& [k, v] : d->chosen) chosen[k] = v;
      auto_runs.push_back({{"round", round}, {"chosen", chosen}, {"steps_used", d->steps_used},
                           {"trials", d->trials.size()}, {"measured_samples_per_s", tp},
                           {"trial_samples_per_s", d->chosen_throughput}});
      std::printf("  round %d auto-tune: chose [%s] in %lld steps, %.0f samples/s after\n", round,
                  torchpilot::to_string(d->chosen).c_str(), static_cast<long long>(d->steps_used), tp);
      std::fflush(stdout);
    }
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  size_t best = 0, def = 0;
  json points = json::array();
  for (size_t i = 0; i < grid.size(); ++i) {
    const double m = median(grid_tp[i]);
    if (m > median(grid_tp[best])) best = i;
    if (grid[i].workers == 0 && grid[i].prefetch == 2 && !grid[i].pin_memory) def = i;
    points.push_back({{"setting", label(grid[i])}, {"median_samples_per_s", m}, {"runs", grid_tp[i]}});
  }
  const double best_tp = median(grid_tp[best]);
  const double def_tp = median(grid_tp[def]);
  const double tuned_tp = median(auto_tp);
  std::printf("\n| figure | value |\n|---|---|\n");
  std::printf("| best grid point | %s: %.0f samples/s |\n", label(grid[best]).c_str(), best_tp);
  std::printf("| auto-tuned (median of %d runs) | %.0f samples/s = %.1f%% of best |\n", a.rounds,
              tuned_tp, 100 * tuned_tp / best_tp);
  std::printf("| warm-up steps used (median) | %.0f |\n", median(auto_steps));
  std::printf("| LibTorch default (workers 0) | %.0f samples/s; auto-tuned is x%.2f |\n", def_tp,
              tuned_tp / def_tp);
  std::printf("| bench wall time | %.0f s |\n", elapsed);

  if (!a.out.empty()) {
    char date[32];
    std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    json j = {{"bench", "autotune_grid"},
              {"machine", a.machine},
              {"cpu", cpu_model()},
              {"cpus_in_affinity", cpus},
              {"device", trainer.device()},
              {"date", date},
              {"commit", a.commit},
              {"method", "each round runs every grid point and one auto-tuned run in shuffled order; "
                         "medians over rounds; throughput = samples / wall time of measured steps"},
              {"rounds", a.rounds},
              {"steps_per_grid_run", a.steps},
              {"skipped_steps_per_run", a.skip},
              {"batch_size", options.batch_size},
              {"best_grid", {{"setting", label(grid[best])}, {"samples_per_s", best_tp}}},
              {"default_workers0_samples_per_s", def_tp},
              {"autotuned_samples_per_s", tuned_tp},
              {"autotuned_fraction_of_best", tuned_tp / best_tp},
              {"speedup_over_default", tuned_tp / def_tp},
              {"warmup_steps_used_median", median(auto_steps)},
              {"autotune_runs", auto_runs},
              {"grid", points},
              {"wall_s", elapsed}};
    std::ofstream(a.out) << j.dump(2) << "\n";
    std::printf("autotune_grid: results in %s\n", a.out.c_str());
  }
  return 0;
}
