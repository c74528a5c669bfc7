// GPU truth under PyTorch's profiler (label gpu; skips without a GPU): kineto holds CUPTI, and
// torchpilot must neither crash nor blind it, and must say what it turned off. A separate
// executable because it uses LibTorch's internal profiler headers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <set>

#include "gpu_test_support.h"
#include "torchpilot/runtime/gpu_monitor.h"
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

TEST(GpuProfilerTest, RunsCleanlyWhilePyTorchProfilerHoldsCupti) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  const ProfilerConfig config(ProfilerState::KINETO, false, false);
  const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
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

#else

TEST(GpuProfilerTest, NeedsCudaLibTorch2) { GTEST_SKIP() << "needs LibTorch 2.x with CUDA"; }

#endif

}  // namespace
}  // namespace torchpilot
