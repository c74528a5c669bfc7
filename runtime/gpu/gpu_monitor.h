// The GPU monitor: turns the GPU backend's events into per-step and per-epoch GPU figures
// (docs/metrics.md, "GPU"). Vendor-free: hooks/ supply the backend, tests a fake one.
//
// Always on: PM-sampling counters and NVML readings, averaged over each step by time overlap, and
// NVTX ranges for steps and phases. Detailed windows (CUPTI activity trace): trace_steps steps
// from gpu.trace_first_step (or once auto-tune is done), again every gpu.trace_every_epochs
// epochs, after a step slower than gpu.trace_anomaly_factor x the median, and on request.
// Step markers (GpuBackend::record_marker) at every step boundary give each step its GPU span,
// which its GPU figures are attributed by (docs/metrics.md, "GPU time of a step"); without them,
// or when they do not resolve within kMarkerWaitNs, the host span. A detailed window's trace is
// stopped only once the GPU ran its last step. A step's figures are published
// (Sink::on_late_step, a GpuStepRecord) once its span is known and samples covering its end
// arrived; the epoch's figures are the summary's "gpu" section (GpuEpochStats) at end_epoch,
// over the steps finished by then: the epoch's end waits for the GPU no longer than
// gpu.epoch_end_wait_ms and a quarter of cost.budget x the epoch's time, and the steps it left
// count in the next epoch (a short epoch must not pay a wait or a PM decode at its end). hooks/
// registers a default collector that makes one over the CUPTI backend for every Pilot; tests add
// one over a fake backend (PilotOptions::collectors).
//
// Thread-safety: training thread only (it is a Collector of the Pilot).
#pragma once

#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"
#include "torchpilot/runtime/gpu/gpu_metrics.h"
#include "torchpilot/runtime/gpu/gpu_step_stats.h"
#include "torchpilot/runtime/gpu/gpu_window_planner.h"

namespace spdlog {
class logger;
}

namespace torchpilot {

struct GpuWindowRecord;

class GpuMonitor : public Collector {
 public:
  // How long (host time after a step's end) its markers may take to resolve before the step is
  // attributed by its host span; also how long a closing window waits for the GPU.
  static constexpr Nanos kMarkerWaitNs = 2000000000;
  // An epoch's end waits at most this long for the GPU to reach its last boundary.
  static constexpr Nanos kEpochEndMarkerWaitNs = 1000000000;
  // What a window's release takes off the training thread (measured 0.1-0.4 s): an epoch's end
  // waits for one still running only when this fits in its allowance (or for the first window).
  static constexpr Nanos kReleaseEstimateNs = 400000000;
  static constexpr Nanos kFinishBudgetNs = 5000000;  // finishing steps, per step call
  // What a window costs the training thread before one has been measured here (its start, stop,
  // slower launches and the steps its release slows), the budget's estimate for the first
  // window: its start and stop, the release's steps, and each traced step slowed by 0.6 of its
  // work. CUPTI's cost grows with the launches and a step's time bounds them: on H200 VMs a 3-step
  // window's traced steps cost 3.5-8 ms on CNN steps of 1.4-2.2 ms and 147-324 ms on steps of
  // 12,000 tiny launches (70-100 ms of work), each within 2x of these figures (the earlier 5 ms +
  // the whole work erred high by up to 3.4x and delayed windows). Its release then slows launches
  // until CUPTI is finalized (~0.4 s): 25-32 ms more on those CNN steps, as much with the steps'
  // excess summed with its sign as with the steps above the median alone. One that costs more
  // than predicted ends early once the budget has no room for its next step. Before a median
  // step time exists, a flat prior.
  static constexpr Nanos kFirstWindowEstimateNs = 50000000;
  static constexpr Nanos kWindowStartStopEstimateNs = 2500000;
  static constexpr Nanos kReleaseSlowdownEstimateNs = 25000000;
  static constexpr double kTracedStepSlowdownPrior = 0.6;
  // Outside windows, steps' GPU figures are collected this often (host time), or once this many
  // steps wait: a collection's fixed part (the backend's locks, 4-6 us on the H200) is paid
  // once for many steps.
  static constexpr Nanos kCollectEveryNs = 100000000;
  static constexpr size_t kCollectMaxPending = 128;
  // How often a collection looks whether PM sampling still runs (its status is a list of
  // strings, ~2 us on the H200), unless the samples lag behind the steps.
  static constexpr Nanos kPmStatusEveryNs = 1000000000;

  // Starts the backend's always-on collectors.
  GpuMonitor(const GpuConfig& config, std::shared_ptr<GpuBackend> backend);
  ~GpuMonitor() override;

  std::string name() const override { return "gpu"; }
  unsigned step_hooks() const override {
    return kHookStepBegin | kHookPhase | kHookStepEnd | kHookStepRecord;
  }
  void attach(CollectorHost* host) override { host_ = host; }
  void on_window_request(int steps) override { request_window(steps); }
  void on_step_begin(int64_t step, Nanos now) override;
  void on_phase_begin(int phase_id, const std::string& phase_name) override;
  void on_phase_end(int phase_id) override;
  void on_step_end(StepRecord& record) override;
  void on_step_record(StepRecord& record) override;
  void on_epoch_end(EpochSummary& summary) override;
  void on_close() override;

  // Opens a detailed window of `steps` steps at the next step boundary (ignored while one runs).
  void request_window(int steps);
  bool tracing() const { return planner_.tracing(); }
  const GpuDeviceInfo& device() const { return device_; }
  std::vector<CollectorStatus> status() const { return backend_->status(); }

 private:
  struct PhaseMarks {
    int id = 0;
    std::string name;
    Interval host;                              // end: max while open
    uint64_t begin_marker = 0, end_marker = 0;  // 0: not recorded
  };
  struct PendingStep {
    int64_t step = 0, epoch = 0;
    Interval span;       // [begin, end] of the step
    Interval data_wait;  // the part the training thread waited for its batch
    bool traced = false;
    Nanos trace_from = 0;  // traced from here (a window's first step starts at its scope)
    // The markers around the step: its own, or those of the run of steps it shares them with
    // (gpu.marker_interval_ms), whose host span is `marked`. 0: not recorded.
    uint64_t begin_marker = 0, end_marker = 0;
    Interval marked;
    bool end_known = true;           // false while the run's end marker is still to come
    std::vector<PhaseMarks> phases;  // traced steps: their phases' markers
    bool phases_complete = true;     // every phase got both its markers
    Nanos own_ns = 0;                // torchpilot's own time in the step
    bool window_first = false;       // the first traced step of a window
    bool anomaly_window = false;     // of an anomaly window (its first step is the point)
    bool ordinary = false;           // GpuEpochStats::ordinary_steps counts it
    int64_t run_steps = 1;           // the steps sharing its markers (known once the run ended)
  };
  // The step's GPU length for GpuEpochStats::ordinary_gpu_steps: its span, or where it shares
  // markers its run's span over the run's steps (host-time shares would copy the host's pattern:
  // steps the host ran ahead in would read short on the GPU too); and its host length taken the
  // same way (ordinary_gpu_host_ns), the one to compare it with.
  struct StepLengths {
    Nanos gpu = 0, host = 0;
  };
  StepLengths step_lengths(const PendingStep& p, const StepSpans& spans) const;
  // A marker's id, 0 when not recorded; optional (a phase's): never the step markers' last events.
  uint64_t record_marker(bool optional = false);
  void drain();
  void name_phases();
  void refresh_pm_status();
  // Stops a closed window's trace once the GPU ran its last step (or waited long enough).
  void maybe_stop_trace(Nanos now, bool force);
  // The step's spans, the GPU span when both markers resolved; false while that is still to
  // come. `timed_out`: they were recorded but did not resolve in time (host span).
  bool gpu_span(const PendingStep& step, Nanos now, bool all, StepSpans& spans, bool& timed_out);
  // all: every pending step now (markers not resolved: host span). pm_flushed: the collectors
  // were just flushed, so PM samples do not hold back a step the GPU has run.
  // Finishes ready steps for up to budget_ns (two at least); all: every pending step, at once.
  void finish_ready_steps(bool all, Nanos now, bool pm_flushed = false,
                          Nanos budget_ns = kFinishBudgetNs);
  Nanos now_ns() const;  // the host's clock
  // publish: its GpuStepRecord is read by someone; capture: windows go to report.trace_dir.
  void finish(const PendingStep& step, const StepSpans& spans, bool publish, bool capture);
  Nanos nvml_interval_ns() const { return static_cast<Nanos>(config_.nvml_interval_ms * 1e6); }
  // Untraced steps whose figures nobody reads one by one (no late record wanted, no trace
  // capture): consecutive ones are taken together, one gpu_step_stats over their joined span,
  // which is what the epoch's time-weighted means add up to where every PM sample measures every
  // counter (a run ends at an NVML reading, so each step keeps the reading it would take alone;
  // an untraced step's host syncs reach no epoch figure). False: `step` must be finished alone.
  bool merge_untraced(const PendingStep& step, const StepSpans& spans);
  void finish_untraced();  // the merged run's figures into the epoch
  struct UntracedRun {
    Interval span;  // the joined spans the figures cover
    bool gpu_timed = false;
    int64_t steps = 0, earlier_steps = 0, gpu_timed_steps = 0;
  };
  UntracedRun untraced_;
  void prune_events();
  // The planner's allow_optional: how many of `steps` the budget has room for now (0: none).
  int allow_window(const char* kind, int steps);
  Nanos window_estimate_ns(int steps) const;
  // A window's cost: its steps' work less the median when it began (summed with the sign,
  // charged as the sum's maximum grows) and torchpilot's time in them, from its start to the
  // step after its release finished (the steps while the release ran included).
  void account_window(const StepRecord& r, bool in_window, bool traced);
  void finish_window_cost();  // the open window is paid for: its cost becomes the latest
  Nanos work_over_median(const StepRecord& r) const;  // a step's work less the median (signed)
  // What a step `over` the median adds to the open window's charge (the growth of its signed
  // sum's maximum).
  Nanos window_charge(Nanos over) const;
  // A detailed window's timeline for the trace files (report.trace_dir): each traced step's
  // records as it finishes; published as a GpuWindowRecord once the window's steps are done.
  void capture_window(const PendingStep& step, const StepSpans& spans);
  void publish_window();

  // What the step boundaries read and write, in two cache lines: a trainer's work evicts
  // torchpilot's data between boundaries, and each line found cold costs the step ~0.1 us.
  // Window state is copied in by refresh_boundary() whenever it may change.
  struct alignas(64) Boundary {
    // The open run of steps between two markers: its begin marker and host time, its first
    // step; open while its end marker is still to be recorded.
    uint64_t run_begin_marker = 0;
    Nanos run_begin_host = 0;
    int64_t run_first_step = 0;
    // The latest marker recorded at a step's end, at host time (0: none since the step began).
    uint64_t boundary_marker = 0;
    Nanos boundary_host = 0;
    int64_t last_step = -1;      // the latest step ended, at host time last_end
    int64_t recorded_step = -1;  // the latest step whose on_step_record ran
    Nanos last_end = 0;
    Nanos marker_interval_ns = 0;  // gpu.marker_interval_ms
    // A step ending at or past these (global, in its epoch) may arm a window: taken at once.
    int64_t arm_step = std::numeric_limits<int64_t>::max();
    int64_t arm_step_in_epoch = std::numeric_limits<int64_t>::max();
    int open_ranges = 0;  // NVTX ranges pushed for the open step and its phases
    bool run_open = false;
    bool nvtx = false;       // gpu.nvtx and an NVTX tool attached
    bool attached = false;   // a trace is attached (a window, its stop or tail)
    bool tracing = false;    // a window is open
    bool armed = false;      // a window opens when the next step begins
    bool take_each = false;  // attached, or a window's release or cost still running
    // The open step's phases get markers of their own (traced steps only), for their GPU spans
    // (docs/metrics.md, "GPU time of a phase"); they go with the step when it ends.
    bool phase_markers = false;
    bool phases_complete = true;
  };
  Boundary b_;
  // Copies the window state the boundaries read into b_.
  void refresh_boundary();

  GpuConfig config_;
  std::shared_ptr<GpuBackend> backend_;
  CollectorHost* host_ = nullptr;  // steps are published to it; no windows while it tunes
  GpuDeviceInfo device_;

  // Events not yet consumed, in arrival order (bounded by pruning once steps are finished); the
  // kernels in start order.
  GpuEventBatch events_;
  // An index over events_.kernels for traced steps' figures, built when first needed after the
  // kernels changed (a window's steps finish one after another over the same kernels).
  std::optional<KernelIndex> kernel_index_;
  const KernelIndex& kernel_index();
  GpuEventBatch incoming_;
  Nanos pm_watermark_ = 0;  // end of the latest PM sample received
  bool pm_active_ = false;
  Nanos pm_status_ns_ = -1;  // host time of the latest look in a collection
  std::deque<PendingStep> pending_;

  // Detailed windows: when they open and close, which steps are traced, when their records are
  // final. The monitor carries out its actions on the backend.
  GpuWindowPlanner planner_{config_};

  // Step markers: resolved times not yet consumed, a closed window's last marker its trace stop
  // waits for.
  uint64_t next_marker_ = 1;
  // Ends the open run with `marker` (0: not recorded) recorded at host time `host_end`.
  void close_run(uint64_t marker, Nanos host_end);
  // ... at the end of step `last_step` (none open: the step alone, from `begin_host`): the note
  // its steps' records will read.
  struct RunNote;
  RunNote& end_run(int64_t last_step, Nanos begin_host, uint64_t marker, Nanos host_end);
  // Its steps already pending; `steps`: how many the run holds.
  void end_pending_run(uint64_t marker, Nanos host_end, int64_t steps);
  // A run of steps that ended (its end marker recorded), for its steps' on_step_record, which
  // may come a batch later (short steps outside windows). A queue: read from runs_head_, emptied
  // (capacity kept) once all are read.
  struct RunNote {
    int64_t first_step = 0, last_step = 0;
    uint64_t begin_marker = 0, end_marker = 0;  // 0: not recorded
    Nanos begin_host = 0, end_host = 0;
    std::vector<PhaseMarks> phases;  // its last step's (a traced step is a run of its own)
    bool phases_complete = true;
    int64_t steps() const { return last_step - first_step + 1; }
  };
  std::vector<RunNote> runs_;
  size_t runs_head_ = 0;
  static constexpr size_t kMaxRunNotes = 4096;  // a host that never calls on_step_record
  RunNote& add_run_note();
  bool release_started_ = false;  // a release was started and may still run
  std::map<uint64_t, Nanos> marker_times_;
  bool stop_pending_ = false;
  uint64_t stop_marker_ = 0;
  Nanos stop_deadline_ = 0;
  Nanos latest_ns_ = 0;           // the latest step end recorded, for the markers' wait bound
  int64_t latest_epoch_ = 0;      // the epoch of the latest step recorded
  Nanos last_flush_ns_ = 0;       // the latest flush on the training thread took this long
  bool traced_finished_ = false;  // a window's step has been reported (the first window is over)
  // After a window whose steps had host syncs, the next kSyncProbeSteps ordinary steps are
  // marked probe_syncs (the sync probe times their item() and copies to the host): a trace slows
  // the host's launches, so a window's steps wait less in their syncs than ordinary ones, and the
  // host-sync advice bounds its gain by that wait. Once per window, from the first step after
  // its trace stopped (its release, off this thread, may still run: a short epoch would end
  // before the window's records are flushed, and its advice would come without the probe).
  static constexpr int kSyncProbeSteps = 8;
  bool sync_probe_armed_ = false;  // the latest window's steps may ask for the probe
  // Host syncs seen in the latest window: its op scopes as drained, and its finished steps' syncs
  // (where op scopes are off, gpu.sync_op_names).
  int64_t window_syncs_ = 0;
  int sync_probe_left_ = 0;                    // steps still to mark
  int64_t probed_from_ = -1, probed_to_ = -1;  // the steps the probe times (their records)
  bool prev_record_at_period_ = false;         // the latest step recorded sat at a period
  bool last_recorded_traced_ = false;          // the latest step recorded was traced
  bool next_window_anomaly_ = false;           // the next window to start is an anomaly window
  bool window_anomaly_ = false;                // the latest window started is an anomaly window
  // A window's first traced step whose own work took more than this times the median of the
  // window's other steps is left out of the window's figures: a trace's start can hold the GPU
  // (on an H200 the first window of some processes ran its first step 3x the others, its item()
  // waits 4-6x the later windows'), and advice from it would promise gains the steps do not have.
  static constexpr double kWindowStartOutlierFactor = 2.0;
  // Whether a window's first step is such an outlier (the window's other steps are pending).
  bool window_start_outlier(const PendingStep& first) const;

  Nanos pruned_before_ = 0;
  Nanos last_finished_end_ = 0;
  // Recent phases on the host clock, to name the phase a host sync began in (bounded).
  struct PhaseSpan {
    int id = 0;
    std::string name;
    Interval span;  // end: max while open
  };
  std::deque<PhaseSpan> phases_;
  // The open step's phases with markers at their boundaries (traced steps only), for their GPU
  // spans (docs/metrics.md, "GPU time of a phase"); they go with the step when it ends.
  std::vector<PhaseMarks> open_phases_;
  // A traced step's phases' GPU spans into the epoch's phase figures.
  void add_phases(const PendingStep& step, const StepSpans& spans);
  // A phase's GPU span inside its step's, when both its markers resolved.
  std::optional<Interval> phase_gpu_span(const PhaseMarks& p, Interval step) const;
  Nanos max_step_call_ns_ = 0;         // the longest step-boundary call this epoch
  Nanos window_cost_ns_ = 0;           // the open window's cost so far
  Nanos window_excess_ns_ = 0;         // its steps' work less the median, summed with the sign
  Nanos window_charged_ns_ = 0;        // of which charged to the budget (its largest sum so far)
  Nanos window_traced_excess_ns_ = 0;  // the same over its traced steps
  Nanos window_median_ns_ = 0;         // the median work when it began, its steps' reference
  int window_cost_steps_ = 0;          // its traced steps
  bool window_costing_ = false;
  Nanos last_window_cost_ns_ = -1;  // the latest finished window's (-1: none yet)
  Nanos last_collect_ns_ = -1;      // host time of the latest drain and step finishing
  int last_window_steps_ = 0;
  Nanos last_window_fixed_ns_ = 0;
  // The optional window the budget held back last, and its estimate.
  const char* denied_kind_ = "first";
  int denied_steps_ = 0;
  Nanos denied_estimate_ns_ = 0;
  // A window's predicted cost (when it was allowed) beside what it cost: in the epoch's figures.
  Nanos window_estimate_pending_ns_ = -1;  // the latest allowed window's estimate (-1: none)
  Nanos window_estimate_ns_ = -1;          // the open window's
  int64_t epoch_windows_predicted_ = 0;    // predicted windows whose cost completed this epoch
  int64_t epoch_windows_cut_ = 0;          // windows ended early for the budget this epoch
  Nanos epoch_window_cost_ns_ = 0, epoch_window_estimate_ns_ = 0;

  std::unique_ptr<GpuWindowRecord> window_;  // the window being captured
  Nanos window_until_ = 0;                   // its records are taken up to here

  // Epoch accumulation.
  struct EpochAcc;
  std::unique_ptr<EpochAcc> epoch_;
};

// A monitor over `backend`, or null when the backend found no device; logs to `logger` why the
// GPU (or each of its collectors) is not observed, and which GPU is.
std::unique_ptr<GpuMonitor> make_gpu_monitor(const GpuConfig& config,
                                             std::shared_ptr<GpuBackend> backend,
                                             spdlog::logger& logger);

}  // namespace torchpilot
