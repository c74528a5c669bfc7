// Host syncs by cause on a real GPU (label gpu; skips without one): .item() after each of several
// micro-steps in phase "forward" is named (op, phase, API) with the GPU idle it causes, and a
// stream waiting for an event (GPU-side) is not a host sync.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>

#include "gpu_test_support.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"
#include "torchpilot/torchpilot.h"

#if TORCHPILOT_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace torchpilot {
namespace {

using testing_support::gpu_config;
using testing_support::PilotRun;

TEST(GpuSyncCausesTest, ItemAfterMicroStepsIsNamedWithPhaseAndIdle) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
#if TORCHPILOT_TORCH_CUDA
  PilotRun run(gpu_config(2, 4));
  ASSERT_NE(run.pilot->collector<GpuMonitor>(), nullptr);
  if (!run.collector_active("activity")) GTEST_SKIP() << "activity trace unavailable";
  const torch::Tensor x = torch::randn({512, 512}, torch::kCUDA);
  auto side = c10::cuda::getStreamFromPool();
  constexpr int kMicroSteps = 4;
  for (int i = 0; i < 10; ++i) {
    auto step = run.pilot->step(1);
    {
      auto p = run.pilot->phase("forward");
      for (int m = 0; m < kMicroSteps; ++m) {
        torch::Tensor y = x;
        for (int k = 0; k < 8; ++k) y = torch::tanh(y.mm(x));
        (void)y.sum().item<float>();  // the host waits, the queue drains
      }
    }
    {
      // A GPU-side wait: the current stream waits for an event on a side stream.
      auto p = run.pilot->phase("waits");
      at::cuda::CUDAEvent ev;
      {
        c10::cuda::CUDAStreamGuard guard(side);
        (void)x.mm(x);
        ev.record(side);
      }
      ev.block(c10::cuda::getCurrentCUDAStream());
      (void)x.mm(x);
    }
  }
  run.pilot->end_epoch();
  const GpuEpochStats* gpu = run.epoch().sections.get<GpuEpochStats>();
  ASSERT_NE(gpu, nullptr);
  ASSERT_GT(gpu->traced_steps, 0);
  ASSERT_FALSE(gpu->top_sync_sites.empty());
  // Enough to tell next time who made a sync: its thread (CUPTI's callback on the call), and
  // CUPTI's stream and event ids (-1: not applicable).
  std::printf("traced steps %lld, syncs of torchpilot's own threads (not counted): %lld\n",
              static_cast<long long>(gpu->traced_steps),
              static_cast<long long>(gpu->own_thread_syncs));
  for (const SyncSite& s : gpu->top_sync_sites) {
    std::printf(
        "sync site: %s [%s] phase '%s' %lld calls (trainer thread %lld, other thread %lld, "
        "unknown %lld), stream %lld, event %lld, wait %.3f ms, idle %.3f ms\n",
        s.cause.c_str(), s.api.c_str(), s.phase.c_str(), static_cast<long long>(s.count),
        static_cast<long long>(s.trainer_calls), static_cast<long long>(s.other_thread_calls),
        static_cast<long long>(s.count - s.trainer_calls - s.other_thread_calls),
        static_cast<long long>(s.stream_id), static_cast<long long>(s.event_id),
        s.host_wait_ns / 1e6, s.idle_ns / 1e6);
    EXPECT_NE(s.phase, "waits") << "cudaStreamWaitEvent is not a host sync";
  }
  const SyncSite& top = gpu->top_sync_sites.front();
  EXPECT_EQ(top.cause, "aten::item");
  // The .item() calls run on this thread: CUPTI's callbacks matched their records.
  EXPECT_EQ(top.trainer_calls, top.count) << "sync records not matched to their calls' thread";
  EXPECT_EQ(top.phase, "forward");
  EXPECT_GE(top.count, (kMicroSteps - 1) * gpu->traced_steps);
  EXPECT_LE(top.count, kMicroSteps * (gpu->traced_steps + 1));
  EXPECT_GT(top.idle_ns, 0);
  EXPECT_GT(gpu->stats.idle_host_sync_ns, 0);
  const Nanos idle = gpu->stats.idle_data_wait_ns + gpu->stats.idle_host_sync_ns +
                     gpu->stats.idle_pageable_copy_ns + gpu->stats.idle_launch_gap_ns +
                     gpu->stats.idle_other_ns;
  EXPECT_NEAR(static_cast<double>(idle),
              (1.0 - gpu->stats.gpu_utilization) * static_cast<double>(gpu->stats.traced_ns),
              0.01 * static_cast<double>(gpu->stats.traced_ns));
  // If the advice speaks, it names the call site.
  for (const Advice& a : run.sink->advice.back()) {
    if (a.id == "host_sync") {
      EXPECT_NE(a.cause.find("aten::item in phase forward"), std::string::npos) << a.cause;
    }
  }
#else
  GTEST_SKIP() << "LibTorch without CUDA";
#endif
}

}  // namespace
}  // namespace torchpilot
