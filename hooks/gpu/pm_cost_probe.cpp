// Diagnostic (GPU machine): what PM sampling costs the GPU work around it, and what turning it on
// and off costs. PM sampling enabled costs a GPU-bound trainer 0.5-0.6% of its step time on an
// H100 whatever the sampling interval, decode period or Stop/Start duty cycle
// (bench/baselines/overhead-isolation/h100.json). This probe tells apart, in one process, phases
// interleaved over several cycles:
//   off            no PM sampling
//   full           the library's metric set, started
//   enabled        the same, configured and enabled (cuptiPmSamplingEnable + SetConfig) but never
//                  started
//   no_pcie, no_tensor, gr_sm   smaller metric sets, started
// For each phase, the median time of three workloads (launch: 2000 tiny kernels; gemm: 40 bf16
// 8192x4096x4096 matmuls; mlp: 8 blocks of matmul, gelu, matmul, add, layer norm on 16384x1024),
// the time of configure(), start() and stop() on the calling thread, the SM clock and throttle
// reasons from nvidia-smi while a GEMM batch runs, and the PM samples decoded. One JSON line per
// phase. Not part of the library; results in bench/runs/.
//   pm_cost_probe [cycles] [steps]
// With "duty" (pm_cost_probe CYCLES SEGMENT_MS duty [ON_MS PERIOD_MS]): does the cost go away when
// the sampler is disabled between bursts? Segments of SEGMENT_MS of the mlp workload, rotated
// per cycle: off; on (sampler started for the whole segment); cycled (a background thread
// configures and starts a sampler for ON_MS of every PERIOD_MS, then stops it: cuptiPmSamplingStop,
// Disable, host deinitialize). One JSON line per segment (median and mean step time), then the
// medians over segments per kind.
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cupti_api.h"
#include "cupti_pm_sampling.h"
#include "torchpilot/runtime/core/logging.h"  // no spdlog header next to LibTorch's (the wheel's own fmt)

namespace {

using torchpilot::detail::PmMetric;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

template <typename F>
double median_ms(int steps, F&& step) {
  std::vector<double> t;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = Clock::now();
    step();
    torch::cuda::synchronize();
    t.push_back(ms_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::string smi_while_busy(const torch::Tensor& a, const torch::Tensor& b) {
  for (int i = 0; i < 150; ++i) (void)torch::matmul(a, b);  // ~0.1 s of work queued
  std::string out;
  if (FILE* p = popen("nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_event_reasons.active "
                      "--format=csv,noheader,nounits 2>/dev/null",
                      "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
    pclose(p);
  }
  torch::cuda::synchronize();
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  for (auto& c : out)
    if (c == '"') c = '\'';
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  namespace d = torchpilot::detail;
  const int cycles = argc > 1 ? std::atoi(argv[1]) : 3;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 15;
  const bool duty = argc > 3 && std::string(argv[3]) == "duty";
  const int on_ms = argc > 4 ? std::atoi(argv[4]) : 250;
  const int period_ms = argc > 5 ? std::atoi(argv[5]) : 1000;
  std::string error;
  auto api = d::load_cupti("", &error);
  if (api == nullptr) {
    std::printf("{\"error\": \"no CUPTI: %s\"}\n", error.c_str());
    return 1;
  }
  auto y = torch::zeros({1}, torch::kCUDA);
  const auto bf = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto a = torch::randn({8192, 4096}, bf), b = torch::randn({4096, 4096}, bf);
  auto x = torch::randn({16384, 1024}, bf);
  auto w1 = torch::randn({1024, 4096}, bf) * 0.02, w2 = torch::randn({4096, 1024}, bf) * 0.02;
  auto launch = [&] {
    for (int i = 0; i < 2000; ++i) y.add_(1.0);
  };
  auto gemm = [&] {
    for (int i = 0; i < 40; ++i) (void)torch::matmul(a, b);
  };
  auto mlp = [&] {
    auto h = x;
    for (int l = 0; l < 8; ++l) {
      h = torch::layer_norm(h + torch::matmul(torch::gelu(torch::matmul(h, w1)), w2), {1024});
    }
  };
  torch::cuda::synchronize();
  median_ms(5, launch);
  median_ms(3, gemm);
  median_ms(3, mlp);

  CUpti_Profiler_Initialize_Params init{};
  init.structSize = CUpti_Profiler_Initialize_Params_STRUCT_SIZE;
  CUptiResult r = api->profiler_initialize(&init);
  CUpti_Device_GetChipName_Params chip{};
  chip.structSize = CUpti_Device_GetChipName_Params_STRUCT_SIZE;
  chip.deviceIndex = 0;
  if (r == CUPTI_SUCCESS) r = api->device_get_chip_name(&chip);
  if (r != CUPTI_SUCCESS || chip.pChipName == nullptr) {
    std::printf("{\"error\": \"profiler: %s\"}\n", d::cupti_error_name(*api, r).c_str());
    return 1;
  }
  d::CuptiClock clock;
  clock.measure(*api);
  auto logger = torchpilot::torchpilot_logger();

  if (duty) {
    const int segment_ms = steps;
    auto make = [&](std::atomic<size_t>& samples) {
      d::PmOptions o;
      o.device = 0;
      o.chip = chip.pChipName;
      return std::make_unique<d::PmSampler>(
          *api, clock, *logger, o,
          [&samples](std::vector<torchpilot::PmSample>&& s) { samples += s.size(); });
    };
    // Step times of the mlp workload for segment_ms of wall time.
    auto segment = [&](std::vector<double>& t) {
      const auto t0 = Clock::now();
      while (ms_since(t0) < segment_ms) {
        const auto s0 = Clock::now();
        mlp();
        torch::cuda::synchronize();
        t.push_back(ms_since(s0));
      }
    };
    std::map<std::string, std::vector<double>> medians;
    const std::vector<std::string> kinds = {"off", "on", "cycled"};
    for (int c = 0; c < cycles; ++c) {
      for (size_t j = 0; j < kinds.size(); ++j) {
        const std::string& kind = kinds[(j + static_cast<size_t>(c)) % kinds.size()];
        std::atomic<size_t> samples{0};
        std::atomic<int> bursts{0};
        std::vector<double> t;
        std::string why;
        if (kind == "on") {
          auto pm = make(samples);
          why = pm->configure();
          if (why.empty()) why = pm->start();
          segment(t);
          pm->stop();
        } else if (kind == "cycled") {
          std::atomic<bool> done{false};
          std::thread cycler([&] {
            while (!done.load()) {
              const auto b = Clock::now();
              auto pm = make(samples);
              if (pm->configure().empty() && pm->start().empty()) {
                ++bursts;
                while (!done.load() && ms_since(b) < on_ms)
                  std::this_thread::sleep_for(std::chrono::milliseconds(5));
              }
              pm->stop();
              pm.reset();
              while (!done.load() && ms_since(b) < period_ms)
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
            }
          });
          segment(t);
          done = true;
          cycler.join();
        } else {
          segment(t);
        }
        double mean = 0;
        for (double v : t) mean += v;
        mean /= std::max<size_t>(1, t.size());
        std::sort(t.begin(), t.end());
        const double med = t.empty() ? 0 : t[t.size() / 2];
        medians[kind].push_back(med);
        std::printf(
            "{\"cycle\": %d, \"segment\": \"%s\", \"error\": \"%s\", \"steps\": %zu, "
            "\"median_ms\": %.4f, \"mean_ms\": %.4f, \"pm_samples\": %zu, \"bursts\": %d}\n",
            c, kind.c_str(), why.c_str(), t.size(), med, mean, samples.load(), bursts.load());
        std::fflush(stdout);
      }
    }
    auto median_of = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v[v.size() / 2];
    };
    const double off = median_of(medians["off"]);
    std::printf(
        "{\"summary\": true, \"segment_ms\": %d, \"on_ms\": %d, \"period_ms\": %d, "
        "\"off_ms\": %.4f, \"on_over_off\": %.5f, \"cycled_over_off\": %.5f}\n",
        segment_ms, on_ms, period_ms, off, median_of(medians["on"]) / off,
        median_of(medians["cycled"]) / off);
    return 0;
  }

  using M = PmMetric;
  const std::map<std::string, std::vector<PmMetric>> sets = {
      {"full", {}},
      {"enabled", {}},
      {"no_pcie",
       {M::kCounterUtilization, M::kSmEfficiency, M::kTensorActivity, M::kDramThroughput,
        M::kAchievedOccupancy}},
      {"no_tensor",
       {M::kCounterUtilization, M::kSmEfficiency, M::kDramThroughput, M::kAchievedOccupancy}},
      {"gr_sm", {M::kCounterUtilization, M::kSmEfficiency}},
  };
  const std::vector<std::string> order = {"off",     "full", "off",       "enabled", "off",
                                          "no_pcie", "off",  "no_tensor", "off",     "gr_sm"};
  for (int c = 0; c < cycles; ++c) {
    for (const auto& phase : order) {
      std::atomic<size_t> samples{0};
      std::unique_ptr<d::PmSampler> pm;
      double configure_ms = -1, start_ms = -1, stop_ms = -1;
      std::string why;
      if (phase != "off") {
        d::PmOptions o;
        o.device = 0;
        o.chip = chip.pChipName;
        o.metrics = sets.at(phase);
        pm = std::make_unique<d::PmSampler>(
            *api, clock, *logger, o,
            [&samples](std::vector<torchpilot::PmSample>&& s) { samples += s.size(); });
        auto t0 = Clock::now();
        why = pm->configure();
        configure_ms = ms_since(t0);
        if (why.empty() && phase != "enabled") {
          t0 = Clock::now();
          why = pm->start();
          start_ms = ms_since(t0);
        }
      }
      const auto first0 = Clock::now();
      launch();
      torch::cuda::synchronize();
      const double first_launch_ms = ms_since(first0);
      median_ms(2, launch);
      const double launch_ms = median_ms(steps, launch);
      const double gemm_ms = median_ms(steps, gemm);
      const double mlp_ms = median_ms(steps, mlp);
      const std::string smi = smi_while_busy(a, b);
      if (pm != nullptr) {
        const auto t0 = Clock::now();
        pm->stop();
        stop_ms = ms_since(t0);
      }
      std::printf(
          "{\"cycle\": %d, \"phase\": \"%s\", \"error\": \"%s\", \"configure_ms\": %.2f, "
          "\"start_ms\": %.2f, \"stop_ms\": %.2f, \"first_launch_ms\": %.3f, \"launch_ms\": %.4f, "
          "\"gemm_ms\": %.4f, \"mlp_ms\": %.4f, \"pm_samples\": %zu, \"smi\": \"%s\"}\n",
          c, phase.c_str(), why.c_str(), configure_ms, start_ms, stop_ms, first_launch_ms,
          launch_ms, gemm_ms, mlp_ms, samples.load(), smi.c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
