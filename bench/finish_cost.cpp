// finish_cost: what finishing a detailed window's steps costs the training thread, by window
// length, on synthetic records (no GPU needed). A fake GPU backend hands the GPU monitor a
// window of `--steps` steps of `--kernels` kernels each (LibTorch-like names of ~200
// characters, GPU-timed by step markers); once the window is released, the steps after it finish
// the window's steps within the monitor's per-call budget. Reported: the training thread's time
// in the pilot's step calls from the release until every window step has finished, per window
// step (should not grow with the window's length), and the slowest single call.
//   finish_cost [--steps 10,30,100] [--kernels 3000] [--repeats 3] [--machine M --commit C
//               --out FILE]
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "harness.h"
#include "synthetic_backend.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"

namespace {

using namespace torchpilot;
using nlohmann::json;
constexpr Nanos kMs = 1000000;

// Hands out what the bench queued; markers resolve when the bench says the GPU ran a step.
class SyntheticBackend final : public bench::SyntheticGpuBackend {
 public:
  GpuEventBatch queued;
  std::vector<uint64_t> marker_ids;
  std::vector<CollectorStatus> status() const override {
    return {{"pm_sampling", false, "synthetic"},
            {"activity", true, ""},
            {"nvml", false, "synthetic"},
            {"nvtx", false, "synthetic"}};
  }
  bool start_trace() override { return true; }
  bool record_marker(uint64_t id) override {
    marker_ids.push_back(id);
    return true;
  }
  void drain(GpuEventBatch& out) override {
    out.kernels.insert(out.kernels.end(), std::make_move_iterator(queued.kernels.begin()),
                       std::make_move_iterator(queued.kernels.end()));
    out.markers.insert(out.markers.end(), queued.markers.begin(), queued.markers.end());
    queued.kernels.clear();
    queued.markers.clear();
  }
};

// Synthetic time (advanced by a step's length after each step call) plus the real time elapsed:
// the monitor's per-call finishing budget runs on real time, as in a training program.
class BenchClock final : public Clock {
 public:
  Nanos now_ns() const override {
    const auto real = std::chrono::steady_clock::now() - start_;
    return manual_ + std::chrono::duration_cast<std::chrono::nanoseconds>(real).count();
  }
  void advance(Nanos d) { manual_ += d; }

 private:
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  Nanos manual_ = 0;
};

struct Result {
  double per_window_step_ms = 0;
  double slowest_call_ms = 0;
  int calls = 0;
};

Result run_once(int window_steps, int kernels_per_step) {
  auto clock = std::make_shared<BenchClock>();
  auto backend = std::make_shared<SyntheticBackend>();
  auto logger = std::make_shared<spdlog::logger>("finish_cost",
                                                 std::make_shared<spdlog::sinks::null_sink_st>());
  Config c;
  c.gpu.trace_first_step = 1;
  c.gpu.trace_steps = window_steps;
  c.gpu.trace_anomaly_factor = 0;
  c.cost.budget = 1;  // the window opens when due
  // Counts the window's steps as they finish (GPU step records come late, once finished).
  auto sink = std::make_shared<RecordingSink>();
  PilotOptions o;
  o.sinks = {sink};
  o.logger = logger;
  o.clock = clock;
  if (auto m = make_gpu_monitor(c.gpu, backend, *logger)) o.collectors.push_back(std::move(m));
  Pilot pilot(std::move(c), std::move(o));

  // Kernel names as LibTorch's are: long templated names, a few dozen distinct ones.
  std::vector<std::string> names;
  for (int i = 0; i < 40; ++i) {
    names.push_back(
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<"
        "at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
        "at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, "
        "variant " +
        std::to_string(i) + ")");
  }
  const Nanos step_ns = 10 * kMs;
  // The GPU runs step k from when the host began it (or the GPU finished the one before): its
  // kernels and the markers of its boundaries.
  Nanos gpu_free = 0;
  auto gpu_runs = [&](int64_t k, Nanos host_begin) {
    const Nanos b = std::max(gpu_free, host_begin);
    const Nanos each = step_ns / (kernels_per_step + 1);
    // Kernel records come from the activity trace: inside the window only.
    const bool traced = k >= 1 && k <= window_steps;
    for (int i = 0; traced && i < kernels_per_step; ++i) {
      KernelRecord r;
      r.begin = b + i * each;
      r.end = r.begin + each * 3 / 4;
      r.blocks = 264;
      r.name = names[static_cast<size_t>(i) % names.size()];
      backend->queued.kernels.push_back(std::move(r));
    }
    if (k == 0) backend->queued.markers.push_back({backend->marker_ids.at(0), b});
    backend->queued.markers.push_back(
        {backend->marker_ids.at(static_cast<size_t>(k + 1)), b + step_ns});
    gpu_free = b + step_ns;
  };
  // The GPU runs each step as the host ends it; the window is steps 1 .. window_steps.
  auto traced_finished = [&] {
    int n = 0;
    for (const auto& l : sink->late_steps) {
      if (const auto* g = l.get<GpuStepRecord>()) n += g->traced ? 1 : 0;
    }
    return n;
  };
  Result r;
  std::vector<double> after_release;
  bool released = false;
  int traced_done = 0;
  for (int64_t step = 0; step < window_steps + 100000; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const Nanos host_begin = clock->now_ns();
    auto s = pilot.step(1);
    clock->advance(step_ns);
    s.end();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    gpu_runs(step, host_begin);
    if (released) after_release.push_back(ms);
    released = released || step > window_steps;
    traced_done += traced_finished();
    sink->late_steps.clear();  // counted as they come: kept small
    if (traced_done >= window_steps) break;
  }
  double sum = 0;
  for (double ms : after_release) {
    sum += ms;
    r.slowest_call_ms = std::max(r.slowest_call_ms, ms);
  }
  r.calls = static_cast<int>(after_release.size());
  r.per_window_step_ms = sum / window_steps;
  return r;
}

int run(int argc, char** argv) {
  CLI::App app("finish_cost: the training thread's time finishing a detailed window's steps",
               "finish_cost");
  example_cli::last_wins(app);
  std::vector<int> steps = {10, 30, 100};
  int kernels = 3000, repeats = 3;
  bench::RunFlags run_flags;  // --machine, --commit, --out
  app.add_option("--steps", steps, "window lengths (steps)")->delimiter(',');
  bench::int_flag(app, "--kernels", kernels, 1, 100000, "kernels per step");
  bench::int_flag(app, "--repeats", repeats, 1, 100,
                  "rounds (every window length once per round; medians over rounds)");
  bench::add_run_flags(app, run_flags, "write the results here (JSON)");
  example_cli::parse_or_exit(app, argc, argv);

  // Interleaved rounds: each window length once per round, the order rotated.
  const size_t lengths = steps.size();
  std::vector<std::vector<double>> per_step(lengths), slowest(lengths);
  json runs = json::array();
  bench::interleave(
      repeats, static_cast<int>(lengths), bench::Order::kRotate, [&](int round, int, int k) {
        const size_t i = static_cast<size_t>(k);
        const Result r = run_once(steps[i], kernels);
        per_step[i].push_back(r.per_window_step_ms);
        slowest[i].push_back(r.slowest_call_ms);
        if (runs.size() <= static_cast<size_t>(round)) runs.push_back(json::object());
        runs[static_cast<size_t>(round)][std::to_string(steps[i])] = r.per_window_step_ms;
      });
  std::printf(
      "| window steps | kernels/step | finishing per window step (ms) | slowest call (ms) |\n");
  std::printf("|---|---|---|---|\n");
  json per_step_ms = json::object(), slowest_ms = json::object();
  for (size_t i = 0; i < lengths; ++i) {
    const double m = bench::median(per_step[i]), worst = bench::median(slowest[i]);
    std::printf("| %d | %d | %.3f | %.2f |\n", steps[i], kernels, m, worst);
    per_step_ms[std::to_string(steps[i])] = m;
    slowest_ms[std::to_string(steps[i])] = worst;
  }
  if (!run_flags.out.empty()) {
    json j = bench::run_header("finish_cost", run_flags);
    j.update({{"kernels_per_step", kernels},
              {"repeats", repeats},
              {"unit",
               "ms of the training thread per window step, from the window's release until all "
               "its steps finished (median over rounds)"},
              {"per_window_step_ms", per_step_ms},
              {"slowest_call_ms", slowest_ms},
              {"runs", runs}});
    bench::write_results("finish_cost", run_flags, j);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("finish_cost", argc, argv, run); }
