// The sync probe (hooks/gpu/torch_sync_probe.cpp) on the CPU build: which steps it probes (the
// steps around each periodic stall once a period is known, and no other) and that host tensors'
// item() and copies are not counted as syncs. Its CUDA counting is checked on the GPU
// (gpu_host_stall_test.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <set>

#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/stalls/step_outliers.h"

namespace {

constexpr torchpilot::Nanos kMs = 1000000;

TEST(SyncProbe, ProbesOnlyTheStepsAroundAKnownPeriodAndCountsNoHostOps) {
  auto clock = std::make_shared<torchpilot::ManualClock>();
  auto sink = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::PilotOptions o;
  o.clock = clock;
  o.sinks = {sink};
  torchpilot::Config c;
  c.log.level = "warn";
  torchpilot::Pilot pilot(c, o);
  constexpr int kPeriod = 20, kSteps = 200;
  const auto host = torch::ones({1024});
  float sink_value = 0;
  for (int i = 0; i < kSteps; ++i) {
    auto s = pilot.step(1);
    // Host ops only: neither is a sync or a device-to-host copy.
    sink_value += host.sum().item<float>();
    auto copy = torch::empty({1024});
    copy.copy_(host);
    clock->advance(i % kPeriod == 7 ? 100 * kMs : 10 * kMs);
  }
  pilot.end_epoch();
  EXPECT_GT(sink_value, 0);

  std::set<int64_t> probed;
  for (const auto& r : sink->steps) {
    if (r.metrics.get("sync", "probed") == 1) {
      probed.insert(r.step);
      EXPECT_EQ(r.metrics.get("sync", "ops"), 0) << "step " << r.step;
      EXPECT_EQ(r.metrics.get("sync", "d2h_mb"), 0) << "step " << r.step;
      EXPECT_GE(r.metrics.get("sync", "ms"), 0) << "step " << r.step;
    } else {
      EXPECT_TRUE(std::isnan(r.metrics.get("sync", "ms"))) << "step " << r.step;
    }
  }
  // Step 7 comes before the tracker judges steps (8 needed): the stalls are 27, 47, 67, ... and
  // the period is known once 67 is added to the tracker, after its boundary (the boundary marks
  // what the tracker knew before the step): 68 is the first record at the period (within one
  // step of it), so the probe covers 69; from then on each stall (20k + 7) and the two steps
  // after it.
  std::set<int64_t> expected = {69};
  for (int64_t p = 87; p < kSteps; p += kPeriod) {
    for (int64_t k = 0; k < 3 && p + k < kSteps; ++k) expected.insert(p + k);
  }
  EXPECT_EQ(probed, expected);
  const auto* out = sink->epochs.back().sections.get<torchpilot::OutlierStats>();
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->period, kPeriod);
  EXPECT_EQ(out->probed, 6);  // 87, 107, ..., 187
  EXPECT_DOUBLE_EQ(out->sync_share, 0.0);
  EXPECT_DOUBLE_EQ(out->d2h_mb_per_stall, 0.0);
}

}  // namespace
