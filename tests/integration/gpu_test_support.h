// What the GPU tests share: a GPU config with a detailed window where the test wants it, and a
// Pilot with a recording sink.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>

#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"

namespace torchpilot::testing_support {

// Advise mode; a window of `trace_steps` steps armed after step `trace_first_step`; no anomaly
// windows; PM samples every 2 ms, always (a test's epochs are shorter than gpu.pm_duty's
// period); no cost budget (a test's short run would defer its window).
inline Config gpu_config(int trace_first_step, int trace_steps) {
  Config c;
  c.mode = Mode::kAdvise;
  c.cost.budget = 1;
  c.gpu.trace_first_step = trace_first_step;
  c.gpu.trace_steps = trace_steps;
  c.gpu.trace_anomaly_factor = 0;
  c.gpu.pm_interval_ms = 2;
  c.gpu.pm_duty = 1;
  return c;
}

struct PilotRun {
  std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
  std::unique_ptr<Pilot> pilot;
  explicit PilotRun(Config c) {
    PilotOptions o;
    o.sinks = {sink};
    pilot = std::make_unique<Pilot>(std::move(c), o);
  }
  bool collector_active(const std::string& name) const {
    if (pilot->collector<GpuMonitor>() == nullptr) return false;
    for (const auto& s : pilot->collector<GpuMonitor>()->status()) {
      if (s.name == name) return s.active;
    }
    return false;
  }
  const EpochSummary& epoch() const { return sink->epochs.back(); }
  // Why a collector the test needs is off ("" when all run).
  std::string missing(std::initializer_list<const char*> collectors) const {
    for (const char* name : collectors) {
      if (collector_active(name)) continue;
      for (const auto& s : pilot->collector<GpuMonitor>()->status()) {
        if (s.name == name) return std::string(name) + " unavailable: " + s.reason;
      }
      return std::string(name) + " unavailable";
    }
    return {};
  }
};

// In a test body: fails without a GPU monitor (a GPU is present), skips the test with the reason
// when a collector it needs is off (e.g. no counter permission).
#define TORCHPILOT_REQUIRE_COLLECTORS(run, ...)                            \
  do {                                                                     \
    ASSERT_NE((run).pilot->collector<::torchpilot::GpuMonitor>(), nullptr) \
        << "a GPU is present but the GPU monitor is off";                  \
    const std::string tp_missing_ = (run).missing({__VA_ARGS__});          \
    if (!tp_missing_.empty()) GTEST_SKIP() << tp_missing_;                 \
  } while (0)

}  // namespace torchpilot::testing_support
