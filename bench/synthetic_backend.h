// The base of the benches' synthetic GPU backends (finish_cost, step_cost): one device of 132 SMs
// and no vendor call; every call does nothing until a bench overrides it with what it feeds the
// GPU monitor.
#pragma once

#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace bench {

class SyntheticGpuBackend : public torchpilot::GpuBackend {
 public:
  torchpilot::GpuDeviceInfo device() const override { return {0, "Synthetic GPU", "SYNTH", 132}; }
  void start() override {}
  bool start_trace() override { return false; }
  void stop_trace() override {}
  void release_trace() override {}
  void flush() override {}
  void drain(torchpilot::GpuEventBatch&) override {}
  void stop() override {}
  void range_push(const char*) override {}
  void range_pop() override {}
};

}  // namespace bench
