// Rig: a Pilot on a manual clock with the GPU monitor over the fake backend (fake_backend.h), a
// recording sink and a log the tests read; step() runs one step of a kernel, sampled.
#pragma once

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>

#include "fake_backend.h"
#include "fakes/pilot_parts.h"
#include "gpu_records.h"
#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"

namespace torchpilot {
namespace test {

struct Rig : PilotParts {
  std::shared_ptr<FakeBackend> backend = std::make_shared<FakeBackend>();
  std::vector<std::shared_ptr<Collector>> after;  // collectors called after the GPU monitor

  explicit Rig(Config c = base_config(), bool start = true) {
    if (start) make(std::move(c));
  }
  ~Rig() { pilot.reset(); }  // before the backend
  static Config base_config() {
    Config c;
    c.gpu.trace_first_step = 1000000;  // windows only where a test asks for them
    c.gpu.trace_anomaly_factor = 0;
    c.cost.budget = 1;  // windows open when due; the budget's own tests set one
    return c;
  }
  // base_config() with a window of `steps` steps from `first_step` (every `every_epochs` epochs).
  static Config window_config(int64_t first_step, int64_t steps, int every_epochs = 0) {
    Config c = base_config();
    c.gpu.trace_first_step = first_step;
    c.gpu.trace_steps = steps;
    c.gpu.trace_every_epochs = every_epochs;
    return c;
  }
  void make(Config c) {
    PilotOptions o = options("gpu-test");
    if (auto m = make_gpu_monitor(c.gpu, backend, *o.logger)) o.collectors.push_back(std::move(m));
    o.collectors.insert(o.collectors.end(), after.begin(), after.end());
    pilot = std::make_unique<Pilot>(std::move(c), std::move(o));
  }
  static constexpr Nanos kMs = 1000000;

  // One step of `ms` ms during which a kernel of `blocks` blocks runs the whole time, sampled.
  void step(Nanos ms, int64_t blocks, double sm) {
    const Nanos b = clock->now_ns();
    auto s = pilot->step(1);
    clock->advance(ms * kMs);
    const Nanos e = clock->now_ns();
    backend->queued.pm.push_back(pm(b, e, sm));
    backend->queued.nvml.push_back({e - 1, 1.0});
    if (backend->tracing) backend->queued.kernels.push_back(kernel(b, e, blocks, "spin_kernel"));
  }
};

}  // namespace test
}  // namespace torchpilot
