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
  nvtx_ = config_.nvtx;
  for (const auto& s : backend_->status()) {
    if (s.name == kPmSamplingCollector) pm_active_ = s.active;
    if (s.name == kActivityCollector && !s.active && !backend_->trace_busy()) planner_.disable();
    // Without an NVTX tool (set at the process's start) the ranges go nowhere: not even called.
    if (s.name == kNvtxCollector && !s.active) nvtx_ = false;
  }
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
  // Timed only where it can hold the thread (a window's start): two clock reads a step saved.
  std::optional<CallTimer> timer;
  const int window_steps = planner_.begin_step(now);
  // A window's steps get markers of their own: a run of steps still open ends here, before the
  // trace starts (at the previous step's end: nothing of this step is queued yet).
  if (window_steps > 0 && run_open_) close_run(record_marker(), latest_ns_);
  if (!run_open_) {
    // Within an epoch a run of steps starts where the previous one ended (its record's span does
    // too), and so does its GPU span: the previous run's end marker. An epoch's first step
    // records its own.
    run_open_ = true;
    if (boundary_marker_ != 0) {
      run_begin_marker_ = boundary_marker_;
      run_begin_host_ = boundary_host_;
    } else {
      run_begin_marker_ = record_marker();
      run_begin_host_ = now;
    }
  }
  boundary_marker_ = 0;
  if (window_steps > 0) {
    timer.emplace(max_step_call_ns_);
    const bool ok = backend_->start_trace();
    planner_.trace_started(ok, !ok && backend_->trace_busy());
    // The op-scope hook names the window's host syncs (it costs every op a callback: windows only).
    if (ok && config_.sync_op_names) HostOpScopes::instance().enable(true);
  }
  // Markers at phase boundaries cost two events a phase: in traced steps only, where they are
  // small beside the trace (the GPU time by phase needs the window's kernels anyway).
  phase_markers_ = planner_.tracing() && run_begin_marker_ != 0;
  phases_complete_ = true;
  if (!nvtx_) return;
  char name[32] = "step ";  // to_chars: no locale, no format parsing (every step)
  *std::to_chars(name + 5, name + sizeof name - 1, step).ptr = '\0';
  backend_->range_push(name);
  ++open_ranges_;
}

void GpuMonitor::on_phase_begin(int phase_id, const std::string& phase_name) {
  // Phase spans only name a window's host syncs: kept while a trace is attached, not every step.
  if (host_ != nullptr && (planner_.trace_attached() || stop_pending_)) {
    phases_.push_back(
        {phase_id, phase_name, {host_->clock().now_ns(), std::numeric_limits<Nanos>::max()}});
    if (phases_.size() > kMaxPhaseSpans) phases_.pop_front();
  }
  if (phase_markers_ && host_ != nullptr) {
    if (open_phases_.size() >= kMaxStepPhases) {
      // More phases than markers allowed: the step's phase figures would be incomplete.
      phase_markers_ = false;
      phases_complete_ = false;
    } else {
      const uint64_t marker = record_marker(/*optional=*/true);
      // A begin not recorded (the pool kept for step markers) still pairs with its end.
      if (marker == 0) phases_complete_ = false;
      open_phases_.push_back({phase_id,
                              phase_name,
                              {host_->clock().now_ns(), std::numeric_limits<Nanos>::max()},
                              marker,
                              0});
    }
  }
  if (!nvtx_) return;
  backend_->range_push(phase_name.c_str());
  ++open_ranges_;
}

void GpuMonitor::on_phase_end(int phase_id) {
  for (auto it = phases_.rbegin(); it != phases_.rend(); ++it) {
    if (it->id == phase_id && it->span.end == std::numeric_limits<Nanos>::max()) {
      it->span.end = host_ != nullptr ? host_->clock().now_ns() : it->span.begin;
      break;
    }
  }
  for (auto it = open_phases_.rbegin(); phase_markers_ && it != open_phases_.rend(); ++it) {
    if (it->id == phase_id && it->host.end == std::numeric_limits<Nanos>::max()) {
      if (it->begin_marker != 0) {  // behind the phase's last launches
        it->end_marker = record_marker(/*optional=*/true);
        if (it->end_marker == 0) phases_complete_ = false;
      }
      it->host.end = host_->clock().now_ns();
      break;
    }
  }
  if (!nvtx_ || open_ranges_ == 0) return;
  backend_->range_pop();
  --open_ranges_;
}

void GpuMonitor::request_window(int steps) { planner_.request_window(steps); }

bool GpuMonitor::window_now() {
  // The backend is asked about a release only while one may run (it is the monitor that starts
  // them): a step outside windows touches nothing but the monitor's own state.
  if (release_started_) release_started_ = backend_->trace_releasing();
  return planner_.trace_attached() || stop_pending_ || window_costing_ || release_started_;
}

void GpuMonitor::on_step_end(StepRecord& r) {
  // At the boundary only what must happen at that moment: the marker behind the step's last
  // launches, its NVTX ranges closed. The rest waits for on_step_record (a batch later for short
  // steps): in and around windows the step is taken at once.
  const bool window = window_now();
  // A marker at every boundary in and around windows, else once gpu.marker_interval_ms of host
  // time passed since the run's first (a marker costs the training thread 2-7 us: one a
  // millisecond step would be 0.5%).
  const auto interval = static_cast<Nanos>(config_.marker_interval_ms * 1e6);
  const bool mark =
      !run_open_ || run_begin_marker_ == 0 || window || r.end_ns - run_begin_host_ >= interval;
  const uint64_t end_marker = mark ? record_marker() : 0;
  phase_markers_ = false;
  latest_ns_ = std::max(latest_ns_, r.end_ns);
  latest_epoch_ = r.epoch;
  // The step's NVTX range (phases left open by the program are closed with it).
  while (nvtx_ && open_ranges_ > 0) {
    backend_->range_pop();
    --open_ranges_;
  }
  if (notes_head_ > 0 && notes_head_ == notes_.size()) {
    notes_.clear();
    notes_head_ = 0;
  } else if (notes_.size() - notes_head_ >= kMaxNotes) {
    ++notes_head_;  // never read: the step is attributed by its host span
  }
  StepNote& n = notes_.emplace_back();
  n.step = r.step;
  n.begin_marker = run_begin_marker_;
  n.run_begin_host = run_begin_host_;
  n.phases.swap(open_phases_);  // the step's phases go with it; the next step starts empty
  n.phases_complete = phases_complete_;
  if (mark) {
    n.run_ends = true;
    n.end_marker = end_marker;
    n.end_host = r.end_ns;
    boundary_marker_ = end_marker;
    boundary_host_ = r.end_ns;
    run_open_ = false;
  }
  if (host_ != nullptr && (window || planner_.arms_at(r.step, r.step_in_epoch))) {
    host_->take_step_now();
  }
}

void GpuMonitor::on_step_record(StepRecord& r) {
  // Timed where it can hold the thread (a collection, a window's start, stop or release); the
  // rest of the call is short and bounded.
  std::optional<CallTimer> timer;
  // The step's note (none when the monitor came after the step ended: its host span).
  StepNote n;
  n.step = r.step;
  while (notes_head_ < notes_.size() && notes_[notes_head_].step <= r.step) {
    if (notes_[notes_head_].step == r.step) n = std::move(notes_[notes_head_]);
    ++notes_head_;
  }
  const bool attached_before = planner_.trace_attached() || stop_pending_;
  // A window the budget let open (not one asked for) that costs more than its prediction ends
  // early: once the budget has no room for this step's slowdown, the step is its last (what it
  // traced is kept).
  const Nanos predicted = window_costing_ ? window_estimate_ns_ : window_estimate_pending_ns_;
  if (planner_.tracing() && predicted >= 0 && host_ != nullptr &&
      !host_->cost_allows(traced_slowdown(r))) {
    planner_.end_window_early();
    ++epoch_windows_cut_;
  }
  const GpuWindowPlanner::StepEndActions a = planner_.end_step(
      r.step, r.step_in_epoch, r.begin_ns, r.end_ns, host_ == nullptr || !host_->tuning(),
      {r.data_wait_ns, r.own_ns, r.at_period});
  account_window(r, a.traced || attached_before, a.traced);
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
  PendingStep p;
  p.step = r.step;
  p.epoch = r.epoch;
  p.span = {r.begin_ns, r.end_ns};
  p.data_wait = {r.begin_ns, r.begin_ns + r.data_wait_ns};
  p.traced = a.traced;
  p.trace_from = a.trace_from;
  p.begin_marker = n.begin_marker;
  p.marked = {n.run_begin_host, r.end_ns};
  p.end_known = false;
  p.phases = std::move(n.phases);
  p.phases_complete = n.phases_complete;
  pending_.push_back(std::move(p));
  if (n.run_ends) end_pending_run(n.end_marker, n.end_host);
  if (a.stop_trace) {
    // The window's ops were all issued: no more op scopes. Its kernels may still be queued: the
    // trace stops once the GPU ran this step.
    HostOpScopes::instance().enable(false);
    stop_pending_ = true;
    stop_marker_ = n.end_marker;
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
    // Samples that stopped coming (the decode thread failed) must not hold steps back: looked at
    // with each collection (the status is a list of strings: not at every step).
    refresh_pm_status();
    drain();
    maybe_stop_trace(r.end_ns, false);
    finish_ready_steps(false, r.end_ns);
  }
}

void GpuMonitor::close_run(uint64_t marker, Nanos host_end) {
  // The open run's steps whose records are still to come end with it too.
  for (size_t i = notes_.size(); i > notes_head_ && !notes_[i - 1].run_ends; --i) {
    StepNote& n = notes_[i - 1];
    n.run_ends = true;
    n.end_marker = marker;
    n.end_host = host_end;
  }
  end_pending_run(marker, host_end);
  boundary_marker_ = marker;
  boundary_host_ = host_end;
  run_open_ = false;
}

void GpuMonitor::end_pending_run(uint64_t marker, Nanos host_end) {
  // The run's steps are the latest pending ones (steps finish in order).
  for (auto it = pending_.rbegin(); it != pending_.rend() && !it->end_known; ++it) {
    it->end_marker = marker;
    it->marked.end = host_end;
    it->end_known = true;
  }
}

Nanos GpuMonitor::window_estimate_ns(int steps) const {
  // The latest window's cost scaled to this one's steps; before any, a prior from the step's
  // work (the first window measures what windows cost here).
  // Its fixed part (torchpilot's calls: start, stop, finishing) as it was, the slowdown per
  // traced step scaled (a short window's start is not cheaper).
  if (last_window_cost_ns_ >= 0) {
    return last_window_fixed_ns_ +
           (last_window_cost_ns_ - last_window_fixed_ns_) * steps / std::max(1, last_window_steps_);
  }
  const Nanos median = planner_.median_work();
  if (median <= 0) return kFirstWindowEstimateNs;
  return kWindowStartStopEstimateNs +
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

Nanos GpuMonitor::traced_slowdown(const StepRecord& r) const {
  const Nanos median = planner_.median_work();
  const Nanos work = std::max<Nanos>(0, r.step_ns() - r.data_wait_ns - r.own_ns);
  return median > 0 ? std::max<Nanos>(0, work - median) : 0;
}

void GpuMonitor::account_window(const StepRecord& r, bool in_window, bool traced) {
  if (in_window && !window_costing_) {
    window_costing_ = true;
    window_cost_ns_ = window_fixed_ns_ = 0;
    window_cost_steps_ = 0;
    window_estimate_ns_ = window_estimate_pending_ns_;
    window_estimate_pending_ns_ = -1;  // a requested window has no prediction
  }
  if (!window_costing_) return;
  // The trace slows the trainer's own launches: its work above the median is charged; the
  // Pilot times torchpilot's calls (the window's start and stop) itself.
  const Nanos slowdown = traced_slowdown(r);
  if (host_ != nullptr && slowdown > 0) host_->charge_cost(slowdown);
  window_cost_ns_ += slowdown + r.own_ns;
  window_fixed_ns_ += r.own_ns;
  if (traced) ++window_cost_steps_;
  if (!in_window) {
    // The step after the release carries the release's own time: the window is paid for.
    window_costing_ = false;
    last_window_cost_ns_ = window_cost_ns_;
    last_window_fixed_ns_ = window_fixed_ns_;
    last_window_steps_ = std::max(1, window_cost_steps_);
    if (window_estimate_ns_ >= 0) {
      ++epoch_windows_predicted_;
      epoch_window_cost_ns_ += window_cost_ns_;
      epoch_window_estimate_ns_ += window_estimate_ns_;
    }
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
  if (run_open_) close_run(record_marker(), latest_ns_);
  // How long the epoch's end may wait for the GPU: gpu.epoch_end_wait_ms, and no more than what
  // half the epoch's budget share (cost.budget x its time / 2) has left after torchpilot's step
  // calls (a 40 ms epoch may not wait 5 ms; the wait never takes the whole share). What is not
  // final then (the last steps' markers or PM samples, a window's release) counts in the next
  // epoch.
  Nanos allowed = static_cast<Nanos>(config_.epoch_end_wait_ms * 1e6);
  if (host_ != nullptr) {
    const auto share = static_cast<Nanos>(host_->config().cost.budget / 2 *
                                          static_cast<double>(std::max<Nanos>(0, summary.wall_ns)));
    allowed = std::max<Nanos>(0, std::min<Nanos>(allowed, share - host_->epoch_cost_ns()));
  }
  // A window still open or closing at the epoch's end stops once the GPU ran its last step (its
  // kernels would be lost otherwise): that wait is the window's, bounded as before.
  const bool closing_window = planner_.tracing() || planner_.stopping() || stop_pending_;
  const Nanos marker_wait = closing_window ? kEpochEndMarkerWaitNs : allowed;
  if (boundary_marker_ != 0 && marker_times_.count(boundary_marker_) == 0 && marker_wait > 0) {
    backend_->await_marker(boundary_marker_, marker_wait);
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
  boundary_marker_ = 0;                   // the next epoch's first step records its own start

  // A window's stop, flush and release at the epoch's end are its cost too.
  if (window_costing_) {
    window_cost_ns_ += now_ns() - t0;
    window_fixed_ns_ += now_ns() - t0;
  }

  GpuEpochStats e;
  e.device = device_.name;
  e.device_index = device_.index;
  e.sm_count = device_.sm_count;
  e.stats = epoch_->stats();
  e.traced_steps = epoch_->traced_steps;
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
