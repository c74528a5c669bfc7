#include "torchpilot/runtime/gpu/gpu_monitor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "gpu_monitor_internal.h"
#include "torchpilot/runtime/core/guard.h"
#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/gpu/gpu_epoch_accumulator.h"
#include "torchpilot/runtime/gpu/gpu_metrics.h"
#include "torchpilot/runtime/gpu/host_op_scopes.h"
#include "torchpilot/runtime/reports/trace_events.h"

namespace torchpilot {
using namespace gpu_monitor_detail;

namespace {

Nanos steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// --- GpuMonitor ------------------------------------------------------------------------------

GpuMonitor::GpuMonitor(const GpuConfig& config, std::shared_ptr<GpuBackend> backend)
    : config_(config),
      backend_(std::move(backend)),
      device_(backend_->device()),
      epoch_(std::make_unique<EpochAcc>()) {
  backend_->start();
  planner_.allow_optional = [this](const char* kind, int steps) {
    return allow_window(kind, steps);
  };
  b_.nvtx = config_.nvtx;
  b_.marker_interval_ns = static_cast<Nanos>(config_.marker_interval_ms * 1e6);
  for (const auto& s : backend_->status()) {
    if (s.name == kPmSamplingCollector) pm_active_ = s.active;
    if (s.name == kActivityCollector && !s.active && !backend_->trace_busy()) planner_.disable();
    // Without an NVTX tool (set at the process's start) the ranges go nowhere: not even called.
    if (s.name == kNvtxCollector && !s.active) b_.nvtx = false;
  }
  refresh_boundary();
}

GpuMonitor::~GpuMonitor() {
  // A destructor must not throw (that would terminate the program): the backend is vendor code.
  (void)failure_of([&] {
    if (planner_.tracing()) HostOpScopes::instance().enable(false);
  });
  (void)failure_of([&] {
    if (planner_.tracing() || stop_pending_) backend_->stop_trace();
    if (planner_.trace_attached()) backend_->release_trace();
  });
  (void)failure_of([&] { backend_->stop(); });
}

uint64_t GpuMonitor::record_marker(bool optional) {
  if (!config_.step_markers) return 0;
  const uint64_t id = next_marker_++;
  return (optional ? backend_->record_optional_marker(id) : backend_->record_marker(id)) ? id : 0;
}

namespace {
// How long the monitor holds the training thread at a step boundary (its own cost, and a window's
// start and end stalls): the longest per epoch is reported.
class CallTimer {
 public:
  explicit CallTimer(Nanos& max_ns) : max_ns_(max_ns), t0_(std::chrono::steady_clock::now()) {}
  ~CallTimer() {
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
            .count();
    max_ns_ = std::max<Nanos>(max_ns_, ns);
  }

 private:
  Nanos& max_ns_;
  std::chrono::steady_clock::time_point t0_;
};
}  // namespace

void GpuMonitor::on_step_begin(int64_t step, Nanos now) {
  Boundary& b = b_;
  // Timed only where it can hold the thread (a window's start): two clock reads a step saved.
  std::optional<CallTimer> timer;
  // An armed window starts once every step before it was recorded (a batch taken mid-step can
  // arm one while the previous step still waits): it traces from a step boundary on.
  // Nor while the previous window's release runs (0.01-0.4 s off this thread, longer than a
  // short epoch): the trace's start would wait for it here, traced as the GPU's idle.
  const int window_steps = b.armed && b.recorded_step == b.last_step &&
                                   !(release_started_ && backend_->trace_releasing())
                               ? planner_.begin_step(now)
                               : 0;
  // A window's steps get markers of their own: a run of steps still open ends here, before the
  // trace starts (at the previous step's end: nothing of this step is queued yet).
  if (window_steps > 0 && b.run_open) close_run(record_marker(), b.last_end);
  if (!b.run_open) {
    // Within an epoch a run of steps starts where the previous one ended (its record's span does
    // too), and so does its GPU span: the previous run's end marker. An epoch's first step
    // records its own.
    b.run_open = true;
    b.run_first_step = step;
    if (b.boundary_marker != 0) {
      b.run_begin_marker = b.boundary_marker;
      b.run_begin_host = b.boundary_host;
    } else {
      b.run_begin_marker = record_marker();
      b.run_begin_host = now;
    }
  }
  b.boundary_marker = 0;
  if (window_steps > 0) {
    timer.emplace(max_step_call_ns_);
    // The window starting is the anomaly's, if one armed it; one that fails to start takes the
    // mark with it.
    window_anomaly_ = next_window_anomaly_;
    next_window_anomaly_ = false;
    const bool ok = backend_->start_trace();
    planner_.trace_started(ok, !ok && backend_->trace_busy());
    if (ok) {
      sync_probe_armed_ = true;
      window_syncs_ = 0;
      sync_probe_left_ = 0;
      // A step marked before the window began would have the probe time this traced step.
      probed_to_ = std::min(probed_to_, step - 1);
    }
    // The op-scope hook names the window's host syncs (it costs every op a callback: windows only).
    if (ok && config_.sync_op_names) HostOpScopes::instance().enable(true);
    refresh_boundary();
  }
  // Markers at phase boundaries cost two events a phase: in traced steps only, where they are
  // small beside the trace (the GPU time by phase needs the window's kernels anyway).
  b.phase_markers = b.tracing && b.run_begin_marker != 0;
  b.phases_complete = true;
  if (!b.nvtx) return;
  char name[32] = "step ";  // to_chars: no locale, no format parsing (every step)
  *std::to_chars(name + 5, name + sizeof name - 1, step).ptr = '\0';
  backend_->range_push(name);
  ++b.open_ranges;
}

void GpuMonitor::on_phase_begin(int phase_id, const std::string& phase_name) {
  Boundary& b = b_;
  // Phase spans only name a window's host syncs: kept while a trace is attached, not every step.
  if (host_ != nullptr && b.attached) {
    phases_.push_back(
        {phase_id, phase_name, {host_->clock().now_ns(), std::numeric_limits<Nanos>::max()}});
    if (phases_.size() > kMaxPhaseSpans) phases_.pop_front();
  }
  if (b.phase_markers && host_ != nullptr) {
    if (open_phases_.size() >= kMaxStepPhases) {
      // More phases than markers allowed: the step's phase figures would be incomplete.
      b.phase_markers = false;
      b.phases_complete = false;
    } else {
      const uint64_t marker = record_marker(/*optional=*/true);
      // A begin not recorded (the pool kept for step markers) still pairs with its end.
      if (marker == 0) b.phases_complete = false;
      open_phases_.push_back({phase_id,
                              phase_name,
                              {host_->clock().now_ns(), std::numeric_limits<Nanos>::max()},
                              marker,
                              0});
    }
  }
  if (!b.nvtx) return;
  backend_->range_push(phase_name.c_str());
  ++b.open_ranges;
}

void GpuMonitor::on_phase_end(int phase_id) {
  Boundary& b = b_;
  // Also after the trace detached: a phase begun in a window ends in it (its span closed).
  for (auto it = phases_.rbegin(); it != phases_.rend(); ++it) {
    if (it->id == phase_id && it->span.end == std::numeric_limits<Nanos>::max()) {
      it->span.end = host_ != nullptr ? host_->clock().now_ns() : it->span.begin;
      break;
    }
  }
  for (auto it = open_phases_.rbegin(); b.phase_markers && it != open_phases_.rend(); ++it) {
    if (it->id == phase_id && it->host.end == std::numeric_limits<Nanos>::max()) {
      if (it->begin_marker != 0) {  // behind the phase's last launches
        it->end_marker = record_marker(/*optional=*/true);
        if (it->end_marker == 0) b.phases_complete = false;
      }
      it->host.end = host_->clock().now_ns();
      break;
    }
  }
  if (!b.nvtx || b.open_ranges == 0) return;
  backend_->range_pop();
  --b.open_ranges;
}

void GpuMonitor::request_window(int steps) {
  planner_.request_window(steps);
  refresh_boundary();
}

void GpuMonitor::refresh_boundary() {
  // The backend is asked about a release only while one may run (it is the monitor that starts
  // them): a step outside windows touches nothing but the boundary's line.
  if (release_started_) release_started_ = backend_->trace_releasing();
  b_.attached = planner_.trace_attached() || stop_pending_;
  b_.tracing = planner_.tracing();
  b_.take_each = b_.attached || window_costing_ || release_started_;
  b_.armed = planner_.armed();
  planner_.arm_steps(&b_.arm_step, &b_.arm_step_in_epoch);
}

void GpuMonitor::on_step_end(StepRecord& r) {
  Boundary& b = b_;
  // At the boundary only what must happen at that moment: the marker behind the step's last
  // launches, its NVTX ranges closed. The rest waits for on_step_record (a batch later for short
  // steps); in and around windows, and where a window may arm, the step is taken at once.
  // A marker at every boundary in and around windows, else once gpu.marker_interval_ms of host
  // time passed since the run's first (a marker costs the training thread 2-7 us: one a
  // millisecond step would be 0.5%).
  // Steps around a recurring stall's period (the stall tracker marks them before this call) too:
  // the stall's GPU span is its own, as the stall's advice estimates from it.
  const bool mark = !b.run_open || b.run_begin_marker == 0 || b.attached || r.at_period ||
                    r.end_ns - b.run_begin_host >= b.marker_interval_ns;
  b.phase_markers = false;
  b.last_step = r.step;
  b.last_end = r.end_ns;
  // The step's NVTX range (phases left open by the program are closed with it).
  while (b.nvtx && b.open_ranges > 0) {
    backend_->range_pop();
    --b.open_ranges;
  }
  if (mark) {
    // The run ends with this step; its steps' records find its markers in the note.
    RunNote& n = end_run(r.step, r.begin_ns, record_marker(), r.end_ns);
    n.phases.swap(open_phases_);  // the step's phases go with it; the next step starts empty
    n.phases_complete = b.phases_complete;
  }
  if (sync_probe_armed_ && window_syncs_ > 0 && !b.attached) {
    sync_probe_armed_ = false;
    sync_probe_left_ = kSyncProbeSteps;
    probed_from_ = r.step + 1;  // the probe times the steps after the marked ones
  }
  if (sync_probe_left_ > 0 && !b.attached) {
    r.probe_syncs = true;
    probed_to_ = r.step + 1;
    --sync_probe_left_;
  }
  if (host_ != nullptr &&
      (b.take_each || b.armed || r.step >= b.arm_step || r.step_in_epoch >= b.arm_step_in_epoch)) {
    host_->take_step_now();
  }
}

GpuMonitor::RunNote& GpuMonitor::add_run_note() {
  if (runs_head_ > 0 && runs_head_ == runs_.size()) {
    runs_.clear();
    runs_head_ = 0;
  } else if (runs_.size() - runs_head_ >= kMaxRunNotes) {
    ++runs_head_;  // never read: its steps are attributed by their host spans
  }
  if (runs_head_ >= kMaxRunNotes) {  // the read ones go, so the queue stays bounded
    runs_.erase(runs_.begin(), runs_.begin() + static_cast<std::ptrdiff_t>(runs_head_));
    runs_head_ = 0;
  }
  return runs_.emplace_back();
}

void GpuMonitor::on_step_record(StepRecord& r) {
  // Timed where it can hold the thread (a collection, a window's start, stop or release); the
  // rest of the call is short and bounded.
  std::optional<CallTimer> timer;
  latest_ns_ = std::max(latest_ns_, r.end_ns);
  latest_epoch_ = r.epoch;
  b_.recorded_step = r.step;
  // Steps at a recurring stall's period and the one after each are probed for the stall tracker
  // (and hold the stall): not ordinary waits.
  const bool probed = r.step >= probed_from_ && r.step <= probed_to_;
  const bool near_stall = r.at_period || prev_record_at_period_;
  prev_record_at_period_ = r.at_period;
  if (probed && !near_stall && r.metrics.get("sync", "probed") > 0) {
    const double ms = r.metrics.get("sync", "ms");
    if (measured(ms)) {
      ++epoch_->sync_probed_steps;
      epoch_->sync_probed_ns += static_cast<Nanos>(ms * 1e6);
    }
  }
  // The step's run: its note once the run ended, else the open run.
  while (runs_head_ < runs_.size() && runs_[runs_head_].last_step < r.step) ++runs_head_;
  RunNote* run = runs_head_ < runs_.size() ? &runs_[runs_head_] : nullptr;
  uint64_t begin_marker = 0;
  Nanos begin_host = r.begin_ns;
  int64_t run_steps = 1;
  if (run != nullptr && run->first_step <= r.step) {
    begin_marker = run->begin_marker;
    begin_host = run->begin_host;
    run_steps = run->steps();
  } else if (run == nullptr && b_.run_open && r.step >= b_.run_first_step) {
    begin_marker = b_.run_begin_marker;
    begin_host = b_.run_begin_host;
  }
  const bool run_ends = run != nullptr && run->first_step <= r.step && run->last_step == r.step;
  const bool attached_before = planner_.trace_attached() || stop_pending_;
  // A window that waited for the previous one's release opens at the step after it: that one's
  // cost ends here, before this step is judged against the new window's prediction.
  if (window_costing_ && planner_.tracing() && !last_recorded_traced_) finish_window_cost();
  // A window the budget let open (not one asked for) that costs more than its prediction ends
  // early: once the budget has no room for this step's slowdown, the step is its last (what it
  // traced is kept).
  const Nanos predicted = window_costing_ ? window_estimate_ns_ : window_estimate_pending_ns_;
  if (planner_.tracing() && predicted >= 0 && host_ != nullptr &&
      !host_->cost_allows(window_charge(work_over_median(r)))) {
    planner_.end_window_early();
    ++epoch_windows_cut_;
  }
  const GpuWindowPlanner::StepEndActions a = planner_.end_step(
      r.step, r.step_in_epoch, r.begin_ns, r.end_ns, host_ == nullptr || !host_->tuning(),
      {r.data_wait_ns, r.own_ns, r.at_period, release_started_});
  // The steps while its release runs are the window's too: the release's thread contends with
  // a host-bound trainer (a planted 14 ms step ran 18-25 ms for 9 steps after a window).
  account_window(r, a.traced || attached_before || release_started_, a.traced);
  // An ordinary step: no trace attached, no release running, not probed (records of short steps
  // come a batch later: the release's bounds are as seen then).
  const bool ordinary = !a.traced && !attached_before && !release_started_ && !probed;
  if (ordinary) {
    epoch_->ordinary_steps.add(r.step_ns());
    epoch_->ordinary_compute.add(std::max<Nanos>(0, r.step_ns() - r.data_wait_ns));
    epoch_->ordinary_data_wait_ns += r.data_wait_ns;
  }
  if (host_ != nullptr && a.deferred) {
    const std::string what = std::strcmp(denied_kind_, "anomaly") == 0 ? "an anomaly"
                             : std::strcmp(denied_kind_, "first") == 0 ? "the first"
                                                                       : "a repeated";
    const int least = std::min(denied_steps_, GpuWindowPlanner::kMinWindowSteps);
    host_->cost_deferred(
        what + " trace window of " + std::to_string(denied_steps_) + " steps" +
            (least < denied_steps_ ? " (or a shorter one, from " + std::to_string(least) + ")"
                                   : ""),
        denied_estimate_ns_);
  }
  if (host_ != nullptr && a.anomaly) {
    host_->log(LogLevel::kInfo, "anomaly trace window: " + planner_.anomaly_reason());
  }
  if (a.anomaly) next_window_anomaly_ = true;
  PendingStep p;
  p.step = r.step;
  p.epoch = r.epoch;
  p.span = {r.begin_ns, r.end_ns};
  p.data_wait = {r.begin_ns, r.begin_ns + r.data_wait_ns};
  p.traced = a.traced;
  p.trace_from = a.trace_from;
  p.begin_marker = begin_marker;
  p.marked = {begin_host, r.end_ns};
  p.end_known = false;
  p.own_ns = r.own_ns;
  p.window_first = a.traced && !last_recorded_traced_;
  p.anomaly_window = p.window_first && window_anomaly_;
  p.ordinary = ordinary;
  p.run_steps = run_steps;
  last_recorded_traced_ = a.traced;
  if (run_ends) {
    p.phases = std::move(run->phases);
    p.phases_complete = run->phases_complete;
  }
  pending_.push_back(std::move(p));
  if (run_ends) end_pending_run(run->end_marker, run->end_host, run_steps);
  if (a.stop_trace) {
    // The window's ops were all issued: no more op scopes. Its kernels may still be queued: the
    // trace stops once the GPU ran this step.
    HostOpScopes::instance().enable(false);
    stop_pending_ = true;
    stop_marker_ = run_ends ? run->end_marker : 0;
    stop_deadline_ = r.end_ns + kMarkerWaitNs;
  }

  // No flush on the training thread during a window's tail: converting a window's records
  // can take tens of milliseconds for a long window; the release's forced flush
  // delivers them off the training thread (the trace stopped once the GPU ran its last step).
  if (a.release) {
    if (!timer) timer.emplace(max_step_call_ns_);
    backend_->release_trace();  // its final flush is drained once the release is done
    release_started_ = true;
    refresh_pm_status();  // PM sampling may not have come back
  }
  // Outside a window the steps' GPU figures come from markers and PM samples resolved off this
  // thread: collected every kCollectEveryNs of host time, not at every step (a collection takes
  // the backend's locks; 3-4 us a step on the H100 and H200). A window collects at every step.
  // (A traced step had its trace attached before its end: attached_before covers it.)
  const bool window = attached_before || planner_.trace_attached() || stop_pending_ || a.release ||
                      backend_->trace_releasing();
  if (window || r.end_ns - last_collect_ns_ >= kCollectEveryNs || last_collect_ns_ < 0 ||
      pending_.size() >= kCollectMaxPending) {
    last_collect_ns_ = r.end_ns;
    if (!timer) timer.emplace(max_step_call_ns_);
    const Nanos c0 = now_ns();
    // Samples that stopped coming (the decode thread failed) must not hold steps back: looked at
    // in a collection once a second, or once the samples lag a collection's interval behind the
    // steps (the status is a list of strings: not at every step).
    if (window || pm_status_ns_ < 0 || r.end_ns - pm_status_ns_ >= kPmStatusEveryNs ||
        (pm_active_ && r.end_ns - pm_watermark_ > kCollectEveryNs)) {
      pm_status_ns_ = r.end_ns;
      refresh_pm_status();
    }
    const Nanos d0 = now_ns();
    drain();
    const Nanos d1 = now_ns();
    maybe_stop_trace(r.end_ns, false);
    finish_ready_steps(false, r.end_ns);
    ++epoch_->collections;
    epoch_->collect_drain_ns += d1 - d0;
    epoch_->collect_ns += now_ns() - c0;
  }
  refresh_boundary();
}

GpuMonitor::RunNote& GpuMonitor::end_run(int64_t last_step, Nanos begin_host, uint64_t marker,
                                         Nanos host_end) {
  RunNote& n = add_run_note();
  n.first_step = b_.run_open ? b_.run_first_step : last_step;
  n.last_step = last_step;
  n.begin_marker = b_.run_open ? b_.run_begin_marker : 0;
  n.begin_host = b_.run_open ? b_.run_begin_host : begin_host;
  n.end_marker = marker;
  n.end_host = host_end;
  b_.boundary_marker = marker;
  b_.boundary_host = host_end;
  b_.run_open = false;
  return n;
}

void GpuMonitor::close_run(uint64_t marker, Nanos host_end) {
  // Its steps whose records are still to come find the end in a note; those pending, at once.
  const RunNote& n = end_run(b_.last_step, host_end, marker, host_end);
  end_pending_run(marker, host_end, n.steps());
}

void GpuMonitor::end_pending_run(uint64_t marker, Nanos host_end, int64_t steps) {
  // The run's steps are the latest pending ones (steps finish in order).
  for (auto it = pending_.rbegin(); it != pending_.rend() && !it->end_known; ++it) {
    it->end_marker = marker;
    it->marked.end = host_end;
    it->end_known = true;
    it->run_steps = steps;
  }
}

Nanos GpuMonitor::window_estimate_ns(int steps) const {
  // The latest window's cost scaled to this one's steps; before any, a prior from the step's
  // work (the first window measures what windows cost here).
  // Its fixed part (torchpilot's calls: start, stop, finishing; the steps its release slowed) as
  // it was, the slowdown per traced step scaled (a short window's start is not cheaper).
  if (last_window_cost_ns_ >= 0) {
    return last_window_fixed_ns_ +
           (last_window_cost_ns_ - last_window_fixed_ns_) * steps / std::max(1, last_window_steps_);
  }
  const Nanos median = planner_.median_work();
  if (median <= 0) return kFirstWindowEstimateNs;
  return kWindowStartStopEstimateNs + kReleaseSlowdownEstimateNs +
         static_cast<Nanos>(kTracedStepSlowdownPrior * static_cast<double>(median) * steps);
}

int GpuMonitor::allow_window(const char* kind, int steps) {
  if (host_ == nullptr) return steps;
  // All the steps asked for if the budget has room; else the most it has room for, down to the
  // planner's minimum (a long-step trainer's window waits less); else none now.
  // Asked at every step end while a window waits: the shortest first, one question then.
  const int least = std::min(steps, GpuWindowPlanner::kMinWindowSteps);
  const bool per_step = last_window_cost_ns_ >= 0 || planner_.median_work() > 0;
  if (host_->cost_allows(window_estimate_ns(per_step ? least : steps))) {
    int n = steps;
    while (n > least && !host_->cost_allows(window_estimate_ns(n))) --n;
    window_estimate_pending_ns_ = window_estimate_ns(n);
    return n;
  }
  // The log line is built only when the planner reports the deferral (once per wait).
  denied_kind_ = kind;
  denied_steps_ = steps;
  denied_estimate_ns_ = window_estimate_ns(steps);
  return 0;
}

Nanos GpuMonitor::work_over_median(const StepRecord& r) const {
  // While a window is costed, against the median when it began: the release's slowed steps enter
  // the planner's recent median and would raise it as they come.
  const Nanos median = window_costing_ ? window_median_ns_ : planner_.median_work();
  const Nanos work = std::max<Nanos>(0, r.step_ns() - r.data_wait_ns - r.own_ns);
  return median > 0 ? work - median : 0;
}

Nanos GpuMonitor::window_charge(Nanos over) const {
  const Nanos sum = window_costing_ ? window_excess_ns_ : 0;
  const Nanos charged = window_costing_ ? window_charged_ns_ : 0;
  return std::max<Nanos>(0, std::max<Nanos>(0, sum + over) - charged);
}

void GpuMonitor::account_window(const StepRecord& r, bool in_window, bool traced) {
  if (in_window && !window_costing_) {
    window_costing_ = true;
    window_cost_ns_ = 0;
    window_excess_ns_ = window_charged_ns_ = window_traced_excess_ns_ = 0;
    window_median_ns_ = planner_.median_work();
    window_cost_steps_ = 0;
    window_estimate_ns_ = window_estimate_pending_ns_;
    window_estimate_pending_ns_ = -1;  // a requested window has no prediction
  }
  if (!window_costing_) return;
  // The trace slows the trainer's own launches: its work above the median is charged; the
  // Pilot times torchpilot's calls (the window's start and stop) itself. Summed with its sign,
  // charged as the sum grows: a step below the median gives back what one above it took. The
  // steps above it alone would charge every step of a long release its noise (short steps vary
  // by 10-20% on an H200), however little the release slowed them.
  const Nanos over = work_over_median(r);
  const Nanos charge = window_charge(over);
  window_excess_ns_ += over;
  if (traced) window_traced_excess_ns_ += over;
  if (charge > 0) {
    if (host_ != nullptr) host_->charge_cost(charge);
    window_charged_ns_ += charge;
    window_cost_ns_ += charge;
  }
  window_cost_ns_ += r.own_ns;
  if (traced) ++window_cost_steps_;
  // The step after the release (done off this thread) carries what is left of it: the window
  // is paid for.
  if (!in_window) finish_window_cost();
}

void GpuMonitor::finish_window_cost() {
  window_costing_ = false;
  last_window_cost_ns_ = window_cost_ns_;
  // Only the traced steps' slowdown scales with a window's steps; the rest is fixed: its start
  // and stop, and the steps after its trace (the release slows launches for ~0.4 s whatever the
  // window's length).
  const Nanos scaled = std::min(window_charged_ns_, std::max<Nanos>(0, window_traced_excess_ns_));
  last_window_fixed_ns_ = window_cost_ns_ - scaled;
  last_window_steps_ = std::max(1, window_cost_steps_);
  if (window_estimate_ns_ >= 0) {
    ++epoch_windows_predicted_;
    epoch_window_cost_ns_ += window_cost_ns_;
    epoch_window_estimate_ns_ += window_estimate_ns_;
  }
}

void GpuMonitor::maybe_stop_trace(Nanos now, bool force) {
  if (!stop_pending_) return;
  const bool gpu_done = stop_marker_ == 0 || marker_times_.count(stop_marker_) > 0;
  if (!gpu_done && !force && now < stop_deadline_) return;
  stop_pending_ = false;
  backend_->stop_trace();
  planner_.trace_stopped();
}

void GpuMonitor::refresh_pm_status() {
  // Steps wait for PM samples only while sampling runs; once it stopped they finish without.
  for (const auto& s : backend_->status()) {
    if (s.name == kPmSamplingCollector) pm_active_ = s.active;
  }
}

Nanos GpuMonitor::now_ns() const {
  return host_ != nullptr ? host_->clock().now_ns() : steady_ns();
}

void GpuMonitor::on_epoch_end(EpochSummary& summary) {
  const Nanos t0 = now_ns();
  // The epoch's last run of steps ends with it (its last step's end).
  if (b_.run_open) close_run(record_marker(), latest_ns_);
  // How long the epoch's end may wait for the GPU: gpu.epoch_end_wait_ms, and no more than what
  // a quarter of the epoch's budget share (cost.budget x its time / 4) has left after torchpilot's
  // step calls (a 40 ms epoch may not wait 5 ms; the epoch end's other parts, its advisors and its
  // log, need the rest of the share on epochs of tens of milliseconds). What is not final then
  // (the last steps' markers or PM samples, a window's release) counts in the next epoch.
  Nanos allowed = static_cast<Nanos>(config_.epoch_end_wait_ms * 1e6);
  if (host_ != nullptr) {
    const auto share = static_cast<Nanos>(host_->config().cost.budget / 4 *
                                          static_cast<double>(std::max<Nanos>(0, summary.wall_ns)));
    allowed = std::max<Nanos>(0, std::min<Nanos>(allowed, share - host_->epoch_cost_ns()));
  }
  // A window still open or closing at the epoch's end stops once the GPU ran its last step (its
  // kernels would be lost otherwise): that wait is the window's, bounded as before.
  const bool closing_window = planner_.tracing() || planner_.stopping() || stop_pending_;
  const Nanos marker_wait = closing_window ? kEpochEndMarkerWaitNs : allowed;
  if (b_.boundary_marker != 0 && marker_times_.count(b_.boundary_marker) == 0 && marker_wait > 0) {
    backend_->await_marker(b_.boundary_marker, marker_wait);
  }
  drain();
  const GpuWindowPlanner::EpochEndActions a = planner_.end_epoch();
  if (a.stop_trace || stop_pending_) {
    // A window does not run across epochs; one closed earlier may still wait for the GPU.
    stop_pending_ = false;
    backend_->stop_trace();
    HostOpScopes::instance().enable(false);
  }
  // Decoding on this thread costs milliseconds: only when the wait allowed covers the last one;
  // otherwise the decode thread is woken and the next steps pick the samples up.
  const Nanos left = allowed - (now_ns() - t0);
  const bool flushed = a.stop_trace || (left > 0 && last_flush_ns_ <= left);
  if (flushed) {
    const Nanos f0 = now_ns();
    backend_->flush();
    last_flush_ns_ = now_ns() - f0;
  } else {
    backend_->request_flush();
  }
  // The release (cuptiFinalize, PM sampling's restart) takes 0.1-0.4 s off this thread. Waited
  // for only when that fits in the wait allowed, or for the run's first window when the budget
  // has room for it (a short run's only epoch would otherwise never show it); otherwise the
  // window's steps finish when it is done and count in the next epoch (or at close()).
  if (a.release) {
    backend_->release_trace();
    release_started_ = true;
  }
  const bool first_fits =
      !traced_finished_ && (host_ == nullptr || host_->cost_allows(kReleaseEstimateNs));
  if (backend_->trace_releasing() &&
      (first_fits || kReleaseEstimateNs <= allowed - (now_ns() - t0))) {
    backend_->finish_release();
  }
  if (a.release || !backend_->trace_releasing()) refresh_pm_status();
  drain();
  finish_ready_steps(false, latest_ns_, flushed,
                     std::max(kFinishBudgetNs, allowed - (now_ns() - t0)));
  bool traced_pending = false;
  for (const PendingStep& p : pending_) traced_pending = traced_pending || p.traced;
  if (!traced_pending) publish_window();  // a window does not run across epochs
  b_.boundary_marker = 0;                 // the next epoch's first step records its own start

  // A window's stop, flush and release at the epoch's end are its cost too.
  if (window_costing_) window_cost_ns_ += now_ns() - t0;

  GpuEpochStats e;
  e.device = device_.name;
  e.device_index = device_.index;
  e.sm_count = device_.sm_count;
  e.stats = epoch_->stats();
  e.traced_steps = epoch_->traced_steps;
  e.traced_steps_left_out = epoch_->traced_steps_left_out;
  e.gpu_timed_steps = epoch_->gpu_timed_steps;
  e.marker_timeouts = epoch_->marker_timeouts;
  e.steps = epoch_->steps;
  e.earlier_steps = epoch_->earlier_steps;
  e.carried_steps = static_cast<int64_t>(pending_.size());
  e.epoch_end_wait_ns = now_ns() - t0;
  e.own_thread_syncs = epoch_->own_thread_syncs;
  e.top_kernels = epoch_->top_kernels();
  e.top_sync_sites = epoch_->top_sync_sites();
  e.collectors = backend_->status();
  e.dropped_records = events_.dropped;
  e.kernel_classes = epoch_->classes;
  e.phases_gpu = std::move(epoch_->phases_gpu);
  e.max_step_call_ns = max_step_call_ns_;
  e.collections = epoch_->collections;
  e.collect_ns = epoch_->collect_ns;
  e.collect_drain_ns = epoch_->collect_drain_ns;
  e.steps_joined = epoch_->steps_joined;
  e.sync_probed_steps = epoch_->sync_probed_steps;
  e.sync_probed_ns = epoch_->sync_probed_ns;
  e.ordinary_steps = epoch_->ordinary_steps.count();
  e.ordinary_step_p50_ns = epoch_->ordinary_steps.quantile(0.5);
  e.ordinary_compute_p50_ns = epoch_->ordinary_compute.quantile(0.5);
  e.ordinary_data_wait_ns = epoch_->ordinary_data_wait_ns;
  e.ordinary_gpu_steps = epoch_->ordinary_gpu_steps.count();
  e.ordinary_gpu_step_p50_ns = epoch_->ordinary_gpu_steps.quantile(0.5);
  e.ordinary_gpu_ns = epoch_->ordinary_gpu_ns;
  e.ordinary_gpu_host_ns = epoch_->ordinary_gpu_host_ns;
  e.next_window = planner_.next_window(&e.next_window_step);
  e.windows_predicted = epoch_windows_predicted_;
  e.window_cost_ns = epoch_window_cost_ns_;
  e.window_estimate_ns = epoch_window_estimate_ns_;
  e.windows_cut = epoch_windows_cut_;
  epoch_windows_predicted_ = epoch_windows_cut_ = 0;
  epoch_window_cost_ns_ = epoch_window_estimate_ns_ = 0;
  max_step_call_ns_ = 0;
  events_.dropped = 0;
  summary.sections.set(std::move(e));
  epoch_ = std::make_unique<EpochAcc>();
  refresh_boundary();  // the planner's epoch end may let a repeated window arm
}

void GpuMonitor::on_close() {
  // The run ends: the steps still held (the last epoch's, which its summary left to a next
  // epoch) are published with what the GPU gives within gpu.epoch_end_wait_ms.
  if (pending_.empty()) return;
  const auto wait = static_cast<Nanos>(config_.epoch_end_wait_ms * 1e6);
  const PendingStep& last = pending_.back();
  if (last.end_marker != 0 && marker_times_.count(last.end_marker) == 0 && wait > 0) {
    backend_->await_marker(last.end_marker, wait);
  }
  if (stop_pending_) {
    stop_pending_ = false;
    backend_->stop_trace();
    HostOpScopes::instance().enable(false);
  }
  backend_->finish_release();
  backend_->flush();
  drain();
  finish_ready_steps(true, latest_ns_);
  publish_window();
}

std::unique_ptr<GpuMonitor> make_gpu_monitor(const GpuConfig& config,
                                             std::shared_ptr<GpuBackend> backend,
                                             spdlog::logger& logger) {
  const GpuDeviceInfo device = backend->device();
  if (device.sm_count <= 0) {
    std::string why;
    for (const auto& s : backend->status()) {
      if (!s.active && !s.reason.empty()) {
        why = s.reason;
        break;
      }
    }
    logger.info("GPU collectors off: {}", why.empty() ? "no GPU" : why);
    return nullptr;
  }
  auto monitor = std::make_unique<GpuMonitor>(config, std::move(backend));
  for (const auto& s : monitor->status()) {
    if (!s.active) logger.info("GPU collector {} off: {}", s.name, s.reason);
  }
  logger.info("GPU {} ({} SMs) observed", device.name, device.sm_count);
  return monitor;
}

}  // namespace torchpilot
