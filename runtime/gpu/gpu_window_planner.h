// When the GPU monitor's detailed windows (CUPTI activity trace for a few steps) open and close
// (docs/metrics.md, "GPU"). Pure scheduling, no I/O: the monitor reports step boundaries, epoch
// ends, requests and how a trace start went, and carries out the actions returned.
//
// A window opens when the step after the one that armed it begins (one armed at an epoch's last
// step opens in the next epoch): first at gpu.trace_first_step or once auto-tune's warm-up is done,
// again every gpu.trace_every_epochs epochs at the same step in the epoch, on request, and after
// a step slower than gpu.trace_anomaly_factor x the median of recent untraced steps (once per
// epoch). A window closes after its steps or with its epoch. The trace is stopped once the GPU has
// run the window's last step (the monitor waits for that step's end marker and reports
// trace_stopped(); without markers at once); the steps' records are final after a tail of
// kTailSteps step ends from there, then the trace is released (its forced flush collects them:
// the monitor does not act on `flush`, which says the step is in the tail).
//
// Thread-safety: not thread-safe; the monitor calls it from the training thread only.
// Failure behaviour: nothing throws; a failed trace start (trace_started(false)) or disable()
// turns windows off for good.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/core/config.h"

namespace torchpilot {

// What a step carries besides its span: the parts of it with a known cause.
struct WindowStepFacts {
  Nanos data_wait_ns = 0;  // waiting for its batch
  Nanos own_ns = 0;        // torchpilot's own calls
  bool at_period = false;  // at a recurring stall's known period
  bool releasing = false;  // a window's release runs off the training thread (it slows steps)
};

class GpuWindowPlanner {
 public:
  static constexpr int kTailSteps = 2;  // flushes for a window's records: at the stop, then at
                                        // step ends
  static constexpr size_t kAnomalyHistory = 64;      // step times the anomaly median is over
  static constexpr size_t kMedianRefreshSteps = 16;  // ... recomputed every this many steps

  static constexpr int64_t kEdgeSteps = 2;      // an epoch's first steps never trigger an anomaly
  static constexpr int kAnomalySteps = 2;       // slow steps in a row that make an anomaly
  static constexpr size_t kMinMedianSteps = 8;  // a median for window costs from this many steps
  // An optional window the budget has no room for traces fewer steps, never fewer than this
  // (one step's launch gaps and syncs can be its batch's, not the trainer's).
  static constexpr int kMinWindowSteps = 3;

  using StepFacts = WindowStepFacts;
  // Optional windows ("first", "repeat", "anomaly") ask this first: how many of `steps` the
  // budget has room for (0: none now; the window waits). Null: all of them.
  std::function<int(const char* kind, int steps)> allow_optional;

  // What to do at a step's end, in this order: stop the trace, flush, release.
  struct StepEndActions {
    bool traced = false;      // the step ran inside a window ...
    Nanos trace_from = 0;     // ... and is traced from here (a window's first: its scope's start)
    bool stop_trace = false;  // the window closed with this step: once the GPU ran it, stop the
                              // trace, flush, and report trace_stopped()
    bool flush = false;       // a closed window's tail: flush for its last records
    bool release = false;     // the tail is over (after the flush): release the trace
    bool anomaly = false;     // an anomaly armed a window (anomaly_reason() says why)
    bool deferred = false;    // an optional window was deferred or skipped for the budget
  };
  // What to do at an epoch's end: stop the trace, (always) flush, release.
  struct EpochEndActions {
    bool stop_trace = false;  // a window does not run across epochs (nor a pending stop)
    bool release = false;     // the closed window's records are final after the flush
  };

  // Without config.activity no window ever opens.
  explicit GpuWindowPlanner(const GpuConfig& config);

  // The activity trace is not available (the backend said so at start-up): no windows.
  void disable() { trace_failed_ = true; }

  // A step begins at `now`. Returns the steps of a window to open now (0: none); the monitor
  // then starts the trace and reports the outcome with trace_started().
  int begin_step(Nanos now);
  // The outcome of the start begin_step() asked for; a failure disables windows, unless
  // `retry_later` (another client holds the trace for now): then only this window is skipped.
  void trace_started(bool ok, bool retry_later = false);

  // A step [begin, end] ended; `warmup_done`: auto-tune is over (no window inside its trials).
  StepEndActions end_step(int64_t step, int64_t step_in_epoch, Nanos begin, Nanos end,
                          bool warmup_done, const StepFacts& facts = {});
  // From which step (global, and in its epoch) end_step() would arm a window at once: one asked
  // for (from any step), the first at its step, a repeat at its step in the epoch (not one
  // already waiting for the budget, nor an anomaly); numeric_limits max: none. The monitor has
  // those steps' records taken at their end, so the window opens with the next step; other
  // steps' end_step may come a batch later.
  void arm_steps(int64_t* step, int64_t* step_in_epoch) const;
  // A window opens when the next step begins (begin_step() has something to do).
  bool armed() const { return armed_steps_ > 0; }
  // Why the latest anomaly armed a window, in words.
  const std::string& anomaly_reason() const { return anomaly_reason_; }
  // The median work of recent untraced steps (0 before kMinMedianSteps): a window's slowdown is
  // its steps' work above it.
  Nanos median_work() const { return recent_median_ns_; }
  EpochEndActions end_epoch();
  // The monitor stopped the trace of the window that end_step() closed, and flushed: the rest of
  // the tail (kTailSteps - 1 step ends) starts.
  void trace_stopped();
  // A closed window waits for the GPU to run its last step before the trace is stopped.
  bool stopping() const { return stopping_; }

  // A window of `steps` steps at the next step boundary (ignored while one runs).
  void request_window(int steps);
  // The open window ends with the step ending now (called before end_step): it costs more than
  // the budget has room for.
  void end_window_early() {
    if (window_left_ > 1) window_left_ = 1;
  }

  // The next window as the epoch summary states it (GpuEpochStats::next_window): "off",
  // "deferred", "planned" (from `step` on: -1 when it waits for a repeat's epoch), or "done".
  const char* next_window(int64_t* step) const;

  bool tracing() const { return window_left_ > 0; }
  // The trace is started and not yet released (a window or its tail runs).
  bool trace_attached() const { return window_left_ > 0 || stopping_ || tail_ > 0; }
  // A traced step ending at `step_end` has all its records (its window's tail is over).
  bool records_final(Nanos step_end) const {
    return !stopping_ && tail_ == 0 && cutoff_ >= step_end;
  }

 private:
  void arm(int steps);
  int allowed_steps(const char* kind) const;  // allow_optional's answer, within trace_steps
  void close_window(Nanos cutoff);
  void note_step_time(Nanos ns);

  GpuConfig config_;
  int window_left_ = 0;     // steps left in the open window
  int armed_steps_ = 0;     // a window opens when the next step begins (not at an epoch's end)
  int starting_steps_ = 0;  // asked for by begin_step(), waiting for trace_started()
  Nanos starting_at_ = 0;
  Nanos trace_from_ = 0;
  bool window_first_step_ = false;  // the open step is a window's first
  int requested_window_ = 0;
  bool first_window_done_ = false;
  int64_t epochs_since_window_ = 0;
  int64_t window_step_in_epoch_ = -1;  // where the first window started, for repeats
  bool anomaly_window_used_ = false;   // one anomaly window per epoch
  int anomaly_quiet_steps_ = 0;        // steps after a release that neither trigger nor count
  std::vector<Nanos> recent_step_ns_;  // steps' work, for the anomaly trigger (bounded ring)
  size_t recent_next_ = 0;
  Nanos recent_median_ns_ = 0;  // of recent_step_ns_, refreshed every few steps
  int slow_run_ = 0;            // unexplained slow steps in a row
  Nanos slow_first_ns_ = 0;     // the run's first step's work
  std::string anomaly_reason_;
  bool repeat_deferred_ = false;  // the due repeat was deferred (counted once)
  bool first_deferred_ = false;   // the first window was deferred (counted once)
  bool trace_failed_ = false;
  bool stopping_ = false;  // closed, the trace not stopped yet (the GPU runs behind)
  int tail_ = 0;           // step ends left before the closed window's steps are final
  Nanos cutoff_ = -1;      // traced steps ending at or before this are final after the tail
  Nanos last_end_ = 0;     // of the latest step, to close a window at its epoch's end
};

}  // namespace torchpilot
