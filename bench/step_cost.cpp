// step_cost: the always-on path's cost to the training thread per step, by part, on the CPU (no
// GPU, no LibTorch): a Pilot with its default collectors plus a GPU monitor over a synthetic
// backend (step markers that resolve --lag-us after they are recorded, a PM sample every
// millisecond, an NVML reading every 100 ms), steps of --step-us of busy work, no trace windows.
// What the vendor calls cost (cuEventRecord, NVTX) is not here: bench/short_epochs measures the
// whole path on the GPU machine. This is the bookkeeping's share, quick to profile (perf record).
// Reported: per part, the median over epochs (after the first) of its step-call time per step.
//   step_cost [--step-us 1000] [--steps 500] [--epochs 12] [--machine M --commit C --out FILE]
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness.h"
#include "synthetic_backend.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/cost/cost.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"

namespace {

using namespace torchpilot;
using nlohmann::json;

Nanos steady_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Markers resolve `lag` after they were recorded; PM samples cover each millisecond once it is
// over; an NVML reading every 100 ms.
class SyntheticBackend final : public bench::SyntheticGpuBackend {
 public:
  explicit SyntheticBackend(Nanos lag) : lag_(lag) {}
  std::vector<CollectorStatus> status() const override {
    return {{"pm_sampling", true, ""},
            {"activity", false, "synthetic: no windows"},
            {"nvml", true, ""},
            {"nvtx", true, ""}};
  }
  void start() override { pm_until_ = nvml_at_ = steady_now(); }
  bool record_marker(uint64_t id) override {
    markers_.push_back({id, steady_now() + lag_});
    return true;
  }
  void drain(GpuEventBatch& out) override {
    const Nanos now = steady_now();
    while (!markers_.empty() && markers_.front().time <= now) {
      out.markers.push_back(markers_.front());
      markers_.pop_front();
    }
    for (; pm_until_ + kPmNs <= now; pm_until_ += kPmNs) {
      PmSample s;
      s.begin = pm_until_;
      s.end = pm_until_ + kPmNs;
      s.counter_utilization = 0.9;
      s.sm_efficiency = 0.6;
      s.tensor_activity = 0.2;
      s.dram_throughput = 0.3;
      s.achieved_occupancy = 0.4;
      out.pm.push_back(s);
    }
    for (; nvml_at_ + kNvmlNs <= now; nvml_at_ += kNvmlNs) {
      UtilSample u;
      u.time = nvml_at_ + kNvmlNs;
      u.utilization = 0.95;
      out.nvml.push_back(u);
    }
  }

 private:
  static constexpr Nanos kPmNs = 1000000, kNvmlNs = 100000000;
  Nanos lag_;
  std::deque<MarkerRecord> markers_;
  Nanos pm_until_ = 0, nvml_at_ = 0;
};

void spin_until(Nanos t) {
  while (steady_now() < t) {
  }
}

int run(int argc, char** argv) {
  CLI::App app("step_cost: the always-on path's bookkeeping per step, by part (CPU, synthetic GPU)",
               "step_cost");
  example_cli::last_wins(app);
  int step_us = 1000, steps = 500, epochs = 12, lag_us = 500, pollute_mb = 16;
  double marker_interval_ms = Config().gpu.marker_interval_ms;
  bench::RunFlags run_flags;
  bench::int_flag(app, "--step-us", step_us, 1, 10000000, "busy work per step (us)");
  bench::int_flag(app, "--steps", steps, 1, 1 << 24, "steps per epoch");
  bench::int_flag(app, "--epochs", epochs, 2, 100000, "epochs");
  bench::int_flag(app, "--lag-us", lag_us, 0, 10000000, "a marker resolves this long after");
  bench::int_flag(app, "--pollute-mb", pollute_mb, 0, 4096,
                  "memory each step's work walks (a trainer's working set leaves torchpilot's "
                  "code and data cold)");
  bench::number_flag(app, "--marker-interval-ms", marker_interval_ms, -1, 60000,
                     "gpu.marker_interval_ms");
  bench::add_run_flags(app, run_flags, "write the results here (JSON)");
  example_cli::parse_or_exit(app, argc, argv);

  auto logger = std::make_shared<spdlog::logger>("step_cost",
                                                 std::make_shared<spdlog::sinks::null_sink_st>());
  Config c;
  c.gpu.activity = false;  // always-on only
  c.gpu.marker_interval_ms = marker_interval_ms;
  PilotOptions o;
  o.logger = logger;
  auto backend = std::make_shared<SyntheticBackend>(lag_us * Nanos{1000});
  if (auto m = make_gpu_monitor(c.gpu, backend, *logger)) o.collectors.push_back(std::move(m));
  std::map<std::string, std::vector<double>> per_step_ns;
  std::vector<unsigned char> working_set(static_cast<size_t>(pollute_mb) << 20);
  unsigned sum = 0;
  {
    Pilot pilot(c, std::move(o));
    for (int e = 0; e < epochs; ++e) {
      for (int s = 0; s < steps; ++s) {
        auto step = pilot.step(1);
        for (size_t i = 0; i < working_set.size(); i += 64) sum += ++working_set[i];
        spin_until(steady_now() + step_us * Nanos{1000});
      }
      pilot.end_epoch();
    }
    for (const EpochSummary& s : pilot.epoch_summaries()) {
      const auto* cost = s.sections.get<CostStats>();
      if (cost == nullptr || s.epoch == 0 || s.steps == 0) continue;
      const double n = static_cast<double>(s.steps);
      per_step_ns["step calls"].push_back(static_cast<double>(cost->step_calls_ns) / n);
      for (const auto& [who, ns] : cost->step_parts) {
        per_step_ns[who].push_back(static_cast<double>(ns) / n);
      }
      per_step_ns["epoch end (per step)"].push_back(static_cast<double>(cost->epoch_end_ns) / n);
      if (const auto* g = s.sections.get<GpuEpochStats>()) {
        per_step_ns["gpu: collections"].push_back(static_cast<double>(g->collect_ns) / n);
        per_step_ns["gpu: drain"].push_back(static_cast<double>(g->collect_drain_ns) / n);
      }
    }
  }
  json parts = json::object();
  if (sum == 1) std::printf(" ");  // the walk is not optimized away
  std::printf("per step (ns, median over %d epochs of %d steps of %d us):\n", epochs - 1, steps,
              step_us);
  for (const auto& [who, v] : per_step_ns) {
    const double m = bench::median(v);
    parts[who] = m;
    std::printf("  %-22s %8.0f\n", who.c_str(), m);
  }
  if (!run_flags.out.empty()) {
    json j = bench::run_header("step_cost", run_flags);
    j.update({{"step_us", step_us},
              {"steps_per_epoch", steps},
              {"epochs", epochs},
              {"pollute_mb", pollute_mb},
              {"unit", "ns of the training thread per step (median over epochs after the first)"},
              {"per_step_ns", parts}});
    bench::write_results("step_cost", run_flags, j);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("step_cost", argc, argv, run); }
