// The CUPTI/NVML/NVTX backend on the CPU: fakes of the CUDA driver, CUPTI and NVML drive it
// through its degrade paths (no driver, cuInit failure, no device, no libcupti, permissions,
// counters busy, MIG, a second CUPTI subscriber, no NVML), PM sampling (sequence, first sample
// discarded, metric fallbacks, clock offset), the activity trace (buffers, conversion, drops), and
// the real dlopen path on this machine.
#include "torchpilot/runtime/gpu/gpu_backend.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "fakes/gpu_backend_rig.h"
#include "torchpilot/hooks/gpu/cupti_activity_internal.h"
#include "torchpilot/hooks/gpu/cupti_pm_sampling.h"

namespace torchpilot {
namespace detail {
namespace {

TEST(GpuBackend, AutoDeviceOutsideAPilotTakesLocalRankWhenVisible) {
  const char* old = std::getenv("LOCAL_RANK");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("LOCAL_RANK", "1", 1);
  {
    Rig rig;
    rig.driver->count = 2;
    auto b = rig.make();  // config.device: -1 (auto)
    EXPECT_EQ(b->device().index, 1);
  }
  {
    Rig rig;  // one device visible (CUDA_VISIBLE_DEVICES per rank): LOCAL_RANK is no index
    auto b = rig.make();
    EXPECT_EQ(b->device().index, 0);
    EXPECT_EQ(b->device().sm_count, 132);
  }
  if (old != nullptr) {
    ::setenv("LOCAL_RANK", saved.c_str(), 1);
  } else {
    ::unsetenv("LOCAL_RANK");
  }
}

// --- CUPTI's clock ------------------------------------------------------------------------------

// PyTorch's profiler registers its own timestamps with CUPTI (TSC ticks), and they stay after it
// stops: the clock's rate is measured along with its offset, and follows a change of clock.
TEST(CuptiClockTest, MeasuresATickClocksRateAndFollowsAChangeOfClock) {
  FakeCupti cupti;
  const auto error_ns = [&](const CuptiClock& clock) {  // the least of three (preemption)
    double least = 1e18;
    for (int i = 0; i < 3; ++i) {
      const Nanos steady = steady_now_ns();
      least = std::min(
          least, std::abs(static_cast<double>(clock.get().to_steady(cupti.cupti_now()) - steady)));
    }
    return least;
  };
  CuptiClock clock;
  ASSERT_TRUE(clock.measure(cupti, nullptr, kClockWaitNs));
  EXPECT_EQ(clock.get().scale, 1.0);  // CUPTI's own clock: nanoseconds
  EXPECT_LT(error_ns(clock), 1e5);
  cupti.clock_rate = 2.1;  // the profiler's timestamps: ticks of a 2.1 GHz host
  cupti.clock_offset_ns = 0;
  ASSERT_TRUE(clock.measure(cupti));  // the training thread does not wait: rate not known yet
  EXPECT_EQ(clock.get().scale, 1.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  ASSERT_TRUE(clock.measure(cupti));  // a second reading of the new clock: its rate
  EXPECT_NEAR(clock.get().scale, 1 / 2.1, 1e-3);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_LT(error_ns(clock), 1e5);
  // A clock on ticks from the start, measured where waiting is allowed: the rate at once.
  CuptiClock fresh;
  ASSERT_TRUE(fresh.measure(cupti, nullptr, kClockWaitNs));
  EXPECT_NEAR(fresh.get().scale, 1 / 2.1, 1e-3);
  EXPECT_LT(error_ns(fresh), 1e5);
  // Back to nanoseconds (the callback gone): found on the next measure that may wait.
  cupti.clock_rate = 1.0;
  cupti.clock_offset_ns = 1'700'000'000'000'000'000;
  ASSERT_TRUE(fresh.measure(cupti, nullptr, kClockWaitNs));
  EXPECT_EQ(fresh.get().scale, 1.0);
  EXPECT_LT(error_ns(fresh), 1e5);
  // CLOCK_REALTIME stepped by 10 ms (NTP): still a nanosecond clock, with the new offset.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  cupti.clock_offset_ns += 10'000'000;
  ASSERT_TRUE(fresh.measure(cupti, nullptr, kClockWaitNs));
  EXPECT_EQ(fresh.get().scale, 1.0);
  EXPECT_LT(error_ns(fresh), 1e5);
}

// A tick clock whose rate changes by more than 1% (another client's timestamps on another
// clock): a new line, with the new rate; within 1% the longer baseline refines the rate.
TEST(CuptiClockTest, ATickRateThatChangesStartsANewLine) {
  FakeCupti cupti;
  cupti.clock_rate = 2.1;
  cupti.clock_offset_ns = 0;
  CuptiClock clock;
  ASSERT_TRUE(clock.measure(cupti, nullptr, kClockWaitNs));
  EXPECT_NEAR(clock.get().scale, 1 / 2.1, 1e-3);
  EXPECT_FALSE(clock.take_tick_clock_note());  // one baseline: not confirmed yet
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(clock.measure(cupti));
  EXPECT_NEAR(clock.get().scale, 1 / 2.1, 1e-4);
  EXPECT_TRUE(clock.take_tick_clock_note());   // a second baseline agreed
  EXPECT_FALSE(clock.take_tick_clock_note());  // once
  cupti.clock_rate = 2.5;
  cupti.clock_offset_ns = -1'000'000'000;
  ASSERT_TRUE(clock.measure(cupti, nullptr, kClockWaitNs));
  EXPECT_NEAR(clock.get().scale, 1 / 2.5, 1e-3);
}

// A backend started after PyTorch's profiler ran: its PM samples, on CUPTI's tick clock, land on
// the steady clock (seen on the H100 with torch 2.11: without the rate, none reached the steps).
TEST(GpuBackend, PmSamplesOnATickClockLandOnTheSteadyClock) {
  Rig rig;
  rig.cupti->clock_rate = 2.1;
  rig.cupti->clock_offset_ns = 0;
  auto b = rig.started();
  const Nanos s0 = steady_now_ns();
  const uint64_t t0 = rig.cupti->cupti_now();
  const auto at = [t0](int i) { return t0 + static_cast<uint64_t>(std::llround(i * 2e6 * 2.1)); };
  for (int i = 0; i < 6; ++i) rig.cupti->push_sample(sample(at(i), at(i + 1), 10.0 * i));
  GpuEventBatch batch;
  ASSERT_TRUE(flushed_eventually(*b, batch, 5));
  EXPECT_NEAR(static_cast<double>(batch.pm[0].begin - s0), 2e6, 1e5);  // sample 1 (0 discarded)
  EXPECT_NEAR(static_cast<double>(batch.pm[0].end - batch.pm[0].begin), 2e6, 2e3);
  EXPECT_NEAR(static_cast<double>(batch.pm[4].end - s0), 12e6, 1e5);
  // Said once the decode thread's next reading confirmed the rate.
  EXPECT_TRUE(logged_eventually(rig, "CUPTI's clock is not in nanoseconds"));
  b->stop();
}

// The clock changes while PM sampling runs (the profiler starts): the decode thread measures the
// new clock, and samples land on the steady clock again.
TEST(GpuBackend, PmSamplesFollowCuptisClockWhenAnotherClientChangesIt) {
  Rig rig;
  auto b = rig.started();
  rig.cupti->clock_rate = 2.1;
  rig.cupti->clock_offset_ns = 0;
  // No flush from this thread: the decode thread alone decodes, and measures the new clock.
  GpuEventBatch batch;
  std::vector<Nanos> pushed;  // each sample's steady start
  bool first = true;
  EXPECT_TRUE(eventually([&] {
    const Nanos s0 = steady_now_ns();
    const uint64_t t0 = rig.cupti->cupti_now();
    if (first) {  // the first sample after the start is discarded
      rig.cupti->push_sample(sample(t0, t0 + 4'200'000, 20.0));
      first = false;
    }
    rig.cupti->push_sample(sample(t0, t0 + 4'200'000, 20.0));
    pushed.push_back(s0);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    batch.clear();
    b->drain(batch);
    for (const PmSample& p : batch.pm) {
      const bool lasts = std::abs(static_cast<double>(p.end - p.begin) - 2e6) < 2e3;
      for (Nanos s : pushed) {
        if (lasts && std::abs(static_cast<double>(p.begin - s)) < 1e5) return true;
      }
    }
    return false;
  })) << rig.log_text.str();
  EXPECT_TRUE(logged_eventually(rig, "CUPTI's clock is not in nanoseconds"));
  b->stop();
}

// --- Happy path --------------------------------------------------------------------------------

TEST(GpuBackend, EverythingWorksWithHealthyFakes) {
  Rig rig;
  auto b = rig.make();
  const GpuDeviceInfo d = b->device();
  EXPECT_EQ(d.name, "NVIDIA H200");
  EXPECT_EQ(d.sm_count, 132);
  EXPECT_EQ(d.chip, "GH100");
  for (const auto& s : b->status()) EXPECT_TRUE(s.active) << s.name << ": " << s.reason;
  ASSERT_EQ(b->status().size(), 4u);
  EXPECT_EQ(rig.nvml->pci_asked, "0000:3B:00.0");  // NVML found by PCI bus id, not by index
  EXPECT_EQ(rig.cupti->subscribes, 1);
  EXPECT_NE(rig.cupti->requested, nullptr);

  // PM sampling follows the documented sequence; interval in ns, GPU-time trigger, 64 MiB.
  EXPECT_EQ(rig.cupti->calls,
            (std::vector<std::string>{"GetCounterAvailability", "GetCounterAvailability",
                                      "HostInitialize", "ConfigAddMetrics", "Enable", "SetConfig",
                                      "GetCounterDataSize"}));
  EXPECT_EQ(rig.cupti->metrics.size(), 7u);
  EXPECT_EQ(rig.cupti->interval_ns, 2'000'000u);
  EXPECT_EQ(rig.cupti->trigger_mode, CUPTI_PM_SAMPLING_TRIGGER_MODE_GPU_TIME_INTERVAL);
  EXPECT_EQ(rig.cupti->hw_buffer_bytes, 64u << 20);

  b->start();
  EXPECT_TRUE(rig.cupti->pm_started);
  // Six samples: the first is discarded; the image holds four, so decoding takes two rounds.
  const uint64_t t0 = rig.cupti->cupti_now();
  for (int i = 0; i < 6; ++i) {
    rig.cupti->push_sample(sample(t0 + i * 2'000'000, t0 + (i + 1) * 2'000'000, 10.0 * i));
  }
  GpuEventBatch batch;
  ASSERT_TRUE(flushed_eventually(*b, batch, 5, 2));
  ASSERT_EQ(batch.pm.size(), 5u);
  EXPECT_DOUBLE_EQ(batch.pm[0].sm_efficiency, 0.10);  // sample 1; sample 0 was discarded
  EXPECT_DOUBLE_EQ(batch.pm[0].counter_utilization, 0.11);
  EXPECT_DOUBLE_EQ(batch.pm[4].sm_efficiency, 0.50);
  EXPECT_DOUBLE_EQ(batch.pm[0].pcie_write_bytes, 2000.0);
  // On the steady clock: CUPTI's offset removed (within the paired-read latency).
  const Nanos steady_t0 = static_cast<Nanos>(t0) - rig.cupti->clock_offset_ns;
  EXPECT_NEAR(static_cast<double>(batch.pm[0].begin - steady_t0), 2e6, 1e5);
  EXPECT_EQ(batch.pm[0].end - batch.pm[0].begin, 2'000'000);
  EXPECT_DOUBLE_EQ(batch.nvml[0].utilization, 0.87);
  EXPECT_DOUBLE_EQ(batch.nvml[0].sm_clock_mhz, 1755.0);
  EXPECT_EQ(batch.nvml[0].clock_limited, 1);  // the power cap holds the clock down
  EXPECT_NEAR(static_cast<double>(batch.nvml[0].time), static_cast<double>(steady_now_ns()), 5e9);

  // A detailed window (the rig logs at debug: CUPTI's overhead records too).
  ASSERT_TRUE(b->start_trace());
  EXPECT_EQ(rig.cupti->enabled_kinds,
            (std::set<int>{CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                           CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
                           CUPTI_ACTIVITY_KIND_OVERHEAD}));
  const uint64_t k0 = rig.cupti->cupti_now();
  rig.cupti->produce(kernel_at(k0 + 1000, k0 + 9000));
  rig.cupti->produce(test::cupti_memcpy(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD,
                                        CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE, 0, 4096, k0 + 10,
                                        k0 + 500));
  b->stop_trace();
  EXPECT_TRUE(rig.cupti->enabled_kinds.empty());
  batch.clear();
  b->drain(batch);
  EXPECT_TRUE(batch.kernels.empty());  // still in CUPTI's buffer until a flush
  b->flush();
  b->drain(batch);
  ASSERT_EQ(batch.kernels.size(), 1u);
  EXPECT_EQ(batch.kernels[0].name, "void my_kernel<4, at::Half>(at::Half*, int)");
  EXPECT_EQ(batch.kernels[0].blocks, 132);
  EXPECT_EQ(batch.kernels[0].end - batch.kernels[0].begin, 8000);
  const Nanos steady_k0 = static_cast<Nanos>(k0) - rig.cupti->clock_offset_ns;
  EXPECT_NEAR(static_cast<double>(batch.kernels[0].begin - steady_k0), 1000, 1e5);
  ASSERT_EQ(batch.copies.size(), 1u);
  EXPECT_TRUE(batch.copies[0].pageable);
  EXPECT_EQ(batch.dropped, 0);

  // A second window works the same.
  ASSERT_TRUE(b->start_trace());
  rig.cupti->produce(kernel_at(k0 + 20000, k0 + 21000));
  b->stop_trace();
  b->flush();
  batch.clear();
  b->drain(batch);
  EXPECT_EQ(batch.kernels.size(), 1u);

  b->range_push("step 1");
  b->range_pop();

  b->stop();
  EXPECT_FALSE(rig.cupti->pm_started);
  EXPECT_FALSE(rig.cupti->pm_enabled);
  EXPECT_EQ(rig.cupti->host_inits, rig.cupti->host_deinits);
  EXPECT_FALSE(rig.cupti->profiler_initialized);
  // Subscribed at construction only to detect another client, then for the windows; stop()
  // unsubscribes and detaches CUPTI (cuptiFinalize) because a window had attached it.
  EXPECT_EQ(rig.cupti->subscribes, 2);
  EXPECT_EQ(rig.cupti->unsubscribes, 2);
  EXPECT_EQ(rig.cupti->finalizes, 1);
  EXPECT_GE(rig.nvml->shutdowns.load(), 1);
  const int reads = rig.nvml->reads.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(rig.nvml->reads.load(), reads);  // the sampler thread is gone
  b->stop();                                 // idempotent
  EXPECT_EQ(rig.cupti->unsubscribes, 2);
  EXPECT_EQ(rig.cupti->finalizes, 1);
  EXPECT_TRUE(rig.cupti->bad_struct_sizes.empty())
      << "structSize wrong in " << rig.cupti->bad_struct_sizes.front();
  // The clock check the lead reads on the GPU machine.
  const std::string log = rig.log();
  EXPECT_NE(log.find("PM sampling clock check (first sample, discarded)"), std::string::npos);
  EXPECT_NE(log.find("CUPTI clock: offset to the steady clock"), std::string::npos);
  EXPECT_EQ(log.find("PM sampling: sample times are"), std::string::npos);
}

TEST(GpuBackend, ReleasingTheTraceDetachesCuptiAndPmSamplingComesBack) {
  Rig rig;
  auto b = rig.started();
  EXPECT_EQ(rig.cupti->subscribes, 1);    // the probe at construction ...
  EXPECT_EQ(rig.cupti->unsubscribes, 1);  // ... released at once: PyTorch's profiler may subscribe
  ASSERT_TRUE(b->start_trace());
  EXPECT_EQ(rig.cupti->subscribes, 2);
  const uint64_t k0 = rig.cupti->cupti_now();
  rig.cupti->produce(kernel_at(k0 + 1000, k0 + 9000));
  b->stop_trace();
  b->release_trace();   // returns at once; the release runs on its own thread
  b->finish_release();  // no CUDA call came: the release finalizes itself
  EXPECT_FALSE(b->trace_releasing());
  // Unsubscribed; a subscription offered cuptiFinalize to the next CUDA call's exit, none came,
  // so it was dropped and CUPTI finalized directly; then a brief subscription re-attaches CUPTI
  // so the profiler API initializes again for PM sampling.
  EXPECT_EQ(rig.cupti->subscribes, 4);
  EXPECT_EQ(rig.cupti->unsubscribes, 4);
  EXPECT_EQ(rig.cupti->finalizes, 1);
  EXPECT_TRUE(rig.cupti->profiler_initialized);
  EXPECT_NE(rig.log().find("CUPTI re-attached for PM sampling after a trace window: ok"),
            std::string::npos);
  EXPECT_TRUE(rig.cupti->pm_started);
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_EQ(batch.kernels.size(), 1u);  // the forced flush of the release delivered it
  for (const auto& st : b->status()) EXPECT_TRUE(st.active) << st.name << ": " << st.reason;
  // The next window attaches again.
  ASSERT_TRUE(b->start_trace());
  EXPECT_EQ(rig.cupti->subscribes, 5);
  b->stop_trace();
  b->release_trace();
  b->finish_release();
  EXPECT_EQ(rig.cupti->finalizes, 2);
  b->stop();
  EXPECT_EQ(rig.cupti->finalizes, 2);  // nothing attached any more
  EXPECT_FALSE(rig.cupti->pm_started);
}

// A window's kinds are enabled with CUPTI's device buffer at gpu.trace_device_buffer_mb; 0 puts
// back the size CUPTI had (the attribute outlives a backend in CUPTI).
TEST(GpuBackend, TheWindowsDeviceBufferIsSetBeforeItsKindsAreEnabled) {
  size_t left_by_first = 0;
  {
    Rig rig;
    rig.config.trace_device_buffer_mb = 64;
    auto b = rig.started();
    ASSERT_TRUE(b->start_trace());
    EXPECT_EQ(rig.cupti->device_buffer_at_enable, size_t{64} << 20);
    left_by_first = rig.cupti->device_buffer;
    b->stop_trace();
    b->stop();
  }
  Rig rig;
  rig.config.trace_device_buffer_mb = 0;
  rig.cupti->device_buffer = left_by_first;
  auto b = rig.started();
  ASSERT_TRUE(b->start_trace());
  EXPECT_EQ(rig.cupti->device_buffer_at_enable, size_t{3200000});
  b->stop_trace();
  b->stop();
}

// The release runs off the training thread and hands cuptiFinalize to the exit of the program's
// next CUDA call (CUPTI's safe point), made here by invoking the subscribed callback as CUPTI
// would.
TEST(GpuBackend, ReleaseFinalizesCuptiAtTheNextCudaCallsExit) {
  Rig rig;
  auto b = rig.started();
  ASSERT_TRUE(b->start_trace());
  const uint64_t k0 = rig.cupti->cupti_now();
  rig.cupti->produce(kernel_at(k0 + 1000, k0 + 9000));
  b->stop_trace();
  b->release_trace();
  // Wait (bounded) for the release thread to offer the finalize to the driver and runtime APIs.
  CUpti_CallbackFunc cb = nullptr;
  void* userdata = nullptr;
  for (int i = 0; i < 5000 && cb == nullptr; ++i) {
    {
      std::lock_guard<std::mutex> lock(rig.cupti->m);
      if (rig.cupti->enabled_domains.size() >= 2) {
        cb = rig.cupti->last_callback;
        userdata = rig.cupti->last_userdata;
      }
    }
    if (cb == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_NE(cb, nullptr) << "the release never subscribed to the CUDA API callbacks";
  EXPECT_EQ(rig.cupti->finalizes, 0);
  CUpti_CallbackData entry{};
  entry.callbackSite = CUPTI_API_ENTER;
  cb(userdata, CUPTI_CB_DOMAIN_RUNTIME_API, 0, &entry);  // an entry is not the safe point
  EXPECT_EQ(rig.cupti->finalizes, 0);
  CUpti_CallbackData exit{};
  exit.callbackSite = CUPTI_API_EXIT;
  cb(userdata, CUPTI_CB_DOMAIN_RUNTIME_API, 0, &exit);
  EXPECT_EQ(rig.cupti->finalizes, 1);
  cb(userdata, CUPTI_CB_DOMAIN_DRIVER_API, 0, &exit);  // a second call finalizes nothing more
  b->finish_release();
  EXPECT_EQ(rig.cupti->finalizes, 1);
  EXPECT_EQ(rig.cupti->unsubscribes, 3) << "finalizing dropped that subscription itself";
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_EQ(batch.kernels.size(), 1u);
  EXPECT_TRUE(rig.cupti->pm_started);
  b->stop();
}

TEST(GpuBackend, AFailedTraceStartDetachesCuptiAgain) {
  Rig rig;
  rig.cupti->fail["cuptiActivityEnable"] = CUPTI_ERROR_NOT_SUPPORTED;
  auto b = rig.started();
  EXPECT_FALSE(b->start_trace());
  // Subscribed for the attempt, then unsubscribed and finalized; PM sampling came back.
  EXPECT_EQ(rig.cupti->subscribes, rig.cupti->unsubscribes);
  EXPECT_EQ(rig.cupti->finalizes, 1);
  EXPECT_TRUE(rig.cupti->pm_started);
  for (const auto& st : b->status()) {
    if (st.name == "activity") EXPECT_FALSE(st.active);
    if (st.name == "pm_sampling") EXPECT_TRUE(st.active) << st.reason;
  }
  b->stop();
  EXPECT_EQ(rig.cupti->finalizes, 1);
}

TEST(GpuBackend, FlushDecodesPendingSamplesSynchronously) {
  Rig rig;
  auto b = rig.started();
  const uint64_t t0 = rig.cupti->cupti_now();
  rig.cupti->push_sample(sample(t0, t0 + 1, 1));  // discarded
  GpuEventBatch batch;
  ASSERT_TRUE(eventually([&] {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    return rig.cupti->hardware.empty();
  }));
  for (int i = 0; i < 3; ++i) rig.cupti->push_sample(sample(t0 + 10 + i, t0 + 11 + i, 20));
  b->flush();  // whatever the decode thread has not taken yet, flush decodes now
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    EXPECT_TRUE(rig.cupti->hardware.empty());
  }
  b->drain(batch);
  EXPECT_EQ(batch.pm.size(), 3u);
  b->stop();
}

TEST(GpuBackend, ImageIsReinitializedOnlyWhenFull) {
  Rig rig;
  auto b = rig.make();
  ASSERT_EQ(rig.cupti->image_inits, 1);  // at configuration
  b->start();
  const uint64_t t0 = rig.cupti->cupti_now();
  GpuEventBatch batch;
  auto decoded = [&](size_t n) {
    return eventually([&] {
      b->flush();
      b->drain(batch);
      return batch.pm.size() >= n;
    });
  };
  rig.cupti->push_sample(sample(t0, t0 + 1, 1));  // discarded
  rig.cupti->push_sample(sample(t0 + 1, t0 + 2, 10));
  ASSERT_TRUE(decoded(1));
  EXPECT_EQ(rig.cupti->image_inits, 1);  // two of four slots used: kept
  rig.cupti->push_sample(sample(t0 + 2, t0 + 3, 20));
  ASSERT_TRUE(decoded(2));
  EXPECT_EQ(rig.cupti->image_inits, 1);
  rig.cupti->push_sample(sample(t0 + 3, t0 + 4, 30));  // fills the image
  ASSERT_TRUE(decoded(3));
  EXPECT_EQ(rig.cupti->image_inits, 2);
  for (int i = 4; i < 11; ++i) rig.cupti->push_sample(sample(t0 + i, t0 + i + 1, 10.0 * i));
  ASSERT_TRUE(decoded(10));
  b->stop();
  b->drain(batch);
  ASSERT_EQ(batch.pm.size(), 10u);  // each sample once, in order
  for (size_t i = 0; i < batch.pm.size(); ++i) {
    EXPECT_DOUBLE_EQ(batch.pm[i].sm_efficiency, 0.1 * static_cast<double>(i + 1)) << i;
  }
}

TEST(GpuBackend, StopDecodesWhatIsLeftAndDrainStillReturnsIt) {
  Rig rig;
  auto b = rig.started();
  const uint64_t t0 = rig.cupti->cupti_now();
  for (int i = 0; i < 3; ++i) rig.cupti->push_sample(sample(t0 + i, t0 + i + 1, 50));
  b->stop();
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_EQ(batch.pm.size(), 2u);  // three minus the discarded first
  const auto& calls = rig.cupti->calls;
  ASSERT_GE(calls.size(), 3u);
  EXPECT_EQ(calls[calls.size() - 3], "Stop");
  EXPECT_EQ(calls[calls.size() - 2], "Disable");
  EXPECT_EQ(calls[calls.size() - 1], "HostDeinitialize");
}

// The copies that get an op scope in a window: those the host may wait in, both ways. A copy
// from pageable memory to the device is one (its op's synchronize follows it: one op call).
TEST(GpuBackend, CopiesToAndFromTheHostGetOpScopes) {
  using activity_internal::copy_gets_op_scope;
  EXPECT_TRUE(copy_gets_op_scope(cudaMemcpyHostToDevice));
  EXPECT_TRUE(copy_gets_op_scope(cudaMemcpyDeviceToHost));
  EXPECT_TRUE(copy_gets_op_scope(cudaMemcpyDefault));
  EXPECT_FALSE(copy_gets_op_scope(cudaMemcpyDeviceToDevice));
  EXPECT_FALSE(copy_gets_op_scope(cudaMemcpyHostToHost));
}

}  // namespace
}  // namespace detail
}  // namespace torchpilot
