// The CUPTI/NVML/NVTX backend's degrade paths on the CPU, through the fakes (tests/fakes/): no
// driver, cuInit failure, no device, no libcupti, permissions, counters busy, MIG, a second CUPTI
// subscriber, samples off the steady clock.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "fakes/gpu_backend_rig.h"
#include "torchpilot/hooks/gpu/cupti_pm_sampling.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace torchpilot {
namespace detail {
namespace {

// --- Device degrade paths ------------------------------------------------------------------------

TEST(GpuBackend, NoLibcudaMeansNoDeviceAndNoOtherLibraryLoaded) {
  Rig rig;
  rig.driver_missing = true;
  auto b = rig.make();
  EXPECT_EQ(b->device().sm_count, 0);
  for (const auto& s : b->status()) {
    EXPECT_FALSE(s.active);
    EXPECT_EQ(s.reason, "no GPU driver (libcuda.so.1 not found)") << s.name;
  }
  EXPECT_EQ(rig.cupti_loads, 0);
  EXPECT_EQ(rig.nvml_loads, 0);
  b->start();
  EXPECT_FALSE(b->start_trace());
  b->flush();
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_TRUE(batch.pm.empty());
  b->range_push("x");
  b->range_pop();
  b->stop();
}

TEST(GpuBackend, CuInitFailureIsTheReason) {
  Rig rig;
  rig.driver->init_result = CUDA_ERROR_NO_DEVICE;
  auto b = rig.make();
  EXPECT_EQ(b->device().sm_count, 0);
  EXPECT_EQ(status_of(*b, "pm_sampling").reason,
            "cuInit failed: CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected");
  EXPECT_EQ(status_of(*b, "nvml").reason, status_of(*b, "pm_sampling").reason);
  EXPECT_EQ(rig.cupti_loads, 0);
}

TEST(GpuBackend, NoDeviceAtTheConfiguredIndex) {
  Rig rig;
  rig.config.device = 2;
  auto b = rig.make();
  EXPECT_EQ(b->device().sm_count, 0);
  EXPECT_EQ(b->device().index, 2);
  const auto s = status_of(*b, "activity");
  EXPECT_FALSE(s.active);
  EXPECT_EQ(s.reason.rfind("no CUDA device 2 (this process sees 1 device", 0), 0u) << s.reason;
}

TEST(GpuBackend, DisabledInTheConfiguration) {
  Rig rig;
  rig.config.enabled = false;
  auto b = rig.make();
  EXPECT_EQ(b->device().sm_count, 0);
  EXPECT_EQ(status_of(*b, "nvtx").reason, "off in the configuration (gpu.enabled: false)");
}

TEST(GpuBackend, CollectorsOffInTheConfiguration) {
  Rig rig;
  rig.config.pm_sampling = false;
  rig.config.activity = false;
  rig.config.nvml = false;
  rig.config.nvtx = false;
  auto b = rig.make();
  EXPECT_EQ(b->device().sm_count, 132);
  EXPECT_EQ(b->device().chip, "GH100");  // the chip name still comes from CUPTI
  EXPECT_EQ(status_of(*b, "pm_sampling").reason,
            "off in the configuration (gpu.pm_sampling: false)");
  EXPECT_EQ(status_of(*b, "activity").reason, "off in the configuration (gpu.activity: false)");
  EXPECT_EQ(status_of(*b, "nvml").reason, "off in the configuration (gpu.nvml: false)");
  EXPECT_EQ(status_of(*b, "nvtx").reason, "off in the configuration (gpu.nvtx: false)");
  EXPECT_EQ(rig.cupti->subscribes, 0);  // no subscriber: PyTorch's profiler stays usable
  EXPECT_EQ(rig.nvml_loads, 0);
  b->start();
  EXPECT_FALSE(b->start_trace());
  b->range_push("x");  // no-op
  b->range_pop();
  b->stop();
  EXPECT_FALSE(rig.cupti->profiler_initialized);
}

// --- CUPTI degrade paths -------------------------------------------------------------------------

TEST(GpuBackend, NvtxRangesOnlyWhileAToolIsAttached) {
  // Without Nsight's injection the ranges would reach CUPTI's (about 1 us each, no reader).
  Rig rig;
  unsetenv("NVTX_INJECTION64_PATH");
  auto b = rig.make();
  const auto nvtx = status_of(*b, "nvtx");
  EXPECT_FALSE(nvtx.active);
  EXPECT_NE(nvtx.reason.find("no NVTX tool attached"), std::string::npos) << nvtx.reason;
  b->range_push("step 0");  // a no-op, safe
  b->range_pop();
}

TEST(GpuBackend, NoLibcuptiLeavesNvmlAndNvtx) {
  Rig rig;
  rig.cupti_missing = true;
  auto b = rig.make();
  EXPECT_EQ(b->device().sm_count, 132);
  EXPECT_EQ(b->device().chip, "");
  EXPECT_EQ(status_of(*b, "pm_sampling").reason, "libcupti not found (test)");
  EXPECT_EQ(status_of(*b, "activity").reason, "libcupti not found (test)");
  EXPECT_TRUE(status_of(*b, "nvml").active);
  EXPECT_TRUE(status_of(*b, "nvtx").active);
  b->start();
  EXPECT_FALSE(b->start_trace());
  GpuEventBatch batch;
  ASSERT_TRUE(eventually([&] {
    b->drain(batch);
    return !batch.nvml.empty();
  }));
  b->stop();
}

TEST(GpuBackend, OldLibcuptiIsRefused) {
  Rig rig;
  rig.cupti->version = 26;  // CUDA 12.8's CUPTI: older record layouts
  auto b = rig.make();
  EXPECT_NE(status_of(*b, "activity").reason.find("has CUPTI API version 26"), std::string::npos);
  EXPECT_FALSE(status_of(*b, "pm_sampling").active);
  EXPECT_EQ(rig.cupti->subscribes, 0);
}

TEST(GpuBackend, InsufficientPrivilegesTurnsOffPmSamplingOnly) {
  Rig rig;
  auto b = rig.make_failing("cuptiPmSamplingGetCounterAvailability",
                            CUPTI_ERROR_INSUFFICIENT_PRIVILEGES);
  const auto pm = status_of(*b, "pm_sampling");
  EXPECT_FALSE(pm.active);
  EXPECT_EQ(pm.reason,
            "no permission for GPU performance counters (needs root, CAP_SYS_ADMIN or "
            "NVreg_RestrictProfilingToAdminUsers=0)");
  EXPECT_TRUE(status_of(*b, "activity").active);
  EXPECT_TRUE(status_of(*b, "nvml").active);
  b->start();
  ASSERT_TRUE(b->start_trace());
  const uint64_t k0 = rig.cupti->cupti_now();
  rig.cupti->produce(kernel_at(k0, k0 + 100));
  b->stop_trace();
  b->flush();
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_EQ(batch.kernels.size(), 1u);
  EXPECT_TRUE(batch.pm.empty());
  b->stop();
  EXPECT_FALSE(rig.cupti->profiler_initialized);
}

TEST(GpuBackend, PrivilegesRefusedAtEnable) {
  Rig rig;
  auto b = rig.make_failing("cuptiPmSamplingEnable", CUPTI_ERROR_INSUFFICIENT_PRIVILEGES);
  EXPECT_EQ(status_of(*b, "pm_sampling").reason.rfind("no permission for GPU performance", 0), 0u);
  EXPECT_EQ(rig.cupti->host_inits, rig.cupti->host_deinits);  // the host object was released
}

TEST(GpuBackend, HardwareBusy) {
  Rig rig;
  auto b = rig.make_failing("cuptiPmSamplingEnable", CUPTI_ERROR_HARDWARE_BUSY);
  EXPECT_EQ(status_of(*b, "pm_sampling").reason,
            "counters held by another client (DCGM or Nsight)");
  EXPECT_TRUE(status_of(*b, "activity").active);
}

TEST(GpuBackend, HardwareBusyAtStart) {
  Rig rig;
  auto b = rig.make_failing("cuptiPmSamplingStart", CUPTI_ERROR_HARDWARE_BUSY);
  EXPECT_TRUE(status_of(*b, "pm_sampling").active);
  b->start();
  EXPECT_EQ(status_of(*b, "pm_sampling").reason,
            "counters held by another client (DCGM or Nsight)");
  EXPECT_TRUE(status_of(*b, "nvml").active);
  b->stop();
  EXPECT_FALSE(rig.cupti->pm_enabled);
}

TEST(GpuBackend, MigInstance) {
  Rig rig;
  auto b = rig.make_failing("cuptiPmSamplingGetCounterAvailability",
                            CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED);
  const auto reason = status_of(*b, "pm_sampling").reason;
  EXPECT_NE(reason.find("MIG"), std::string::npos) << reason;
  Rig rig2;
  auto b2 = rig2.make_failing("cuptiPmSamplingEnable", CUPTI_ERROR_NOT_SUPPORTED);
  EXPECT_NE(status_of(*b2, "pm_sampling").reason.find("MIG"), std::string::npos);
}

TEST(GpuBackend, ComputeCapabilityBelow86HasNoTimeTrigger) {
  Rig rig;
  rig.driver->cc_major = 8;
  rig.driver->cc_minor = 0;  // A100
  auto b = rig.make();
  EXPECT_EQ(status_of(*b, "pm_sampling").reason,
            "PM sampling needs compute capability 8.6 or newer (its GPU-time trigger); this GPU "
            "is 8.0");
  EXPECT_TRUE(status_of(*b, "activity").active);
}

TEST(GpuBackend, SecondSubscriberTurnsOffActivityOnly) {
  Rig rig;
  rig.cupti->subscribe_result = CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  rig.cupti->other_subscriber = "CUPTI for Nsight Systems";
  auto b = rig.make();
  const auto a = status_of(*b, "activity");
  EXPECT_FALSE(a.active);
  EXPECT_EQ(a.reason.rfind("another CUPTI client (Nsight Systems, PyTorch's profiler) is attached: "
                           "activity tracing off",
                           0),
            0u)
      << a.reason;
  EXPECT_NE(a.reason.find("CUPTI for Nsight Systems"), std::string::npos);
  EXPECT_EQ(rig.cupti->requested, nullptr);  // no buffer callbacks registered
  EXPECT_TRUE(status_of(*b, "pm_sampling").active);
  b->start();
  EXPECT_FALSE(b->start_trace());
  EXPECT_TRUE(rig.cupti->enabled_kinds.empty());
  const uint64_t t0 = rig.cupti->cupti_now();
  for (int i = 0; i < 3; ++i) rig.cupti->push_sample(sample(t0 + i, t0 + i + 1, 70));
  GpuEventBatch batch;
  ASSERT_TRUE(flushed_eventually(*b, batch, 2));
  EXPECT_DOUBLE_EQ(batch.pm[0].sm_efficiency, 0.7);
  b->stop();
  EXPECT_EQ(rig.cupti->unsubscribes, 0);
}

// PyTorch's profiler started and stopped inside a run: while it holds CUPTI, windows are skipped
// (one line), and once it lets go they work again.
TEST(GpuBackend, ASecondSubscriberThatLeavesLetsWindowsResume) {
  Rig rig;
  auto b = rig.started();
  auto count = [&](const std::string& text) {
    const std::string l = rig.log_text.str();
    int n = 0;
    for (size_t at = l.find(text); at != std::string::npos; at = l.find(text, at + 1)) ++n;
    return n;
  };
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    rig.cupti->subscribe_result = CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(b->start_trace());
    EXPECT_TRUE(b->trace_busy());
  }
  EXPECT_EQ(count("GPU trace window skipped: another CUPTI client"), 1) << rig.log_text.str();
  EXPECT_FALSE(status_of(*b, "activity").active);
  EXPECT_TRUE(status_of(*b, "pm_sampling").active) << "PM sampling is not the subscription's";
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    rig.cupti->subscribe_result = CUPTI_SUCCESS;
  }
  EXPECT_TRUE(b->start_trace());
  EXPECT_FALSE(b->trace_busy());
  EXPECT_TRUE(status_of(*b, "activity").active) << status_of(*b, "activity").reason;
  EXPECT_EQ(count("GPU trace windows resume"), 1) << rig.log_text.str();
  b->stop_trace();
  b->release_trace();
  b->stop();
}

// Sample times on another clock (what PyTorch's profiler did to CUPTI's timestamps on the H200):
// dropped with one line and PM sampling reported off, until they line up again.
TEST(GpuBackend, SamplesOffTheSteadyClockAreDroppedUntilTheyLineUpAgain) {
  Rig rig;
  auto b = rig.started();
  const uint64_t t0 = rig.cupti->cupti_now();
  const uint64_t away = 240'000'000'000ull;                              // 240 s
  rig.cupti->push_sample(sample(t0 - away, t0 - away + 1'000'000, 10));  // discarded (first)
  for (int i = 0; i < 4; ++i) {
    rig.cupti->push_sample(sample(t0 - away + i * 1'000'000, t0 - away + (i + 1) * 1'000'000, 50));
  }
  GpuEventBatch batch;
  ASSERT_TRUE(eventually([&] {
    b->flush();
    return rig.log_text.str().find("PM sampling: sample times are") != std::string::npos;
  })) << rig.log_text.str();
  b->drain(batch);
  EXPECT_TRUE(batch.pm.empty()) << "a sample 240 s away would land on the wrong steps";
  EXPECT_FALSE(status_of(*b, "pm_sampling").active);
  const uint64_t t1 = rig.cupti->cupti_now();
  for (int i = 0; i < 3; ++i) {
    rig.cupti->push_sample(sample(t1 + i * 1'000'000, t1 + (i + 1) * 1'000'000, 80));
  }
  ASSERT_TRUE(flushed_eventually(*b, batch, 3));
  EXPECT_DOUBLE_EQ(batch.pm.back().sm_efficiency, 0.8);
  EXPECT_TRUE(status_of(*b, "pm_sampling").active) << status_of(*b, "pm_sampling").reason;
  const std::string log = rig.log_text.str();
  EXPECT_EQ(log.find("PM sampling: sample times are"), log.rfind("PM sampling: sample times are"))
      << "one line per period:\n"
      << log;
  EXPECT_NE(log.find("line up with the steps again"), std::string::npos) << log;
  b->stop();
}

TEST(GpuBackend, ActivityEnableFailureIsReported) {
  Rig rig;
  auto b = rig.make_failing("cuptiActivityEnable", CUPTI_ERROR_UNKNOWN);
  EXPECT_TRUE(status_of(*b, "activity").active);
  EXPECT_FALSE(b->start_trace());
  EXPECT_EQ(status_of(*b, "activity").reason,
            "cuptiActivityEnable(CONCURRENT_KERNEL) failed: CUPTI_ERROR_UNKNOWN (999)");
  EXPECT_TRUE(status_of(*b, "pm_sampling").active);
}

}  // namespace
}  // namespace detail
}  // namespace torchpilot
