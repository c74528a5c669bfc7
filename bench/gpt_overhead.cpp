// gpt_overhead: what torchpilot costs a GPT-style trainer, as step-time ratios measured in one
// process on one model (the budgets: advise <= 1%, trace windows <= 10% while they last).
//
// Configurations, each with a fresh Pilot (a Pilot's mode is fixed at construction):
//   off      - mode off, GPU collectors disabled, no FLOP counter: the baseline.
//   advise   - mode advise with everything always-on (step/phase scopes, GPU monitor: PM sampling,
//              NVML, NVTX), a FlopCounter whose counting window lies in the round's warm-up steps
//              (the measured steps show its after-window cost); detailed windows only on request.
//   window   - advise, plus a detailed window (CUPTI activity trace) over exactly the measured
//              steps (pilot.collector<torchpilot::GpuMonitor>()->request_window in the last warm-up
//              step: a requested window starts at the end of that step). Without a GPU monitor it
//              is advise.
//   counting - advise, with the FLOP counter's counting window over the measured steps.
//   torch-profiler, torch-profiler-cuda - for scale, what a user could run instead: torchpilot
//              off, and LibTorch's own profiler (Kineto; CPU and CUDA activities, or CUDA only)
//              on over the measured steps, started after the warm-up's last step and stopped
//              after the measured ones (its stop is timed apart). LibTorch 2.x with CUDA only.
// Rounds: every configuration once per round, the order rotated by one each round (A B C D,
// B C D A, ...). In a round a configuration runs `warmup` steps, then `steps` measured steps with
// the device synchronized before each clock read at the window's edges; its figure is the mean
// step time of the window. Reported: per configuration the median over rounds, and per
// configuration X the ratio X/off - 1 of the medians with the spread (min/max) of the per-round
// ratios. The JSON file has every round's numbers; nothing else is written.
#include <sys/syscall.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpt_cli.h"
#include "gpt_flops.h"
#include "gpt_trainer.h"
#include "harness.h"
#include "torchpilot/hooks/core/compat.h"
#include "torchpilot/hooks/flops/flop_counter.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"

#if TORCHPILOT_TORCH_CUDA && TORCHPILOT_TORCH_AT_LEAST(2, 0)
#include <torch/csrc/autograd/profiler_kineto.h>
#define GPT_OVERHEAD_TORCH_PROFILER 1
#endif

namespace {

using bench::median;

using nlohmann::json;

struct Args {
  gpt_example::TrainOptions train;
  int rounds = 7;
  int steps = 100;          // measured steps per round and configuration
  int warmup = 10;          // steps before the measured ones, per round and configuration
  int prime = 10;           // untimed steps before the first round (allocator, cuBLAS, autotuning)
  bench::RunFlags run;      // --machine, --commit, --out
  bool pm_sampling = true;  // gpu.pm_sampling of the configurations other than off
  std::string trace_dir;    // window runs write their windows here, one folder per run
  std::string log_level =
      "warn";                // torchpilot's log level (debug shows the trace release's timings)
  std::vector<int> setups;   // configurations measured, off first (--configs)
  int device_buffer_mb = 0;  // window-devbuf's gpu.trace_device_buffer_mb (0: CUPTI's default)
};

enum Setup {
  kOff,
  kAdvise,
  kWindow,
  kCounting,
  kWindowNoOps,
  kWindowDeviceBuffer,
  kWindowNoPm,
  kTorchProfiler,
  kTorchProfilerCuda,
  kSetups
};
// window-noops: a window without the op-name hook (gpu.sync_op_names off), to split its cost.
// window-devbuf: a window with CUPTI's device buffer at --device-buffer-mb
// (gpu.trace_device_buffer_mb; the default 0 is CUPTI's own size, the library's before 64 MiB).
// window-nopm: a window without PM sampling (gpu.pm_sampling off), to split the two.
const char* kNames[kSetups] = {"off",         "advise",         "window",
                               "counting",    "window-noops",   "window-devbuf",
                               "window-nopm", "torch-profiler", "torch-profiler-cuda"};
bool is_torch_profiler(int setup) { return setup == kTorchProfiler || setup == kTorchProfilerCuda; }
bool is_window(int setup) {
  return setup == kWindow || setup == kWindowNoOps || setup == kWindowDeviceBuffer ||
         setup == kWindowNoPm;
}

struct RoundResult {
  int round = 0;
  int position = 0;  // place in the round's order
  double step_ms = 0;
  bool gpu_monitor = false;
  int64_t traced_steps = 0;   // steps inside detailed windows (finished by the Pilot's close)
  int64_t counted_steps = 0;  // steps whose ops the FLOP counter counted
  double counted_flops_per_step = std::nan("");
  double mfu = std::nan("");
  // After the measured steps, kTailSteps steps each synchronized and timed: the longest minus
  // their median (the window's release happens in them; noisy: compare with "off").
  double tail_excess_ms = std::nan("");
  // The longest the GPU monitor held the training thread at one step boundary (GpuEpochStats):
  // with a window, its start and end stalls.
  double max_step_call_ms = std::nan("");
  // Each measured step's host time (the training thread's call; the host runs ahead of the GPU
  // by at most the launch queue, so a stall in a launch shows here as one long step).
  std::vector<double> host_step_ms;
  // Each measured step's GPU span (step markers; configurations with the GPU monitor), and for
  // traced steps the kernels' busy fraction of it: a window that slows the GPU shows here, one
  // that slows the host shows as idle GPU time.
  std::vector<double> gpu_step_ms;
  std::vector<double> kernel_busy;
  // The threads that ran during the measured steps, by CPU time (the training thread as
  // "training"; torchpilot's own are named tp-*): what else competes while a window is on.
  std::vector<std::pair<std::string, double>> thread_cpu_ms;
  // torch-profiler rounds: how long stopping LibTorch's profiler held the training thread (it
  // collects the trace there), and the GPU events it recorded.
  double profiler_stop_ms = std::nan("");
  int64_t profiler_gpu_events = -1;
};

// Each thread's CPU time so far (ns, /proc/self/task/*/schedstat) and name, by thread id. Linux
// only; empty elsewhere.
std::map<long, std::pair<std::string, double>> thread_cpu() {
  std::map<long, std::pair<std::string, double>> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const long tid = std::strtol(e.path().filename().c_str(), nullptr, 10);
    std::ifstream sched(e.path() / "schedstat");
    double ns = 0;
    if (!(sched >> ns)) continue;
    std::ifstream comm(e.path() / "comm");
    std::string name;
    std::getline(comm, name);
    out[tid] = {name, ns};
  }
  return out;
}

// The threads that ran between two thread_cpu() readings, most CPU first (1 ms at least). A
// thread that ended in between is not counted (its time went with it).
std::vector<std::pair<std::string, double>> cpu_between(
    const std::map<long, std::pair<std::string, double>>& before,
    const std::map<long, std::pair<std::string, double>>& after) {
  const long me = static_cast<long>(syscall(SYS_gettid));
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [tid, now] : after) {
    const auto it = before.find(tid);
    const double ms = (now.second - (it == before.end() ? 0.0 : it->second.second)) / 1e6;
    if (ms >= 1) out.push_back({tid == me ? "training" : now.first, ms});
  }
  std::sort(out.begin(), out.end(),
            [](const auto& x, const auto& y) { return x.second > y.second; });
  return out;
}

constexpr int kTailSteps = 8;  // > the window's tail of flushes before its release

double median_of(const std::vector<RoundResult>& rounds, double RoundResult::*field) {
  std::vector<double> v;
  for (const auto& r : rounds)
    if (std::isfinite(r.*field)) v.push_back(r.*field);
  return median(v);
}

json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

torchpilot::Config config_for(Setup setup, const Args& a) {
  torchpilot::Config c;  // defaults, not the environment: the bench controls every key
  c.log.level = a.log_level;
  c.gpu.pm_sampling = a.pm_sampling;
  if (setup == kOff || is_torch_profiler(setup)) {
    c.mode = torchpilot::Mode::kOff;
    c.gpu.enabled = false;
    return c;
  }
  c.mode = torchpilot::Mode::kAdvise;
  // Detailed windows only on request: no first window, no repeats, no anomaly trigger.
  c.gpu.trace_first_step = 1000000000;
  c.gpu.trace_every_epochs = 0;
  c.gpu.trace_anomaly_factor = 0;
  if (setup == kCounting) {
    c.flops.skip_steps = a.warmup;  // the counting window is the measured steps
    c.flops.count_steps = a.steps;
  } else {
    // The counting window inside the warm-up, finished a step before the measured steps.
    c.flops.count_steps = std::min(c.flops.count_steps, std::max(1, a.warmup - 2));
    c.flops.skip_steps = std::min(c.flops.skip_steps, a.warmup - 1 - c.flops.count_steps);
  }
  c.flops.recount_every_steps = 0;
  if (setup == kWindowNoOps) c.gpu.sync_op_names = false;
  if (setup == kWindowDeviceBuffer) c.gpu.trace_device_buffer_mb = a.device_buffer_mb;
  if (setup == kWindowNoPm) c.gpu.pm_sampling = false;
  return c;
}

RoundResult run_one(gpt_example::Trainer& trainer, Setup setup, const Args& a, json& collectors) {
  RoundResult r;
  torchpilot::Config config = config_for(setup, a);
  if (!a.trace_dir.empty() && is_window(setup)) {
    config.report.trace_dir = bench::next_run_folder(a.trace_dir);
  }
  std::optional<torchpilot::Pilot> pilot_storage;
  torchpilot::Pilot& pilot = pilot_storage.emplace(config);
  // A window's steps finish after its release, some only when the Pilot closes: their GPU step
  // records are counted once it has.
  auto records = std::make_shared<torchpilot::RecordingSink>();
  pilot.add_sink(records);
  std::optional<torchpilot::FlopCounter> counter;
  if (setup != kOff) counter.emplace(pilot);
  r.gpu_monitor = pilot.collector<torchpilot::GpuMonitor>() != nullptr;
  if (r.gpu_monitor && collectors.is_null()) {
    collectors = json::array();
    for (const auto& s : pilot.collector<torchpilot::GpuMonitor>()->status()) {
      collectors.push_back({{"name", s.name}, {"active", s.active}, {"reason", s.reason}});
    }
  }
  // A requested window starts at the end of the step it was requested in: request it in the last
  // warm-up step so that it covers exactly the measured steps. Every configuration runs the same.
  trainer.train(pilot, a.warmup - 1);
  if (is_window(setup) && pilot.collector<torchpilot::GpuMonitor>() != nullptr)
    pilot.request_window(a.steps);
  trainer.train(pilot, 1);
  trainer.synchronize();
#if GPT_OVERHEAD_TORCH_PROFILER
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig profiler_config(
      torch::profiler::impl::ProfilerState::KINETO, false, false);
  std::set<ActivityType> activities{ActivityType::CUDA};
  if (setup == kTorchProfiler) activities.insert(ActivityType::CPU);
  if (is_torch_profiler(setup)) {
    prof::prepareProfiler(profiler_config, activities);
    prof::enableProfiler(profiler_config, activities);
  }
#endif
  const std::vector<torchpilot::StepRecord> before = pilot.recent_steps();
  const int64_t first_measured = before.empty() ? 0 : before.back().step + 1;
  const auto cpu0 = thread_cpu();  // before the clock: reading /proc takes a millisecond
  const auto t0 = std::chrono::steady_clock::now();
  r.host_step_ms.reserve(static_cast<size_t>(a.steps));
  auto s0 = t0;
  for (int i = 0; i < a.steps; ++i) {
    trainer.train(pilot, 1);
    const auto s1 = std::chrono::steady_clock::now();
    r.host_step_ms.push_back(std::chrono::duration<double, std::milli>(s1 - s0).count());
    s0 = s1;
  }
  trainer.synchronize();
  const auto t1 = std::chrono::steady_clock::now();
  r.thread_cpu_ms = cpu_between(cpu0, thread_cpu());  // outside the timed steps
  r.step_ms = std::chrono::duration<double, std::milli>(t1 - t0).count() / a.steps;
#if GPT_OVERHEAD_TORCH_PROFILER
  if (is_torch_profiler(setup)) {
    const auto p0 = bench::Clock::now();
    const auto result = prof::disableProfiler();
    r.profiler_stop_ms = bench::ms_since(p0);
    r.profiler_gpu_events = 0;
    if (result) {
      for (const auto& e : result->events()) {
        if (e.deviceType() == c10::DeviceType::CUDA) ++r.profiler_gpu_events;
      }
    }
  }
#endif
  std::vector<double> tail;
  for (int i = 0; i < kTailSteps; ++i) {
    const auto s0 = bench::Clock::now();
    trainer.train(pilot, 1);
    trainer.synchronize();
    tail.push_back(bench::ms_since(s0));
  }
  r.tail_excess_ms = *std::max_element(tail.begin(), tail.end()) - median(tail);
  pilot.end_epoch();  // outside the measurement: flushes the collectors, fills the summary
  if (!pilot.epoch_summaries().empty()) {
    const torchpilot::EpochSummary& s = pilot.epoch_summaries().back();
    if (s.sections.get<torchpilot::GpuEpochStats>()) {
      r.traced_steps = s.sections.get<torchpilot::GpuEpochStats>()->traced_steps;
      r.max_step_call_ms = s.sections.get<torchpilot::GpuEpochStats>()->max_step_call_ns / 1e6;
    }
    if (s.sections.get<torchpilot::FlopEpochStats>()) {
      r.counted_steps = s.sections.get<torchpilot::FlopEpochStats>()->counted_steps;
      if (s.sections.get<torchpilot::FlopEpochStats>()->counted_steps > 0)
        r.counted_flops_per_step =
            s.sections.get<torchpilot::FlopEpochStats>()->model_flops_per_step;
      r.mfu = s.sections.get<torchpilot::FlopEpochStats>()->mfu;
    }
  }
  trainer.take_mean_loss();  // keeps the running sum small; outside the measurement
  counter.reset();
  pilot_storage.reset();
  int64_t traced = 0;
  for (const auto& g : records->late<torchpilot::GpuStepRecord>()) {
    traced += g.traced ? 1 : 0;
    if (g.step < first_measured || g.step >= first_measured + a.steps || !g.gpu_timed) continue;
    r.gpu_step_ms.push_back(static_cast<double>(g.gpu_end_ns - g.gpu_begin_ns) / 1e6);
    if (g.traced && std::isfinite(g.stats.gpu_utilization) && g.stats.gpu_utilization >= 0) {
      r.kernel_busy.push_back(g.stats.gpu_utilization);
    }
  }
  r.traced_steps = std::max(r.traced_steps, traced);
  return r;
}

bool has(const std::vector<int>& setups, int s) {
  return std::find(setups.begin(), setups.end(), s) != setups.end();
}

int run(int argc, char** argv) {
  Args a;
  a.train = gpt_example::reference_options(8);
  std::string precision = "bf16", attention = "fused", optimizer = "fused";
  std::vector<std::string> configs = {"off", "advise", "window", "counting"};
  CLI::App app(
      "gpt_overhead: torchpilot's step-time overhead on the GPT example: off vs advise vs a "
      "detailed window vs the FLOP counter's counting window, interleaved in rounds, in one "
      "process (bench/README.md).",
      "gpt_overhead");
  example_cli::last_wins(app);
  gpt_example::add_shape_flags(app, a.train, "batch B");
  gpt_example::add_precision_flags(app, precision, &attention);
  app.add_option("--optimizer", optimizer,
                 "AdamW: fused (foreach where unavailable), foreach, or per-parameter")
      ->check(CLI::IsMember({"fused", "foreach", "per-parameter"}))
      ->capture_default_str();
  app.add_option("--device", a.train.device, "cpu, cuda or cuda:N; default cuda when available")
      ->check(example_cli::Device())
      ->type_name("cpu|cuda|cuda:N");
  bench::int_flag(app, "--rounds", a.rounds, 1, 10000,
                  "rounds (every configuration once per round)");
  bench::int_flag(app, "--steps-per-round", a.steps, 1, 1000000,
                  "measured steps per round and configuration");
  bench::int_flag(app, "--warmup", a.warmup, 3, 1000000,
                  "steps before the measured ones, per round and configuration");
  bench::int_flag(app, "--prime", a.prime, 0, 1000000, "untimed steps before the first round");
  app.add_flag("!--no-pm-sampling", a.pm_sampling,
               "PM sampling off in every configuration (gpu.pm_sampling false): its share of the "
               "cost");
  example_cli::add_int(app, "--device-buffer-mb", a.device_buffer_mb, 0, 4096,
                       "CUPTI's device buffer in window-devbuf (gpu.trace_device_buffer_mb; 0: "
                       "CUPTI's default)")
      ->capture_default_str();
  app.add_option("--trace-dir", a.trace_dir,
                 "window runs write their windows as trace-event files here (report.trace_dir), "
                 "a folder per run");
  app.add_option("--log-level", a.log_level, "torchpilot's log level")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->capture_default_str();
  bench::add_run_flags(app, a.run, "write every round's numbers here (JSON)");
  app.add_option("--configs", configs,
                 "configurations measured, comma-separated (off is always measured, first)")
      ->delimiter(',')
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(kNames), std::end(kNames))))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->type_name("LIST")
      ->capture_default_str();
  example_cli::parse_or_exit(app, argc, argv);
  if (a.train.d_model % a.train.heads != 0) {
    example_cli::fail(app, "--heads",
                      "--d-model " + std::to_string(a.train.d_model) +
                          " is not a multiple of --heads " + std::to_string(a.train.heads));
  }
  gpt_example::apply_precision_flags(a.train, precision, &attention);
  a.train.optimizer = gpt_example::optimizer_from_string(optimizer);
  a.setups = {kOff};
  for (const std::string& name : configs) {
    const int s = static_cast<int>(std::find(std::begin(kNames), std::end(kNames), name) -
                                   std::begin(kNames));
#if !GPT_OVERHEAD_TORCH_PROFILER
    if (is_torch_profiler(s)) {
      example_cli::fail(app, "--configs", name + " needs LibTorch 2.x with CUDA");
    }
#endif
    if (!has(a.setups, s)) a.setups.push_back(s);
  }

  const int n_setups = static_cast<int>(a.setups.size());
  gpt_example::Trainer trainer(a.train);
  const gpt_example::GptShape shape = trainer.shape();
  const double analytic = gpt_example::model_flops_per_step(shape);
  std::printf(
      "gpt_overhead: %s; d %lld, %lld layers, %lld heads, T %lld, batch %lld, %s attention, %s "
      "linear, %s, %s AdamW, device %s; %d rounds x %d configurations x (%d warm-up + %d measured "
      "steps)\n",
      a.run.machine.c_str(), static_cast<long long>(shape.d_model),
      static_cast<long long>(shape.layers), static_cast<long long>(a.train.heads),
      static_cast<long long>(shape.seq), static_cast<long long>(shape.batch),
      trainer.fused_attention() ? "fused" : "unfused", a.train.aten_linear ? "aten" : "module",
      gpt_example::to_string(trainer.precision()), gpt_example::to_string(trainer.optimizer()),
      trainer.device().c_str(), a.rounds, n_setups, a.warmup, a.steps);
  std::fflush(stdout);
  const auto started = bench::Clock::now();
  {
    torchpilot::Config off = config_for(kOff, a);
    torchpilot::Pilot pilot(off);
    trainer.train(pilot, a.prime);
    trainer.synchronize();
    trainer.take_mean_loss();
  }

  std::vector<std::vector<RoundResult>> results(kSetups);
  json collectors;  // the GPU collectors' status, from the first Pilot that had a GPU monitor
  bench::interleave(a.rounds, n_setups, bench::Order::kRotate, [&](int round, int k, int i) {
    if (k == 0) std::printf("  round %d:", round + 1);
    const Setup setup = static_cast<Setup>(a.setups[static_cast<size_t>(i)]);
    RoundResult r = run_one(trainer, setup, a, collectors);
    r.round = round;
    r.position = k;
    std::printf(" %s %.3f ms", kNames[setup], r.step_ms);
    std::fflush(stdout);
    results[setup].push_back(r);
    if (k == n_setups - 1) std::printf("\n");
  });
  const double elapsed = bench::seconds_since(started);

  std::vector<std::vector<double>> step_ms(kSetups);
  std::vector<double> medians(kSetups);
  for (int s = 0; s < kSetups; ++s) {
    for (const auto& r : results[s]) step_ms[s].push_back(r.step_ms);
    medians[s] = median(step_ms[s]);
  }
  struct Ratio {
    double of_medians = 0;
    bench::Spread rounds{};
    std::vector<double> per_round;
  };
  auto ratio = [&](Setup s) {
    Ratio q;
    q.per_round = bench::per_round_ratios(step_ms[s], step_ms[kOff], 1);
    q.of_medians = medians[s] / medians[kOff] - 1;
    q.rounds = bench::spread(q.per_round);
    return q;
  };

  const bool window_traced = !results[kWindow].empty() && results[kWindow][0].traced_steps > 0;
  const RoundResult none;
  std::printf(
      "\n| configuration | median step (ms) | vs off (ratio of medians) | per-round min .. max "
      "|\n");
  std::printf("|---|---|---|---|\n");
  std::printf("| off | %.3f | | |\n", medians[kOff]);
  std::vector<Ratio> ratios(kSetups);
  for (int s = kAdvise; s < kSetups; ++s) {
    if (!has(a.setups, s)) continue;
    ratios[s] = ratio(static_cast<Setup>(s));
    std::printf("| %s | %.3f | %+.2f%% | %+.2f%% .. %+.2f%% |\n", kNames[s], medians[s],
                100 * ratios[s].of_medians, 100 * ratios[s].rounds.min, 100 * ratios[s].rounds.max);
  }
  const RoundResult& counted = results[kCounting].empty() ? none : results[kCounting].front();
  const RoundResult& advised = results[kAdvise].empty() ? none : results[kAdvise].front();
  const RoundResult& windowed = results[kWindow].empty() ? none : results[kWindow].front();
  std::printf(
      "GPU monitor: %s; window rounds traced %lld steps (first round); counting rounds "
      "counted %lld steps\n",
      advised.gpu_monitor || windowed.gpu_monitor || counted.gpu_monitor
          ? "on"
          : "absent (no GPU: advise = scopes + "
            "FLOP counter only, window = advise)",
      static_cast<long long>(windowed.traced_steps), static_cast<long long>(counted.counted_steps));
  if (std::isfinite(counted.counted_flops_per_step)) {
    std::printf("FLOPs/step: counted %.4g, analytic %.4g (counted/analytic %.4f)\n",
                counted.counted_flops_per_step, analytic,
                counted.counted_flops_per_step / analytic);
  }
  std::printf(
      "window end stall: %.2f ms (the longest step-boundary call of the GPU monitor in a window "
      "round; advise: %.2f ms); tail steps' excess over their median: window %.1f ms, off %.1f "
      "ms\n",
      median_of(results[kWindow], &RoundResult::max_step_call_ms),
      median_of(results[kAdvise], &RoundResult::max_step_call_ms),
      median_of(results[kWindow], &RoundResult::tail_excess_ms),
      median_of(results[kOff], &RoundResult::tail_excess_ms));
  for (int s : {kTorchProfiler, kTorchProfilerCuda}) {
    if (!has(a.setups, s)) continue;
    std::printf(
        "%s: stopping it held the training thread %.1f ms (median); it recorded %lld GPU "
        "events in the first round\n",
        kNames[s], median_of(results[s], &RoundResult::profiler_stop_ms),
        static_cast<long long>(results[s].front().profiler_gpu_events));
  }
  std::printf("bench wall time %.0f s\n", elapsed);

  if (!a.run.out.empty()) {
    json per_config = json::object();
    for (int s = 0; s < kSetups; ++s) {
      if (!has(a.setups, s)) continue;
      json rounds = json::array();
      for (const auto& r : results[s]) {
        rounds.push_back({{"round", r.round},
                          {"position", r.position},
                          {"step_ms", r.step_ms},
                          {"gpu_monitor", r.gpu_monitor},
                          {"traced_steps", r.traced_steps},
                          {"counted_steps", r.counted_steps},
                          {"counted_model_flops_per_step", number(r.counted_flops_per_step)},
                          {"mfu", number(r.mfu)},
                          {"tail_excess_ms", number(r.tail_excess_ms)},
                          {"host_step_ms", r.host_step_ms},
                          {"gpu_step_ms", r.gpu_step_ms},
                          {"kernel_busy", r.kernel_busy},
                          {"thread_cpu_ms",
                           [&] {
                             json t = json::array();
                             for (const auto& [name, ms] : r.thread_cpu_ms)
                               t.push_back({{"thread", name}, {"cpu_ms", ms}});
                             return t;
                           }()},
                          {"max_step_call_ms", number(r.max_step_call_ms)},
                          {"profiler_stop_ms", number(r.profiler_stop_ms)},
                          {"profiler_gpu_events", r.profiler_gpu_events}});
      }
      per_config[kNames[s]] = {{"median_step_ms", number(medians[s])}, {"rounds", rounds}};
    }
    json ratio_json = json::object();
    for (int s = kAdvise; s < kSetups; ++s) {
      if (!has(a.setups, s)) continue;
      ratio_json[std::string(kNames[s]) + "_vs_off"] = {
          {"ratio_of_medians_minus_1", ratios[s].of_medians},
          {"per_round_min", ratios[s].rounds.min},
          {"per_round_max", ratios[s].rounds.max},
          {"per_round_median", ratios[s].rounds.median},
          {"per_round", ratios[s].per_round}};
    }
    json j = bench::run_header("gpt_overhead", a.run);
    j.update(
        {{"device", trainer.device()},
         {"libtorch", TORCH_VERSION},
         {"method",
          "one process, one model; per round every configuration once, order rotated by one per "
          "round; each a fresh Pilot, warm-up steps then measured steps with the device "
          "synchronized at the window edges; figure = mean step time of the window; medians over "
          "rounds; ratios vs off"},
         {"config",
          {{"d_model", shape.d_model},
           {"layers", shape.layers},
           {"heads", a.train.heads},
           {"seq", shape.seq},
           {"batch", shape.batch},
           {"vocab", shape.vocab},
           {"attention", trainer.fused_attention() ? "fused" : "unfused"},
           {"linear", a.train.aten_linear ? "aten" : "module"},
           {"precision", gpt_example::to_string(trainer.precision())},
           {"optimizer", gpt_example::to_string(trainer.optimizer())},
           {"parameters", trainer.parameter_count()},
           {"analytic_model_flops_per_step", analytic},
           {"rounds", a.rounds},
           {"warmup_steps", a.warmup},
           {"measured_steps", a.steps},
           {"prime_steps", a.prime},
           {"configurations_measured",
            [&] {
              json names = json::array();
              for (int x : a.setups) names.push_back(kNames[x]);
              return names;
            }()}}},
         {"configurations",
          {{"off", "mode off, gpu.enabled false, no FLOP counter"},
           {"advise",
            "mode advise, GPU monitor always-on collectors, FLOP counter (counting "
            "window in the warm-up), no detailed window"},
           {"window", "advise + a detailed window (CUPTI activity) over the measured steps"},
           {"counting", "advise + the FLOP counter's counting window over the measured steps"},
           {"window-noops", "window without the op-name hook (gpu.sync_op_names false)"},
           {"window-devbuf", "window with CUPTI's device buffer at --device-buffer-mb"},
           {"window-nopm", "window without PM sampling (gpu.pm_sampling false)"},
           {"torch-profiler",
            "torchpilot off; LibTorch's profiler (Kineto, CPU and CUDA activities) over the "
            "measured steps"},
           {"torch-profiler-cuda",
            "torchpilot off; LibTorch's profiler (Kineto, CUDA activities only) over the measured "
            "steps"}}},
         {"gpu_collectors", collectors},
         {"flops_check",
          {{"analytic_model_flops_per_step", analytic},
           {"counted_model_flops_per_step", number(counted.counted_flops_per_step)},
           {"counted_over_analytic", number(counted.counted_flops_per_step / analytic)}}},
         {"window_traced", window_traced},
         {"median_step_ms",
          {{"off", number(medians[kOff])},
           {"advise", number(medians[kAdvise])},
           {"window", number(medians[kWindow])},
           {"counting", number(medians[kCounting])},
           {"torch-profiler", number(medians[kTorchProfiler])},
           {"torch-profiler-cuda", number(medians[kTorchProfilerCuda])}}},
         {"ratios", ratio_json},
         // The stall at a window's end: the longest the GPU monitor held the training thread at a
         // step boundary in a window round (its start and end included); medians over rounds.
         {"window_end_stall_ms",
          number(median_of(results[kWindow], &RoundResult::max_step_call_ms))},
         {"advise_max_step_call_ms",
          number(median_of(results[kAdvise], &RoundResult::max_step_call_ms))},
         // Cross-check from outside: the longest of kTailSteps synchronized steps after the
         // measured ones minus their median, per configuration (noisy; "off" is the noise floor).
         {"tail_excess_ms",
          {{"off", number(median_of(results[kOff], &RoundResult::tail_excess_ms))},
           {"window", number(median_of(results[kWindow], &RoundResult::tail_excess_ms))}}},
         {"per_config", per_config},
         {"wall_s", elapsed}});
    bench::write_results("gpt_overhead", a.run, j);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("gpt_overhead", argc, argv, run); }
