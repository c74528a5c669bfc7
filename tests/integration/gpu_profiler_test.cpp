// GPU truth under PyTorch's profiler (label gpu; skips without a GPU): kineto holds CUPTI, and
// torchpilot must neither crash nor blind it, and must say what it turned off. A separate
// executable because it uses LibTorch's internal profiler headers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "captured_stderr.h"
#include "gpu_test_support.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/analyze/kineto_trace.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"
#include "torchpilot/torchpilot.h"

#if TORCHPILOT_TORCH_CUDA && TORCHPILOT_TORCH_AT_LEAST(2, 0)
#include <torch/csrc/autograd/profiler_kineto.h>
#define TORCHPILOT_PROFILER_TEST 1
#endif

namespace torchpilot {
namespace {

#if TORCHPILOT_PROFILER_TEST

using testing_support::gpu_config;
using testing_support::PilotRun;
namespace prof = torch::autograd::profiler;

// LibTorch's profiler as users run it (Kineto; CPU and CUDA activities), started.
void start_torch_profiler() {
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO,
                                                     false, false);
  const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
}

TEST(GpuProfilerTest, RunsCleanlyWhilePyTorchProfilerHoldsCupti) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  start_torch_profiler();
  auto a = torch::randn({2048, 2048}, torch::kCUDA);
  {
    PilotRun run(gpu_config(0, 4));
    ASSERT_NE(run.pilot->collector<GpuMonitor>(), nullptr);
    for (int i = 0; i < 6; ++i) {
      auto step = run.pilot->step(1);
      auto c = torch::mm(a, a);
      torch::cuda::synchronize();
    }
    run.pilot->end_epoch();
    const EpochSummary& s = run.epoch();
    ASSERT_TRUE(s.sections.get<GpuEpochStats>());
    EXPECT_EQ(run.sink->steps.size(), 6u);
    for (const auto& st : s.sections.get<GpuEpochStats>()->collectors) {
      std::printf("  collector %s: %s %s\n", st.name.c_str(), st.active ? "on" : "off",
                  st.reason.c_str());
    }
    std::printf("  traced steps %lld, SM efficiency %.4f\n",
                static_cast<long long>(s.sections.get<GpuEpochStats>()->traced_steps),
                s.sections.get<GpuEpochStats>()->stats.sm_efficiency);
    if (!run.collector_active("activity")) {
      // Degraded: the reason names the other client, and no window was traced.
      for (const auto& st : s.sections.get<GpuEpochStats>()->collectors) {
        if (st.name == "activity") EXPECT_NE(st.reason.find("CUPTI"), std::string::npos);
      }
      EXPECT_EQ(s.sections.get<GpuEpochStats>()->traced_steps, 0);
    }
  }
  auto result = prof::disableProfiler();
  ASSERT_TRUE(result);
  int64_t gpu_events = 0;
  for (const auto& e : result->events()) {
    if (e.deviceType() == c10::DeviceType::CUDA) ++gpu_events;
  }
  std::printf("  torch profiler recorded %lld GPU events\n", static_cast<long long>(gpu_events));
  EXPECT_GT(gpu_events, 0) << "torchpilot blinded PyTorch's profiler";
}

// LibTorch's own profiler (Kineto) started and stopped inside a running trainer while torchpilot
// samples: torchpilot steps aside (a window asked for meanwhile is skipped, with one line; PM
// samples are dropped, with one line, until CUPTI's new clock, Kineto's ticks, is measured),
// never crashes, and resumes after: PM figures come back, and windows are traced again once
// Kineto lets go of CUPTI.
TEST(GpuProfilerTest, StepsAsideWhilePyTorchProfilerRunsAndResumesAfter) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto a = torch::randn({4096, 4096}, torch::kCUDA);
  int64_t gpu_events = 0;
  std::string log;
  std::vector<EpochSummary> epochs;
  int64_t steps = 0;
  {
    testing_support::CapturedStderr captured("profiler-test");
    PilotRun run(gpu_config(1'000'000, 4));  // windows only on request
    if (run.pilot->collector<GpuMonitor>() == nullptr) {
      log = captured.text();
      GTEST_SKIP() << "no GPU monitor here: " << log;
    }
    auto epoch = [&](int n) {
      for (int i = 0; i < n; ++i) {
        auto step = run.pilot->step(1);
        auto c = torch::mm(a, a);
        torch::cuda::synchronize();
      }
      run.pilot->end_epoch();
    };
    epoch(20);  // before: PM figures
    start_torch_profiler();
    run.pilot->request_window(4);  // while the profiler holds CUPTI
    epoch(20);
    auto result = prof::disableProfiler();
    if (result) {
      for (const auto& e : result->events()) {
        if (e.deviceType() == c10::DeviceType::CUDA) ++gpu_events;
      }
    }
    run.pilot->request_window(4);  // after: torchpilot's own window again
    epoch(30);
    epochs = run.sink->epochs;
    steps = static_cast<int64_t>(run.sink->steps.size());
    log = captured.text();
  }
  std::printf("%s", log.c_str());
  ASSERT_EQ(epochs.size(), 3u);
  EXPECT_EQ(steps, 70);
  const char* names[] = {"before", "during", "after"};
  for (size_t i = 0; i < epochs.size(); ++i) {
    const GpuEpochStats* g = epochs[i].sections.get<GpuEpochStats>();
    ASSERT_NE(g, nullptr) << names[i];
    std::printf("  %s the profiler: SM efficiency %.4f, utilization %.4f, traced steps %lld\n",
                names[i], g->stats.sm_efficiency, g->stats.counter_utilization,
                static_cast<long long>(g->traced_steps));
    for (const auto& st : g->collectors) {
      std::printf("    collector %s: %s %s\n", st.name.c_str(), st.active ? "on" : "off",
                  st.reason.c_str());
    }
  }
  std::printf("  torch profiler recorded %lld GPU events\n", static_cast<long long>(gpu_events));
  EXPECT_GT(gpu_events, 0) << "torchpilot blinded PyTorch's profiler";
  const GpuEpochStats* before = epochs[0].sections.get<GpuEpochStats>();
  const GpuEpochStats* during = epochs[1].sections.get<GpuEpochStats>();
  const GpuEpochStats* after = epochs[2].sections.get<GpuEpochStats>();
  EXPECT_TRUE(measured(before->stats.sm_efficiency));
  EXPECT_EQ(during->traced_steps, 0) << "the window during the profiler must step aside";
  EXPECT_LE(testing_support::occurrences(log, "GPU trace window skipped"), 1) << "one line";
  // Seen on the H100 with torch 2.11: after disableProfiler() Kineto keeps CUPTI's subscription
  // for the rest of the process, so a later window is skipped too, silently (no second line),
  // with the status naming the other client; should it let go, the window is traced.
  if (after->traced_steps == 0) {
    for (const auto& st : after->collectors) {
      if (st.name == kActivityCollector) {
        EXPECT_NE(st.reason.find("another CUPTI client"), std::string::npos) << st.reason;
      }
    }
  } else {
    EXPECT_EQ(after->traced_steps, 4);
  }
  // PM sampling goes on: its samples line up with the steps again after the profiler.
  EXPECT_TRUE(measured(after->stats.sm_efficiency)) << "PM figures must come back";
  // On the right steps: with CUPTI's clock on Kineto's ticks converted as nanoseconds, samples ran
  // 2.1 times as fast as the steps and this read 0.33 (27f08c3 measures the clock's rate; 0.94).
  EXPECT_GT(after->stats.sm_efficiency, 0.6) << "4096^2 matmuls keep most SMs busy";
  EXPECT_LE(testing_support::occurrences(log, "line up with the steps again"),
            testing_support::occurrences(log, "sample times are"));
}

// LibTorch's profiler run and stopped before torchpilot starts (a user who profiled a few steps
// first): a Pilot started afterwards still gets PM figures. Kineto leaves CUPTI's clock on TSC
// ticks; before the clock's rate was measured (27f08c3) this Pilot got none (H100, torch 2.11).
TEST(GpuProfilerTest, PmFiguresComeForAPilotStartedAfterThePyTorchProfiler) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto a = torch::randn({4096, 4096}, torch::kCUDA);
  start_torch_profiler();
  for (int i = 0; i < 10; ++i) {
    auto c = torch::mm(a, a);
    torch::cuda::synchronize();
  }
  ASSERT_TRUE(prof::disableProfiler());
  std::string log;
  std::vector<EpochSummary> epochs;
  {
    testing_support::CapturedStderr captured("profiler-after-test");
    Config c = gpu_config(1'000'000, 4);
    c.log.level = "debug";  // the PM clock's checks, for the record
    PilotRun run(c);
    if (run.pilot->collector<GpuMonitor>() == nullptr) GTEST_SKIP() << "no GPU monitor here";
    for (int e = 0; e < 3; ++e) {
      for (int i = 0; i < 40; ++i) {
        auto step = run.pilot->step(1);
        auto c2 = torch::mm(a, a);
        torch::cuda::synchronize();
      }
      run.pilot->end_epoch();
    }
    epochs = run.sink->epochs;
    log = captured.text();
  }
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("PM sampling") != std::string::npos ||
        line.find("CUPTI clock") != std::string::npos) {
      std::printf("%s\n", line.c_str());
    }
  }
  ASSERT_EQ(epochs.size(), 3u);
  for (size_t i = 0; i < epochs.size(); ++i) {
    const GpuEpochStats* g = epochs[i].sections.get<GpuEpochStats>();
    ASSERT_NE(g, nullptr);
    std::printf("  epoch %zu: SM efficiency %.4f\n", i, g->stats.sm_efficiency);
  }
  const GpuEpochStats* last = epochs.back().sections.get<GpuEpochStats>();
  EXPECT_TRUE(measured(last->stats.sm_efficiency)) << "PM figures must come";
  EXPECT_GT(last->stats.sm_efficiency, 0.6) << "4096^2 matmuls keep most SMs busy (0.93 seen)";
}

// Issue 14: one planted trainer (host work, GPU work, loss.item() every step: the planted
// host_sync pair's bad form) analysed live, by a Pilot with a detailed window, and offline, from
// its PyTorch profiler trace by torchpilot-analyze's functions (kineto_trace.h): both give the
// host_sync advice, with estimated gains within a factor of 2 of each other.
TEST(GpuProfilerTest, LiveAndTraceGiveTheSameAdviceOnAPlantedHostSync) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(3);
  torch::nn::Sequential mlp;
  for (int i = 0; i < 6; ++i) mlp->push_back(torch::nn::Linear(2048, 2048));
  mlp->to(torch::kCUDA);
  torch::optim::SGD opt(mlp->parameters(), torch::optim::SGDOptions(1e-4));
  const auto x = torch::randn({2048, 2048}, torch::kCUDA);
  volatile double sink = 0;
  auto train_step = [&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(3);
    double acc = 0;  // host work: preprocessing on the training thread
    while (std::chrono::steady_clock::now() < until) acc += 1e-9;
    sink = sink + acc;
    opt.zero_grad();
    auto loss = mlp->forward(x).square().mean();
    loss.backward();
    opt.step();
    sink = sink + loss.item<float>();  // the planted sync
  };
  for (int i = 0; i < 5; ++i) train_step();  // cuBLAS and the allocator warm up
  torch::cuda::synchronize();
  constexpr int kSteps = 14;

  // Live: a Pilot, a window over steps 4-11.
  std::vector<Advice> live;
  {
    PilotRun run(gpu_config(4, 8));
    if (!run.collector_active("activity")) GTEST_SKIP() << run.missing({"activity"});
    for (int i = 0; i < kSteps; ++i) {
      auto step = run.pilot->step(2048);
      train_step();
    }
    run.pilot->end_epoch();
    live = run.sink->advice.back();
  }

  // Offline: the same steps under PyTorch's profiler, one ProfilerStep#N span each.
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true, false, false,
                              false, false);
  const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  for (int i = 0; i < kSteps; ++i) {
    RECORD_USER_SCOPE("ProfilerStep#" + std::to_string(i));
    train_step();
  }
  torch::cuda::synchronize();
  auto result = prof::disableProfiler();
  ASSERT_TRUE(result);
  char path[] = "/tmp/torchpilot-live-vs-trace-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  result->save(path);
  const KinetoTrace trace = parse_kineto_trace(read_trace_file(path));
  std::remove(path);
  const EpochSummary offline_summary = kineto_epoch_summary(trace);
  const std::vector<Advice> offline = run_advisors(offline_summary, Config{});

  auto find = [](const std::vector<Advice>& all, const std::string& id) -> const Advice* {
    for (const Advice& a : all) {
      if (a.id == id) return &a;
    }
    return nullptr;
  };
  auto ids = [](const std::vector<Advice>& all) {
    std::string out;
    for (const Advice& a : all) out += a.id + (a.gain_estimated ? "" : "(no gain)") + " ";
    return out;
  };
  std::printf("  live: %s\n  trace (%zu steps): %s\n", ids(live).c_str(), trace.steps.size(),
              ids(offline).c_str());
  const Advice* l = find(live, "host_sync");
  const Advice* o = find(offline, "host_sync");
  ASSERT_NE(l, nullptr) << "live: " << ids(live);
  ASSERT_NE(o, nullptr) << "trace: " << ids(offline);
  std::printf("  host_sync live %+.1f%%, trace %+.1f%%\n  live: %s\n  trace: %s\n",
              100 * l->expected_gain, 100 * o->expected_gain, l->finding.c_str(),
              o->finding.c_str());
  ASSERT_GT(l->expected_gain, 0);
  ASSERT_GT(o->expected_gain, 0);
  const double ratio = o->expected_gain / l->expected_gain;
  EXPECT_GT(ratio, 0.5);
  EXPECT_LT(ratio, 2.0);
}

#else

TEST(GpuProfilerTest, NeedsCudaLibTorch2) { GTEST_SKIP() << "needs LibTorch 2.x with CUDA"; }

#endif

}  // namespace
}  // namespace torchpilot
