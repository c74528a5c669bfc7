// Sinks receive what torchpilot records and decides (spdlog-style: a tiny interface).
// Failure behaviour: the Pilot catches anything a sink throws, logs it once and stops calling that
// sink; training goes on. Thread-safety: the Pilot calls sinks from the training thread only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/advice.h"
#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/core/section.h"
#include "torchpilot/runtime/core/tuning.h"

namespace spdlog {
class logger;
}

namespace torchpilot {

class Sink {
 public:
  virtual ~Sink() = default;
  virtual std::string name() const = 0;
  // Each step's record, in order; steps shorter than 5 ms come in batches of up to 32 (sooner at
  // a period's end, on Pilot::flush(), before a late record, and while auto-tune runs).
  virtual void on_step(const StepRecord& /*record*/,
                       const std::vector<std::string>& /*phase_names*/) {}
  virtual void on_epoch(const EpochSummary& /*summary*/, const std::vector<Advice>& /*advice*/) {}
  virtual void on_trial(const TrialResult& /*trial*/, bool /*kept*/) {}
  virtual void on_decision(const TuningDecision& /*decision*/) {}
  // A collector's figures of a step, after the step (late: e.g. GPU samples and trace records
  // arrive asynchronously), always after the step's own on_step. record.get<T>() reads the
  // typed value (GpuStepRecord, ...).
  virtual void on_late_step(const LateStepRecord& /*record*/) {}
  // Whether on_late_step is of use to this sink. A collector builds a step's late record only
  // when some sink or collector wants it (the GPU monitor's, one a step, costs a short-step
  // trainer a microsecond); a sink with no on_late_step says false.
  virtual bool wants_late_steps() const { return true; }
  virtual void flush() {}
};

struct Config;

// A sink a subsystem registers (reports: the advisory log, JSON lines, trace windows, the HTML
// report; hooks/reports: the Prometheus endpoint). Every Pilot not in mode off calls each factory
// once at construction, in `order` (lower first), and adds what it returns (null: its config keys
// leave it off). A factory that throws ConfigError fails the Pilot's construction (a path that
// cannot be opened); anything else it throws is logged and the sink left out.
// Thread-safe; usually called during static initialization of the registering library.
using SinkFactory = std::shared_ptr<Sink> (*)(const Config& config,
                                              const std::shared_ptr<spdlog::logger>& logger);
struct DefaultSink {
  std::string name;
  int order = 0;
  SinkFactory factory = nullptr;
};
void register_default_sink(std::string name, int order, SinkFactory factory);
std::vector<DefaultSink> default_sinks();  // by order
bool default_sink_registered(const std::string& name);

// Keeps copies of everything it receives; for tests and for programs that inspect results.
class RecordingSink : public Sink {
 public:
  std::string name() const override { return "recording"; }
  void on_step(const StepRecord& record, const std::vector<std::string>&) override {
    steps.push_back(record);
  }
  void on_epoch(const EpochSummary& summary, const std::vector<Advice>& a) override {
    epochs.push_back(summary);
    advice.push_back(a);
  }
  void on_trial(const TrialResult& trial, bool kept) override { trials.push_back({trial, kept}); }
  void on_decision(const TuningDecision& decision) override { decisions.push_back(decision); }
  void on_late_step(const LateStepRecord& record) override { late_steps.push_back(record); }
  // The late step records of one kind, e.g. late<GpuStepRecord>().
  template <typename T>
  std::vector<T> late() const {
    std::vector<T> out;
    for (const auto& r : late_steps) {
      if (const T* v = r.get<T>()) out.push_back(*v);
    }
    return out;
  }

  std::vector<StepRecord> steps;
  std::vector<EpochSummary> epochs;
  std::vector<std::vector<Advice>> advice;  // per epoch
  std::vector<std::pair<TrialResult, bool>> trials;
  std::vector<TuningDecision> decisions;
  std::vector<LateStepRecord> late_steps;
};

}  // namespace torchpilot
