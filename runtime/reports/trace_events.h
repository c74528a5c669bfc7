// Chrome trace-event JSON of a detailed window (docs/reports.md, "Perfetto trace"): what the GPU
// monitor kept of the window's steps (GpuWindowRecord, a late record it publishes when
// report.trace_dir is set) written in the format ui.perfetto.dev and chrome://tracing open. Pure;
// the trace sink writes one file per window at the epoch's end, with the epoch's advice.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/advice.h"
#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"
#include "torchpilot/runtime/gpu/gpu_metrics.h"

namespace spdlog {
class logger;
}

namespace torchpilot {

// One step of a window, on the steady clock.
struct WindowStep {
  int64_t step = 0;
  Interval host;       // the training thread's step
  Interval data_wait;  // the part it waited for its batch (empty when none)
  bool gpu_timed = false;
  Interval gpu;  // when the GPU ran it (gpu_timed)
};

// A phase of a window's step on the training thread.
struct WindowPhase {
  std::string name;
  Interval span;
};

// A detailed window's timeline: its steps, phases, the trace records and PM samples inside it.
struct GpuWindowRecord {
  static constexpr const char* kSectionName = "gpu_window";
  static constexpr const char* kRecordType = "gpu_window";
  int64_t epoch = 0;
  std::string device;
  std::vector<WindowStep> steps;
  std::vector<WindowPhase> phases;      // host spans
  std::vector<WindowPhase> gpu_phases;  // GPU spans, from their markers (where resolved)
  std::vector<KernelRecord> kernels;
  std::vector<CopyRecord> copies;
  std::vector<SyncRecord> host_syncs;  // resolved (causes named), never torchpilot's own
  std::vector<PmSample> pm;
  Interval span() const;  // first step's begin to the last's end (GPU spans included)
};

// The JSON-lines record: a count of what the window holds (the timeline goes to the trace file).
std::string section_json(const GpuWindowRecord& w);
inline void section_text(const GpuWindowRecord&, const EpochSummary&, std::vector<std::string>&) {}

// The window as a Chrome trace-event JSON object ({"traceEvents": [...], ...}): steps and phases
// on the training thread's track, data waits and host syncs on their own, kernels per stream,
// copies, the GPU steps with their phases' GPU spans, PM samples as counter tracks, `advice` as
// instant events at the window's end. Complete events ("X") of one track nest (overlaps go to
// another lane of the track).
std::string window_trace_json(const GpuWindowRecord& window, const std::vector<Advice>& advice);

// A new run id for a trace sink: its start in UTC and the process id, "20250314T093000Z-4242";
// a process's second and later sinks (a second Pilot) add "-2", "-3", ...
std::string trace_run_id();

// The window's file name in run `run`: "<run>_window_e<epoch>_s<first>-<last>.json".
std::string window_trace_file_name(const std::string& run, const GpuWindowRecord& window);

// Writes each window's trace into `dir` (created if missing) at its epoch's end, with the
// epoch's advice; windows still open at flush() (the program's exit) are written without it.
// Its files' names carry its run id (trace_run_id): a restarted job never replaces the files of
// an earlier run in the same folder. A run that observes no GPU (no gpu section at the first
// epoch's end) has no windows: `logger`, when given, says so once.
std::shared_ptr<Sink> make_trace_sink(const std::string& dir,
                                      std::shared_ptr<spdlog::logger> logger = nullptr);

}  // namespace torchpilot
