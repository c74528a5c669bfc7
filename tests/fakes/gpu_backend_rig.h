// Rig: the fakes of the CUDA driver, CUPTI and NVML handed to the CUPTI backend through its
// loaders, with a logger the tests read; and the helpers the GPU backend's tests share.
#pragma once

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "cupti_records.h"
#include "fake_cuda_driver.h"
#include "fake_cupti.h"
#include "fake_nvml.h"
#include "torchpilot/hooks/gpu/cupti_backend.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace torchpilot {
namespace detail {

// --- Rig: fakes handed to the backend through its loaders ---------------------------------------

struct Rig {
  std::unique_ptr<FakeDriver> driver_owned = std::make_unique<FakeDriver>();
  std::unique_ptr<FakeCupti> cupti_owned = std::make_unique<FakeCupti>();
  std::unique_ptr<FakeNvml> nvml_owned = std::make_unique<FakeNvml>();
  FakeDriver* driver = driver_owned.get();
  FakeCupti* cupti = cupti_owned.get();
  FakeNvml* nvml = nvml_owned.get();
  bool driver_missing = false, cupti_missing = false, nvml_missing = false;
  int cupti_loads = 0, nvml_loads = 0;

  std::ostringstream log_text;
  std::shared_ptr<spdlog::logger> logger;
  GpuConfig config;
  Rig() {
    // Healthy fakes: an NVTX tool listens (as under Nsight Systems), so NVTX ranges are on.
    setenv("NVTX_INJECTION64_PATH", "libToolsInjection64.so", 1);
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log_text);
    logger = std::make_shared<spdlog::logger>("gpu_backend_test", sink);
    logger->set_level(spdlog::level::debug);
    config.pm_interval_ms = 2;
    config.pm_duty = 1;  // tests of the duty cycle set it; the others sample throughout
    config.nvml_interval_ms = 2;
  }

  GpuVendorLoaders loaders() {
    GpuVendorLoaders l;
    l.driver = [this](std::string* error) -> std::unique_ptr<CudaDriverApi> {
      if (driver_missing) {
        *error = "no GPU driver (libcuda.so.1 not found)";
        return nullptr;
      }
      return std::move(driver_owned);
    };
    l.cupti = [this](std::string* error) -> std::unique_ptr<CuptiApi> {
      ++cupti_loads;
      if (cupti_missing) {
        *error = "libcupti not found (test)";
        return nullptr;
      }
      return std::move(cupti_owned);
    };
    l.nvml = [this](std::string* error) -> std::unique_ptr<NvmlApi> {
      ++nvml_loads;
      if (nvml_missing) {
        *error = "NVML not found (libnvidia-ml.so.1): NVML utilization off";
        return nullptr;
      }
      return std::move(nvml_owned);
    };
    return l;
  }

  std::unique_ptr<GpuBackend> make() { return make_cupti_backend(config, *logger, loaders()); }
  // A backend made with CUPTI's `call` failing with `result`.
  std::unique_ptr<GpuBackend> make_failing(const std::string& call, CUptiResult result) {
    cupti->fail[call] = result;
    return make();
  }
  // A backend made and started.
  std::unique_ptr<GpuBackend> started() {
    auto b = make();
    b->start();
    return b;
  }
  std::string log() {
    logger->flush();
    return log_text.str();
  }
};

inline CollectorStatus status_of(const GpuBackend& b, const std::string& name) {
  for (const auto& s : b.status()) {
    if (s.name == name) return s;
  }
  ADD_FAILURE() << "no status entry " << name;
  return {};
}

// Polls until `pred` holds (at most 3 s).
template <class Pred>
bool eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

// Flushes `b` and drains it into `batch` until `batch` holds `pm` PM samples and `nvml` NVML
// ones or more, within eventually()'s time.
inline bool flushed_eventually(GpuBackend& b, GpuEventBatch& batch, size_t pm, size_t nvml = 0) {
  return eventually([&] {
    b.flush();
    b.drain(batch);
    return batch.pm.size() >= pm && batch.nvml.size() >= nvml;
  });
}

// Whether `text` shows in the rig's log within eventually()'s time (a collector thread logs it).
inline bool logged_eventually(Rig& rig, const std::string& text) {
  return eventually([&] { return rig.log_text.str().find(text) != std::string::npos; });
}

inline const char* const kKernelName = "_Z9my_kernelILi4EN2at4HalfEEvPT0_i";

// A kernel of 132 blocks of 256 threads.
inline CUpti_ActivityKernel10 kernel_at(uint64_t start, uint64_t end,
                                        const char* name = kKernelName) {
  return test::cupti_kernel(start, end, name, 132, 256);
}

inline FakeSample sample(uint64_t start, uint64_t end, double sm_pct) {
  FakeSample s;
  s.start = start;
  s.end = end;
  s.values = {{pm_metric_name(PmMetric::kCounterUtilization), sm_pct + 1},
              {pm_metric_name(PmMetric::kSmEfficiency), sm_pct},
              {pm_metric_name(PmMetric::kTensorActivity), 30.0},
              {pm_metric_name(PmMetric::kDramThroughput), 60.0},
              {pm_metric_name(PmMetric::kAchievedOccupancy), 40.0},
              {pm_metric_name(PmMetric::kPcieReadBytes), 1000.0},
              {pm_metric_name(PmMetric::kPcieWriteBytes), 2000.0}};
  return s;
}

}  // namespace detail
}  // namespace torchpilot
