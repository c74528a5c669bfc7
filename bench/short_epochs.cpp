// short_epochs: what torchpilot's default configuration costs a trainer whose epochs last a
// fraction of a second (issue 15): a small CNN, batch 512, a stock LibTorch loader with 4
// workers, integrated as the README says (a Pilot from the default config, a FlopCounter,
// torchpilot::watch(loader, pilot), one pilot.step() per batch).
//
// Configurations: off (no Pilot, no FlopCounter, the loader iterated directly) and default.
// Rounds alternate their order (off, default; default, off; ...); in a round each configuration
// runs --epochs epochs with one Pilot (a run's start-up, its first trace window and every epoch
// end included), the device synchronized at each epoch's end. Its figure is the median epoch time
// over the round's epochs after the first (the first pays cuDNN's and the allocator's warm-up).
// Reported: default_over_off = median over rounds of the per-round ratio default / off, its
// spread, and the default runs' own "cost" sections (torchpilot's share of each epoch). Written to
// --out (bench/runs/short-epochs-<machine>.json).
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness.h"
#include "torchpilot/runtime/stalls/step_outliers.h"
#include "torchpilot/torchpilot.h"

namespace {

using bench::median;

using bench::Clock;
using nlohmann::json;

// Synthetic 3x32x32 images in memory: the loader's work is indexing and stacking.
class Images : public torch::data::datasets::Dataset<Images> {
 public:
  Images(int64_t n, uint64_t seed) {
    torch::manual_seed(seed);
    data_ = torch::randn({n, 3, 32, 32});
    targets_ = torch::randint(0, 10, {n}, torch::kLong);
  }
  torch::data::Example<> get(size_t i) override {
    const auto k = static_cast<int64_t>(i);
    return {data_[k], targets_[k]};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(data_.size(0)); }

 private:
  torch::Tensor data_, targets_;
};

struct NetImpl : torch::nn::Module {
  NetImpl()
      : c1(register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 3).padding(1)))),
        c2(register_module("c2",
                           torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)))),
        fc(register_module("fc", torch::nn::Linear(64 * 8 * 8, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(c1(x)), 2);
    x = torch::max_pool2d(torch::relu(c2(x)), 2);
    return fc(x.flatten(1));
  }
  torch::nn::Conv2d c1, c2;
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

struct Args {
  int rounds = 5;
  int epochs = 30;  // per round and configuration
  int batch = 512;
  int workers = 4;
  // --intra-op-threads: torch::set_num_threads before the rounds (0: LibTorch's default, as a new
  // user has it). The training thread's and the workers' intra-op teams share the cores; fewer
  // threads may make runs of one round differ less (10-30% between runs on an H200 VM).
  int intra_op_threads = 0;
  int steps = 20;    // batches per epoch
  int launches = 0;  // extra tiny kernels a step (a launch-heavy trainer)
  // --variant TORCHPILOT_KEY=VALUE: a further configuration, the default with that override
  // (which part of default_over_off is whose, in the same interleaved rounds).
  std::vector<std::string> variants;
  std::string device;
  bench::RunFlags run;  // --machine, --commit, --out
};

struct Run {
  std::vector<double> epoch_s;
  std::vector<double> cost_fraction;  // the default's "cost" sections
  std::vector<double> horizon_fraction;
  int64_t deferred = 0;
  // Where torchpilot's time went, per epoch (after the first): each step part ("gpu", "flops",
  // "pilot") and each epoch-end part ("epoch end: gpu", ...), in microseconds.
  std::map<std::string, std::vector<double>> parts_us;
  // The same per step (each epoch's part over its steps).
  std::map<std::string, std::vector<double>> per_step_us;
  // The first epoch with traced steps (a trace window's figures): seconds from the Pilot's start
  // to that epoch's end (-1: none), and its advice ids.
  double first_window_s = -1;
  int64_t first_window_epoch = -1;
  int64_t first_window_steps = 0;  // its traced steps
  std::vector<std::string> window_advice;
  // Each window the budget let open: its predicted cost and its measured cost (ms), and the
  // horizon's share at the run's end (the whole run within the budget?).
  std::vector<double> window_estimate_ms, window_cost_ms;
  // Each epoch's stall period (outliers section; 0: none): a period brings the sync probe and
  // step markers to the steps at it, which shows in the per-step parts.
  std::vector<int64_t> stall_periods;
  // The GPU monitor's steps, and those it finished a joined run at a time (none reads them one
  // by one here): whether that path ran.
  int64_t gpu_steps = 0, steps_joined = 0;
};

// Keeps each epoch's end time and advice ids. Reads no late records, as the advisory log (a new
// user's only sink): a sink that wanted them would have the GPU monitor build one a step (0.6 us
// of a 2.2 ms step on an H200, measured in a diagnostic build).
class AdviceSink final : public torchpilot::Sink {
 public:
  std::string name() const override { return "bench-advice"; }
  bool wants_late_steps() const override { return false; }
  void on_epoch(const torchpilot::EpochSummary& s,
                const std::vector<torchpilot::Advice>& advice) override {
    std::vector<std::string> ids;
    for (const auto& a : advice) ids.push_back(a.id);
    epochs.push_back({s.epoch, bench::seconds_since(start), std::move(ids)});
  }
  struct Epoch {
    int64_t epoch;
    double at_s;
    std::vector<std::string> advice;
  };
  Clock::time_point start = Clock::now();
  std::vector<Epoch> epochs;
};

// `overrides`: TORCHPILOT_* pairs applied over the default config (a --variant).
Run run(const Args& a, bool with_pilot, torch::Device device,
        const torchpilot::Environment& overrides = {}) {
  torch::manual_seed(1);
  Net net;
  net->to(device);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto loader = torch::data::make_data_loader(
      Images(static_cast<int64_t>(a.batch) * a.steps, 7).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions()
          .batch_size(static_cast<size_t>(a.batch))
          .workers(static_cast<size_t>(a.workers)));
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  // A launch-heavy step's extra work: tiny in-place kernels, each a launch of its own.
  torch::Tensor tiny = torch::zeros({1}, torch::TensorOptions().device(device));
  auto train = [&](torch::data::Example<>& b) {
    auto x = b.data.to(device, true);
    auto y = b.target.to(device, true);
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
    loss.backward();
    opt.step();
    torch::NoGradGuard no_grad;
    for (int i = 0; i < a.launches; ++i) tiny.add_(1);
  };
  Run r;
  if (!with_pilot) {
    for (int e = 0; e < a.epochs; ++e) {
      const auto t0 = Clock::now();
      for (auto& b : *loader) train(b);
      sync();
      r.epoch_s.push_back(bench::seconds_since(t0));
    }
    return r;
  }
  // The defaults, as a new user has them; TORCHPILOT_* variables isolate one part's cost
  // (e.g. TORCHPILOT_GPU_NVTX=false).
  torchpilot::Config config = torchpilot::Config::load();
  if (!overrides.empty()) torchpilot::apply_env_overrides(config, overrides);
  config.log.level = "warn";
  auto advice = std::make_shared<AdviceSink>();
  torchpilot::PilotOptions options;
  options.sinks.push_back(advice);
  torchpilot::Pilot pilot(config, std::move(options));
  torchpilot::FlopCounter flops(pilot);
  for (int e = 0; e < a.epochs; ++e) {
    const auto t0 = Clock::now();
    for (auto& b : torchpilot::watch(*loader, pilot)) {
      auto step = pilot.step(b.data.size(0));
      train(b);
    }  // the watched loader's end ends the Pilot's epoch
    sync();
    r.epoch_s.push_back(bench::seconds_since(t0));
  }
  for (const auto& s : pilot.epoch_summaries()) {
    const auto* g = s.sections.get<torchpilot::GpuEpochStats>();
    if (g != nullptr) {
      r.gpu_steps += g->steps;
      r.steps_joined += g->steps_joined;
    }
    if (g != nullptr && g->windows_predicted > 0) {
      r.window_estimate_ms.push_back(static_cast<double>(g->window_estimate_ns) / 1e6);
      r.window_cost_ms.push_back(static_cast<double>(g->window_cost_ns) / 1e6);
    }
    if (g != nullptr && g->traced_steps > 0 && r.first_window_epoch < 0) {
      r.first_window_epoch = s.epoch;
      r.first_window_steps = g->traced_steps;
      for (const auto& e : advice->epochs) {
        if (e.epoch != s.epoch) continue;
        r.first_window_s = e.at_s;
        r.window_advice = e.advice;
      }
    }
    if (const auto* o = s.sections.get<torchpilot::OutlierStats>()) {
      r.stall_periods.push_back(o->period);
    }
    if (const auto* c = s.sections.get<torchpilot::CostStats>()) {
      r.cost_fraction.push_back(c->fraction);
      r.horizon_fraction.push_back(c->horizon_fraction);
      r.deferred += c->deferred;
      if (s.epoch == 0) continue;  // start-up
      const double steps = static_cast<double>(std::max<int64_t>(1, s.steps));
      for (const auto& [who, ns] : c->step_parts) {
        r.parts_us["step: " + who].push_back(ns / 1e3);
        r.per_step_us[who].push_back(ns / 1e3 / steps);
      }
      r.per_step_us["all step calls"].push_back(c->step_calls_ns / 1e3 / steps);
      r.per_step_us["epoch end"].push_back(c->epoch_end_ns / 1e3 / steps);
      // The gpu part's collections (drain and finishing, every 100 ms), the rest its boundaries.
      if (const auto* g = s.sections.get<torchpilot::GpuEpochStats>()) {
        r.per_step_us["gpu: collections"].push_back(static_cast<double>(g->collect_ns) / 1e3 /
                                                    steps);
        r.per_step_us["gpu: drain"].push_back(static_cast<double>(g->collect_drain_ns) / 1e3 /
                                              steps);
      }
      for (const auto& [who, ns] : c->epoch_end_parts) {
        r.parts_us["epoch end: " + who].push_back(ns / 1e3);
      }
      r.parts_us["window"].push_back(c->window_ns / 1e3);
    }
  }
  return r;
}

int run(int argc, char** argv) {
  Args a;
  CLI::App app(
      "short_epochs: torchpilot's default configuration against no torchpilot on a trainer with "
      "epochs of a fraction of a second (small CNN, stock loader with workers), interleaved "
      "rounds (bench/README.md).",
      "short_epochs");
  example_cli::last_wins(app);
  bench::int_flag(app, "--rounds", a.rounds, 1, 1000, "rounds");
  bench::int_flag(app, "--epochs", a.epochs, 2, 100000, "epochs per round and configuration");
  bench::int_flag(app, "--batch", a.batch, 1, 1 << 20, "batch size");
  bench::int_flag(app, "--workers", a.workers, 0, 1024, "loader workers");
  bench::int_flag(app, "--intra-op-threads", a.intra_op_threads, 0, 1024,
                  "torch::set_num_threads before the rounds; 0: LibTorch's default");
  bench::int_flag(app, "--steps", a.steps, 1, 1 << 20, "batches per epoch");
  bench::int_flag(app, "--launches", a.launches, 0, 1 << 20,
                  "extra tiny kernels a step (a launch-heavy trainer); default 0");
  app.add_option("--variant", a.variants,
                 "TORCHPILOT_KEY=VALUE: a further configuration in every round, the default with "
                 "that override (repeatable)");
  app.add_option("--device", a.device, "cpu, cuda or cuda:N; default cuda when available");
  bench::add_run_flags(app, a.run, "JSON results file", false);
  example_cli::parse_or_exit(app, argc, argv);
  std::vector<torchpilot::Environment> variant_env;
  for (const auto& v : a.variants) {
    const auto eq = v.find('=');
    if (eq == std::string::npos || v.rfind("TORCHPILOT_", 0) != 0) {
      std::fprintf(stderr, "short_epochs: --variant wants TORCHPILOT_KEY=VALUE, got '%s'\n",
                   v.c_str());
      return 2;
    }
    variant_env.push_back({{v.substr(0, eq), v.substr(eq + 1)}});
    torchpilot::Config check;
    torchpilot::apply_env_overrides(check, variant_env.back());  // a bad key fails here, not later
  }
  if (a.intra_op_threads > 0) torch::set_num_threads(a.intra_op_threads);
  const torch::Device device(a.device.empty() ? (torch::cuda::is_available() ? "cuda" : "cpu")
                                              : a.device);
  json rounds = json::array();
  std::vector<double> ratios, mean_ratios, off_all, def_all, cost_all, horizon_all;
  std::map<std::string, std::vector<double>> parts_all, per_step_all;
  std::vector<double> first_window_s, estimate_over_cost;
  json windows = json::array();
  int64_t deferred = 0;
  const int configs = 2 + static_cast<int>(variant_env.size());
  std::vector<std::vector<double>> variant_ratios(variant_env.size());
  json variant_rounds = json::array();
  for (int k = 0; k < a.rounds; ++k) {
    // 0: off, 1: default, 2...: the variants; off first in even rounds (reversed in odd ones).
    std::vector<Run> runs(static_cast<size_t>(configs));
    const std::vector<int> order_ids = bench::round_order(k, configs, bench::Order::kReverse);
    for (int c : order_ids) {
      runs[static_cast<size_t>(c)] =
          run(a, c >= 1, device,
              c >= 2 ? variant_env[static_cast<size_t>(c - 2)] : torchpilot::Environment{});
    }
    const Run& off = runs[0];
    const Run& def = runs[1];
    auto steady = [](const std::vector<double>& v) {
      return median(std::vector<double>(v.begin() + 1, v.end()));
    };
    const double o = steady(off.epoch_s), d = steady(def.epoch_s);
    json vround = json::object();
    for (size_t v = 0; v < variant_env.size(); ++v) {
      const Run& r = runs[v + 2];
      const double m = steady(r.epoch_s);
      variant_ratios[v].push_back(m / o);
      vround[a.variants[v]] = {{"epoch_s", r.epoch_s},
                               {"median_s", m},
                               {"over_off", m / o},
                               {"cost_fraction", r.cost_fraction}};
      std::printf("round %d: %s %.4f s per epoch (median), over off %.4f\n", k,
                  a.variants[v].c_str(), m, m / o);
    }
    if (!variant_env.empty()) variant_rounds.push_back(vround);
    ratios.push_back(d / o);
    off_all.push_back(o);
    def_all.push_back(d);
    cost_all.insert(cost_all.end(), def.cost_fraction.begin(), def.cost_fraction.end());
    if (!def.horizon_fraction.empty()) horizon_all.push_back(def.horizon_fraction.back());
    deferred += def.deferred;
    for (const auto& [part, v] : def.parts_us) {
      parts_all[part].insert(parts_all[part].end(), v.begin(), v.end());
    }
    for (const auto& [part, v] : def.per_step_us) {
      per_step_all[part].insert(per_step_all[part].end(), v.begin(), v.end());
    }
    first_window_s.push_back(def.first_window_s);
    windows.push_back({{"first_window_s", def.first_window_s},
                       {"first_window_epoch", def.first_window_epoch},
                       {"first_window_steps", def.first_window_steps},
                       {"advice", def.window_advice},
                       {"estimate_ms", def.window_estimate_ms},
                       {"cost_ms", def.window_cost_ms},
                       {"horizon_fraction_at_end",
                        def.horizon_fraction.empty() ? -1.0 : def.horizon_fraction.back()}});
    for (size_t w = 0; w < def.window_cost_ms.size(); ++w) {
      const double est = def.window_estimate_ms[w], cost = def.window_cost_ms[w];
      std::printf("round %d: window %zu predicted %.1f ms, cost %.1f ms (estimate/cost %.2f)\n", k,
                  w, est, cost, cost > 0 ? est / cost : 0.0);
      if (cost > 0) estimate_over_cost.push_back(est / cost);
    }
    std::printf("round %d: first trace window's epoch %lld ended at %.2f s; its advice:", k,
                static_cast<long long>(def.first_window_epoch), def.first_window_s);
    for (const auto& id : def.window_advice) std::printf(" %s", id.c_str());
    std::printf("\n");
    // The mean over all epochs too: a first window or start-up cost shows there, not in medians.
    auto mean = [](const std::vector<double>& v) {
      double s = 0;
      for (double x : v) s += x;
      return v.empty() ? 0 : s / static_cast<double>(v.size());
    };
    mean_ratios.push_back(mean(def.epoch_s) / mean(off.epoch_s));
    std::string order;
    for (int c : order_ids) {
      if (!order.empty()) order += ",";
      order += c == 0 ? "off" : c == 1 ? "default" : a.variants[static_cast<size_t>(c - 2)];
    }
    rounds.push_back({{"order", order},
                      {"off_epoch_s", off.epoch_s},
                      {"default_epoch_s", def.epoch_s},
                      {"off_median_s", o},
                      {"default_median_s", d},
                      {"ratio", d / o},
                      {"mean_ratio", mean(def.epoch_s) / mean(off.epoch_s)},
                      {"cost_fraction", def.cost_fraction},
                      {"stall_periods", def.stall_periods},
                      {"gpu_steps", def.gpu_steps},
                      {"steps_joined", def.steps_joined},
                      {"deferred", def.deferred}});
    std::printf(
        "round %d: off %.4f s, default %.4f s per epoch (median), default/off %.4f, "
        "mean %.4f; torchpilot's own share (median over epochs) %.3f%%\n",
        k, o, d, d / o, mean(def.epoch_s) / mean(off.epoch_s), 100 * median(def.cost_fraction));
  }
  const bench::Spread ratio = bench::spread(ratios);
  json parts = json::object();
  json parts_max = json::object();  // a window's epoch shows here
  for (const auto& [part, v] : parts_all) {
    parts[part] = median(v);
    parts_max[part] = *std::max_element(v.begin(), v.end());
  }
  std::printf("torchpilot per epoch (median us):");
  for (const auto& [part, v] : parts_all) std::printf(" %s %.1f;", part.c_str(), median(v));
  json per_step = json::object();
  std::printf("\ntorchpilot per step (median us):");
  for (const auto& [part, v] : per_step_all) {
    per_step[part] = median(v);
    std::printf(" %s %.2f;", part.c_str(), median(v));
  }
  std::printf("\ntorchpilot per epoch (max us):");
  for (const auto& [part, v] : parts_all) {
    std::printf(" %s %.1f;", part.c_str(), *std::max_element(v.begin(), v.end()));
  }
  std::printf("\n");
  std::printf("default_over_off %.4f (min %.4f, max %.4f) over %d rounds; budget 1.01\n",
              ratio.median, ratio.min, ratio.max, a.rounds);
  json variants = json::object();
  for (size_t v = 0; v < variant_env.size(); ++v) {
    const bench::Spread r = bench::spread(variant_ratios[v]);
    variants[a.variants[v]] = {{"over_off", r.median}, {"min", r.min}, {"max", r.max}};
    std::printf("%s: over off %.4f (min %.4f, max %.4f)\n", a.variants[v].c_str(), r.median, r.min,
                r.max);
  }
  json out = bench::run_header("short_epochs", a.run, bench::Stamp::kUnixTime);
  out.update({{"torch", TORCH_VERSION},
              {"device", device.str()},
              {"batch", a.batch},
              {"workers", a.workers},
              {"intra_op_threads", torch::get_num_threads()},
              {"steps_per_epoch", a.steps},
              {"launches", a.launches},
              {"window_estimate_over_cost", estimate_over_cost},
              {"epochs_per_round", a.epochs},
              {"default_over_off", ratio.median},
              {"ratio_min", ratio.min},
              {"ratio_max", ratio.max},
              {"mean_ratio_median", median(mean_ratios)},
              {"cost_parts_median_us", parts},
              {"cost_parts_max_us", parts_max},
              {"cost_per_step_median_us", per_step},
              {"first_window_s", first_window_s},
              {"windows", windows},
              {"off_epoch_median_s", median(off_all)},
              {"default_epoch_median_s", median(def_all)},
              {"cost_fraction_median", median(cost_all)},
              {"horizon_fraction_at_end_median", median(horizon_all)},
              {"deferred_windows", deferred},
              {"budget", 0.01},
              {"rounds", rounds}});
  if (!variant_env.empty()) {
    out["variants"] = variants;
    out["variant_rounds"] = variant_rounds;
  }
  if (!a.run.out.empty()) {
    bench::write_json(a.run.out, out, 1);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("short_epochs", argc, argv, run); }
