// Step observers: things that measure steps alongside the Pilot (the GPU monitor, the FLOP
// counter). The Pilot calls them on the training thread, in the order they were added.
// Failure behaviour: the Pilot catches what an observer throws, logs it once and drops the
// observer; training goes on.
#pragma once

#include <cstdint>
#include <string>

#include "torchpilot/runtime/clock.h"
#include "torchpilot/runtime/records.h"

namespace torchpilot {

class Pilot;

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual std::string name() const = 0;
  // A step scope opened at `now` (step numbers from 0).
  virtual void on_step_begin(int64_t step, Nanos now) {}
  virtual void on_phase_begin(int phase_id, const std::string& phase_name) {}
  virtual void on_phase_end(int phase_id) {}
  // The step ended; the observer may fill its fields of the record before sinks see it.
  virtual void on_step_end(StepRecord& record) {}
  // The epoch ended; the observer fills its section of the summary before advisors run.
  virtual void on_epoch_end(EpochSummary& summary) {}
  // The Pilot is being destroyed or the observer removed: stop using the Pilot.
  virtual void forget_pilot() {}
};

}  // namespace torchpilot
