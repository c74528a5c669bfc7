// What the FLOP counter's CPU and GPU tests share: a Pilot in mode advise with a FlopCounter on
// it and a recording sink, its configuration, and MathPrecision as an index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "torchpilot/hooks/flops/flop_counter.h"
#include "torchpilot/runtime/core/sink.h"

namespace torchpilot {
namespace test {

constexpr size_t P(MathPrecision p) { return static_cast<size_t>(p); }

inline Config flop_config(int skip, int count, double peak_tflops = 0) {
  Config c;
  c.mode = Mode::kAdvise;
  c.log.level = "warn";
  c.gpu.enabled = false;
  c.flops.skip_steps = skip;
  c.flops.count_steps = count;
  c.flops.peak_tflops = peak_tflops;
  return c;
}

// A Pilot with a FlopCounter, recording into `sink`.
struct Harness {
  std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
  std::unique_ptr<Pilot> pilot;
  std::unique_ptr<FlopCounter> counter;
  explicit Harness(const Config& config) {
    PilotOptions po;
    po.sinks = {sink};
    pilot = std::make_unique<Pilot>(config, po);
    counter = std::make_unique<FlopCounter>(*pilot);
  }
  // One step of `samples` running `body`; returns its record.
  const StepRecord& step(int64_t samples, const std::function<void()>& body) {
    {
      auto s = pilot->step(samples);
      body();
    }
    pilot->flush();  // short steps reach the sinks in batches
    return sink->steps.back();
  }
  const EpochSummary& end_epoch() {
    pilot->end_epoch();
    return sink->epochs.back();
  }
};

}  // namespace test
}  // namespace torchpilot
