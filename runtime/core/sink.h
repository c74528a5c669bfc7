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
  virtual void on_step(const StepRecord& record, const std::vector<std::string>& phase_names) {}
  virtual void on_epoch(const EpochSummary& summary, const std::vector<Advice>& advice) {}
  virtual void on_trial(const TrialResult& trial, bool kept) {}
  virtual void on_decision(const TuningDecision& decision) {}
  // A collector's figures of a step, after the step (late: e.g. GPU samples and trace records
  // arrive asynchronously). record.get<T>() reads the typed value (GpuStepRecord, ...).
  virtual void on_late_step(const LateStepRecord& record) {}
  virtual void flush() {}
};

struct Config;

// A sink a library layer registers (hooks/: the Prometheus endpoint); every Pilot not in mode off
// calls each factory once at construction, which returns null when its config keys leave it off.
// Thread-safe; usually called during static initialization of the registering library.
using SinkFactory = std::shared_ptr<Sink> (*)(const Config& config, spdlog::logger& logger);
void register_default_sink(SinkFactory factory);
std::vector<SinkFactory> default_sinks();

// The advisory log: epoch summaries, advice and tuning decisions as readable lines.
std::shared_ptr<Sink> make_log_sink(std::shared_ptr<spdlog::logger> logger);

// One JSON object per line: a record per step, per epoch, per trial and per decision
// (docs/records.md), appended to `path`. Never blocks opening it: throws ConfigError (key
// log.json_path, the OS's reason) if it cannot be opened for appending, is a directory or
// socket, or is a FIFO with no reader. A FIFO with a reader is written like a file (a reader that
// goes away makes a write fail; no SIGPIPE).
std::shared_ptr<Sink> make_json_lines_sink(const std::string& path);

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

// JSON text of each record kind, as the JSON-lines sink writes them (one line, no newline).
std::string step_json(const StepRecord& record, const std::vector<std::string>& phase_names);
std::string epoch_json(const EpochSummary& summary, const std::vector<Advice>& advice);
std::string trial_json(const TrialResult& trial, bool kept);
std::string decision_json(const TuningDecision& decision);
std::string late_step_json(const LateStepRecord& record);

// Human-readable lines of the advisory log.
std::vector<std::string> format_epoch(const EpochSummary& summary,
                                      const std::vector<Advice>& advice);
std::string format_decision(const TuningDecision& decision);
std::string format_trial(const TrialResult& trial, bool kept);

}  // namespace torchpilot
