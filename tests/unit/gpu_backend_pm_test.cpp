// The CUPTI backend's PM sampling on the CPU, through the fakes (tests/fakes/): metric fallbacks,
// the duty cycle, pauses and decodes; and NVML (missing, failing, NVLink's peak).
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <string>

#include "fakes/gpu_backend_rig.h"
#include "torchpilot/hooks/gpu/cupti_pm_sampling.h"
#include "torchpilot/hooks/gpu/nvml_sampler.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace torchpilot {
namespace detail {
namespace {

// --- PM metric fallbacks -------------------------------------------------------------------------

TEST(GpuBackend, PcieMetricsRejectedFallsBackToFive) {
  Rig rig;
  rig.cupti->rejected_metrics = {"pcie__read_bytes.sum"};
  auto b = rig.make();
  ASSERT_TRUE(status_of(*b, "pm_sampling").active);
  EXPECT_EQ(rig.cupti->metrics.size(), 5u);
  EXPECT_EQ(rig.cupti->host_inits, 2);
  b->start();
  const uint64_t t0 = rig.cupti->cupti_now();
  for (int i = 0; i < 2; ++i) rig.cupti->push_sample(sample(t0 + i, t0 + i + 1, 33));
  GpuEventBatch batch;
  ASSERT_TRUE(flushed_eventually(*b, batch, 1));
  EXPECT_DOUBLE_EQ(batch.pm[0].tensor_activity, 0.30);
  EXPECT_TRUE(std::isnan(batch.pm[0].pcie_read_bytes));
  b->stop();
  const std::string log = rig.log();
  EXPECT_NE(log.find("PM sampling without pcie__read_bytes.sum, pcie__write_bytes.sum"),
            std::string::npos)
      << log;
}

TEST(GpuBackend, MultiPassSetsFallBackToSmAndGr) {
  Rig rig;
  rig.cupti->max_metrics_per_pass = 2;
  auto b = rig.make();
  ASSERT_TRUE(status_of(*b, "pm_sampling").active);
  EXPECT_EQ(rig.cupti->metrics,
            (std::vector<std::string>{pm_metric_name(PmMetric::kCounterUtilization),
                                      pm_metric_name(PmMetric::kSmEfficiency)}));
  EXPECT_EQ(rig.cupti->host_inits, 3);
  EXPECT_EQ(rig.cupti->host_deinits, 2);
  EXPECT_NE(rig.log().find("the set needs 2 passes"), std::string::npos);
}

TEST(GpuBackend, NoSinglePassSetTurnsPmSamplingOff) {
  Rig rig;
  rig.cupti->rejected_metrics = {pm_metric_name(PmMetric::kSmEfficiency)};
  auto b = rig.make();
  const auto pm = status_of(*b, "pm_sampling");
  EXPECT_FALSE(pm.active);
  EXPECT_EQ(pm.reason.rfind("PM sampling has no single-pass metric set on this GPU", 0), 0u);
  EXPECT_EQ(rig.cupti->host_inits, rig.cupti->host_deinits);
  EXPECT_FALSE(rig.cupti->pm_enabled);
}

// gpu.pm_duty < 1: the sampler is enabled for its share of each period and disabled between
// bursts (enabled, even stopped, it costs the GPU's work); the host config image is made once.
// Each burst's first sample is discarded like the first after any start.
// A started backend sampling in bursts of 100 ms every 200 ms.
std::unique_ptr<GpuBackend> start_in_bursts(Rig& rig) {
  rig.config.pm_duty = 0.5;
  rig.config.pm_duty_period_ms = 200;
  auto b = rig.started();
  return b;
}

bool pm_started(const Rig& rig) {
  std::lock_guard<std::mutex> lock(rig.cupti->m);
  return rig.cupti->pm_started;
}

TEST(GpuBackend, PmDutyCycleDisablesTheSamplerBetweenBursts) {
  Rig rig;
  auto b = start_in_bursts(rig);
  auto count = [&](const std::string& call) {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    return std::count(rig.cupti->calls.begin(), rig.cupti->calls.end(), call);
  };
  ASSERT_TRUE(eventually([&] { return count("Enable") >= 3 && count("Disable") >= 2; }));
  EXPECT_EQ(count("ConfigAddMetrics"), 1);
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    const auto& calls = rig.cupti->calls;
    std::string last;  // of Start and Stop
    for (const auto& c : calls) {
      if (c == "Start" || c == "Stop") last = c;
      if (c == "Disable") EXPECT_EQ(last, "Stop") << "disabled while started";
    }
  }
  ASSERT_TRUE(eventually([&] { return pm_started(rig); }));
  const uint64_t t0 = rig.cupti->cupti_now();
  for (int i = 0; i < 3; ++i) rig.cupti->push_sample(sample(t0 + i, t0 + i + 1, 20));
  GpuEventBatch batch;
  ASSERT_TRUE(eventually([&] {
    b->drain(batch);
    return batch.pm.size() >= 2;
  }));
  EXPECT_EQ(batch.pm.size(), 2u);  // the first of the burst discarded
  // Paused, the backend says the samples up to now are all there; sampling, it does not.
  ASSERT_TRUE(eventually([&] {
    GpuEventBatch paused;
    b->drain(paused);
    return paused.pm_final_until > 0;
  }));
  ASSERT_TRUE(eventually([&] {
    GpuEventBatch sampling;
    b->drain(sampling);
    return sampling.pm_final_until == 0;
  }));
  EXPECT_TRUE(status_of(*b, "pm_sampling").active);
  b->stop();
  EXPECT_FALSE(rig.cupti->pm_enabled);
  EXPECT_FALSE(rig.cupti->pm_started);
}

// A burst that cannot start (another client holds the counters) leaves PM sampling off with the
// reason while it lasts, and it is tried again a period later, not given up.
TEST(GpuBackend, PmSamplingThatCannotResumeAfterAPauseIsTriedAgain) {
  Rig rig;
  auto b = start_in_bursts(rig);
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    rig.cupti->fail["cuptiPmSamplingEnable"] = CUPTI_ERROR_NOT_COMPATIBLE;
  }
  ASSERT_TRUE(eventually([&] { return !status_of(*b, "pm_sampling").active; }));
  EXPECT_EQ(
      status_of(*b, "pm_sampling").reason.rfind("PM sampling could not resume after a pause: ", 0),
      0u)
      << status_of(*b, "pm_sampling").reason;
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    rig.cupti->fail.erase("cuptiPmSamplingEnable");
  }
  ASSERT_TRUE(eventually([&] { return status_of(*b, "pm_sampling").active; }));
  ASSERT_TRUE(eventually([&] { return pm_started(rig); }));
  EXPECT_NE(rig.log().find("PM sampling resumed"), std::string::npos) << rig.log();
  b->stop();
  EXPECT_FALSE(rig.cupti->pm_enabled);
}

// The training thread's drain never waits for a decode in progress (the decode thread holds the
// sampler while CUPTI decodes: 10-30 ms a call on an H100, which stalled every step when drain
// asked the sampler whether it was paused under the same lock).
TEST(GpuBackend, DrainDoesNotWaitForAPmDecodeInProgress) {
  Rig rig;
  auto b = rig.started();
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    rig.cupti->hold_decode = true;
  }
  ASSERT_TRUE(eventually([&] {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    return rig.cupti->decode_held;
  }));
  auto drained = std::async(std::launch::async, [&] {
    GpuEventBatch batch;
    b->drain(batch);
  });
  // Not a speed limit: a drain that waits for the decode never returns until it is let go.
  const bool returned = drained.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    rig.cupti->hold_decode = false;
  }
  rig.cupti->decode_cv.notify_all();
  drained.wait();
  EXPECT_TRUE(returned) << "drain waited for the PM decode";
  b->stop();
}

TEST(GpuBackend, DecodeFailureStopsPmSamplingWithAReason) {
  Rig rig;
  auto b = rig.started();
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    rig.cupti->fail["cuptiPmSamplingDecodeData"] = CUPTI_ERROR_UNKNOWN;
  }
  ASSERT_TRUE(eventually([&] { return !status_of(*b, "pm_sampling").active; }));
  EXPECT_EQ(status_of(*b, "pm_sampling").reason,
            "cuptiPmSamplingDecodeData failed: CUPTI_ERROR_UNKNOWN (999)");
  b->stop();
  EXPECT_FALSE(rig.cupti->pm_enabled);
}

// --- NVML ----------------------------------------------------------------------------------------

TEST(NvlinkPeak, ActiveLinksTimesTheGenerationsRate) {
  FakeNvml nvml;
  NvmlDevice d = reinterpret_cast<NvmlDevice>(&nvml);
  EXPECT_EQ(nvlink_peak(nvml, d, 9).links, 0) << "no NvLinkState entry point: no links";
  nvml.active_links = 18;
  const NvlinkPeak hopper = nvlink_peak(nvml, d, 9);
  EXPECT_EQ(hopper.links, 18);
  EXPECT_DOUBLE_EQ(hopper.bytes_per_s, 450e9);  // H100/H200 SXM: 450 GB/s per direction
  nvml.active_links = 12;
  EXPECT_DOUBLE_EQ(nvlink_peak(nvml, d, 8).bytes_per_s, 300e9);  // A100
  nvml.active_links = 18;
  EXPECT_DOUBLE_EQ(nvlink_peak(nvml, d, 10).bytes_per_s, 900e9);  // Blackwell
  nvml.active_links = 0;
  EXPECT_EQ(nvlink_peak(nvml, d, 9).bytes_per_s, 0.0);  // PCIe only
}

TEST(GpuBackend, NvmlMissing) {
  Rig rig;
  rig.nvml_missing = true;
  auto b = rig.make();
  EXPECT_EQ(status_of(*b, "nvml").reason,
            "NVML not found (libnvidia-ml.so.1): NVML utilization off");
  EXPECT_TRUE(status_of(*b, "pm_sampling").active);
  EXPECT_TRUE(status_of(*b, "activity").active);
  b->start();
  b->stop();
}

TEST(GpuBackend, NvmlReadFailureAtStart) {
  Rig rig;
  rig.nvml->utilization_result = 3;  // NVML_ERROR_NOT_SUPPORTED (MIG, vGPU)
  auto b = rig.make();
  EXPECT_TRUE(status_of(*b, "nvml").active);
  b->start();
  EXPECT_EQ(status_of(*b, "nvml").reason, "nvmlDeviceGetUtilizationRates failed: NVML error 3");
  b->stop();
}

TEST(GpuBackend, NvmlInitFailure) {
  Rig rig;
  rig.nvml->init_result = 9;  // NVML_ERROR_DRIVER_NOT_LOADED
  auto b = rig.make();
  EXPECT_EQ(status_of(*b, "nvml").reason, "nvmlInit failed: NVML error 9");
}

}  // namespace
}  // namespace detail
}  // namespace torchpilot
