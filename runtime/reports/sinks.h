// The reports subsystem's sinks and record formats: the advisory log, JSON lines (docs/records.md),
// and the text and JSON of each record kind. Every Pilot makes them from its config
// (registration.cpp); programs and tools call them directly.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/tune/answered.h"

namespace torchpilot {

// The advisory log: epoch summaries, advice and tuning decisions as readable lines.
std::shared_ptr<Sink> make_log_sink(std::shared_ptr<spdlog::logger> logger);

// One JSON object per line: a record per step, per epoch, per trial and per decision
// (docs/records.md), appended to `path`. Never blocks opening it: throws ConfigError (key
// log.json_path, the OS's reason) if it cannot be opened for appending, is a directory or
// socket, or is a FIFO with no reader. A FIFO with a reader is written like a file (a reader that
// goes away makes a write fail; no SIGPIPE).
std::shared_ptr<Sink> make_json_lines_sink(const std::string& path);

// JSON text of each record kind, as the JSON-lines sink writes them (one line, no newline).
std::string step_json(const StepRecord& record, const std::vector<std::string>& phase_names);
std::string epoch_json(const EpochSummary& summary, const std::vector<Advice>& advice);
std::string trial_json(const TrialResult& trial, bool kept);
std::string decision_json(const TuningDecision& decision);
// With the earlier epochs' advice the decision answered (field "answered").
std::string decision_json(const TuningDecision& decision,
                          const std::vector<AnsweredAdvice::Answer>& answered);
std::string late_step_json(const LateStepRecord& record);

// Human-readable lines of the advisory log.
std::vector<std::string> format_epoch(const EpochSummary& summary,
                                      const std::vector<Advice>& advice);
std::string format_decision(const TuningDecision& decision);
// The log line of an earlier advice a decision answered.
std::string format_answered(const AnsweredAdvice::Answer& answered);
std::string format_trial(const TrialResult& trial, bool kept);

}  // namespace torchpilot
