#include "torchpilot/runtime/gpu/gpu_monitor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "torchpilot/runtime/core/guard.h"
#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/gpu/gpu_epoch_accumulator.h"
#include "torchpilot/runtime/gpu/gpu_metrics.h"
#include "torchpilot/runtime/gpu/host_op_scopes.h"
#include "torchpilot/runtime/reports/trace_events.h"

namespace torchpilot {
namespace {

constexpr size_t kMaxPendingSteps = 1024;  // PM samples stalled: finish steps without them
constexpr size_t kMaxEvents = 1 << 20;     // per kind; a window of huge steps loses its oldest
constexpr size_t kMaxPhaseSpans = 256;
// Phase occurrences with markers per traced step (two markers each); a step with more is left out
// of the phase figures (its phases would be incomplete). Distinct phase names per epoch: as many.
constexpr size_t kMaxStepPhases = 64;
// A sync's drain may run into later steps: syncs and op scopes are kept this long after the
// oldest unfinished step began.
constexpr Nanos kSyncKeepNs = 2'000'000'000;

Nanos steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// --- epoch accumulation ----------------------------------------------------------------------

// The epoch's sums (gpu_epoch_accumulator.h: shared with the Kineto trace analyzer).
struct GpuMonitor::EpochAcc : GpuEpochAccumulator {};

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
  for (const auto& s : backend_->status()) {
    if (s.name == kPmSamplingCollector) pm_active_ = s.active;
    if (s.name == kActivityCollector && !s.active && !backend_->trace_busy()) planner_.disable();
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
  const CallTimer timer(max_step_call_ns_);
  // Within an epoch a step starts where the previous one ended (its record's span does too), and
  // so does its GPU span: the previous step's end marker. An epoch's first step records its own.
  open_begin_marker_ = boundary_marker_ != 0 ? boundary_marker_ : record_marker();
  boundary_marker_ = 0;
  if (planner_.begin_step(now) > 0) {
    const bool ok = backend_->start_trace();
    planner_.trace_started(ok, !ok && backend_->trace_busy());
    // The op-scope hook names the window's host syncs (it costs every op a callback: windows only).
    if (ok && config_.sync_op_names) HostOpScopes::instance().enable(true);
  }
  // Markers at phase boundaries cost two events a phase: in traced steps only, where they are
  // small beside the trace (the GPU time by phase needs the window's kernels anyway).
  phase_markers_ = planner_.tracing() && open_begin_marker_ != 0;
  phases_complete_ = true;
  if (!config_.nvtx) return;
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
  if (!config_.nvtx) return;
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
  if (!config_.nvtx || open_ranges_ == 0) return;
  backend_->range_pop();
  --open_ranges_;
}

void GpuMonitor::request_window(int steps) { planner_.request_window(steps); }

void GpuMonitor::on_step_end(StepRecord& r) {
  const CallTimer timer(max_step_call_ns_);
  // First, behind the step's last launches on the trainer's stream.
  const uint64_t end_marker = record_marker();
  boundary_marker_ = end_marker;
  phase_markers_ = false;
  latest_ns_ = std::max(latest_ns_, r.end_ns);
  latest_epoch_ = r.epoch;
  // The step's NVTX range (phases left open by the program are closed with it).
  while (config_.nvtx && open_ranges_ > 0) {
    backend_->range_pop();
    --open_ranges_;
  }
  const bool attached_before = planner_.trace_attached() || stop_pending_;
  const GpuWindowPlanner::StepEndActions a = planner_.end_step(
      r.step, r.step_in_epoch, r.begin_ns, r.end_ns, host_ == nullptr || !host_->tuning(),
      {r.data_wait_ns, r.own_ns, r.at_period});
  account_window(r, a.traced || attached_before, a.traced);
  if (host_ != nullptr && a.deferred) host_->cost_deferred(denied_, denied_estimate_ns_);
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
  p.begin_marker = open_begin_marker_;
  p.end_marker = end_marker;
  p.phases.swap(open_phases_);  // the step's phases go with it; the next step starts empty
  p.phases_complete = phases_complete_;
  open_begin_marker_ = 0;
  pending_.push_back(std::move(p));
  if (a.stop_trace) {
    // The window's ops were all issued: no more op scopes. Its kernels may still be queued: the
    // trace stops once the GPU ran this step.
    HostOpScopes::instance().enable(false);
    stop_pending_ = true;
    stop_marker_ = end_marker;
    stop_deadline_ = r.end_ns + kMarkerWaitNs;
  }

  // Samples that stopped coming (the decode thread failed) must not hold steps back.
  if (++steps_since_status_ >= 16) {
    steps_since_status_ = 0;
    refresh_pm_status();
  }

  // No flush on the training thread during a window's tail: converting a window's records
  // can take tens of milliseconds for a long window; the release's forced flush
  // delivers them off the training thread (the trace stopped once the GPU ran its last step).
  if (a.release) {
    backend_->release_trace();  // its final flush is drained once the release is done
    refresh_pm_status();        // PM sampling may not have come back
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
    drain();
    maybe_stop_trace(r.end_ns, false);
    finish_ready_steps(false, r.end_ns);
  }
}

bool GpuMonitor::allow_window(const char* kind, int steps) {
  if (host_ == nullptr) return true;
  // The latest window's cost scaled to this one's steps; before any, a prior (the first window
  // measures what windows cost here).
  const Nanos estimate = last_window_cost_ns_ < 0
                             ? kFirstWindowEstimateNs
                             : last_window_cost_ns_ * steps / std::max(1, last_window_steps_);
  if (host_->cost_allows(estimate)) return true;
  const std::string what = std::strcmp(kind, "anomaly") == 0 ? "an anomaly"
                           : std::strcmp(kind, "first") == 0 ? "the first"
                                                             : "a repeated";
  denied_ = what + " trace window of " + std::to_string(steps) + " steps";
  denied_estimate_ns_ = estimate;
  return false;
}

void GpuMonitor::account_window(const StepRecord& r, bool in_window, bool traced) {
  if (in_window && !window_costing_) {
    window_costing_ = true;
    window_cost_ns_ = 0;
    window_cost_steps_ = 0;
  }
  if (!window_costing_) return;
  // The trace slows the trainer's own launches: its work above the median is charged; the
  // Pilot times torchpilot's calls (the window's start and stop) itself.
  const Nanos median = planner_.median_work();
  const Nanos work = std::max<Nanos>(0, r.step_ns() - r.data_wait_ns - r.own_ns);
  const Nanos slowdown = median > 0 ? std::max<Nanos>(0, work - median) : 0;
  if (host_ != nullptr && slowdown > 0) host_->charge_cost(slowdown);
  window_cost_ns_ += slowdown + r.own_ns;
  if (traced) ++window_cost_steps_;
  if (!in_window) {
    // The step after the release carries the release's own time: the window is paid for.
    window_costing_ = false;
    last_window_cost_ns_ = window_cost_ns_;
    last_window_steps_ = std::max(1, window_cost_steps_);
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

namespace {
// Keeps the held kernels ordered by start: every finished step builds a busy-interval index over
// them (NextKernel in gpu_step_stats), and a long window holds hundreds of thousands (100 steps
// of a GPT of ~3,000 kernels a step), which it would otherwise sort again at every step. A drain's
// records come in nearly in order (per stream, buffer by buffer): only the overlap is merged.
void add_kernels_in_order(std::vector<KernelRecord>& held, std::vector<KernelRecord>& incoming) {
  auto by_begin = [](const KernelRecord& a, const KernelRecord& b) { return a.begin < b.begin; };
  if (!std::is_sorted(incoming.begin(), incoming.end(), by_begin)) {
    std::stable_sort(incoming.begin(), incoming.end(), by_begin);
  }
  const auto old = static_cast<std::ptrdiff_t>(held.size());
  held.insert(held.end(), std::make_move_iterator(incoming.begin()),
              std::make_move_iterator(incoming.end()));
  const auto mid = held.begin() + old;
  if (old == 0 || mid == held.end() || !by_begin(*mid, *(mid - 1))) return;
  // The held kernels that start after the first new one: the only ones out of place.
  const auto from = std::upper_bound(held.begin(), mid, *mid, by_begin);
  std::inplace_merge(from, mid, held.end(), by_begin);
}
}  // namespace

void GpuMonitor::drain() {
  incoming_.clear();
  backend_->drain(incoming_);
  auto append = [](auto& to, auto& from) {
    to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
  };
  for (const PmSample& s : incoming_.pm) pm_watermark_ = std::max(pm_watermark_, s.end);
  // Paused between bursts: no step waits for samples that will not come.
  pm_watermark_ = std::max(pm_watermark_, incoming_.pm_final_until);
  append(events_.pm, incoming_.pm);
  append(events_.nvml, incoming_.nvml);
  if (!incoming_.kernels.empty()) kernel_index_.reset();
  add_kernels_in_order(events_.kernels, incoming_.kernels);
  append(events_.copies, incoming_.copies);
  HostOpScopes& scopes = HostOpScopes::instance();
  scopes.drain(incoming_.scopes);
  name_phases();
  for (const SyncRecord& s : incoming_.syncs) {
    if ((s.thread == SyncThread::kOwn || s.thread == SyncThread::kInternal) && epoch_ != nullptr)
      ++epoch_->own_thread_syncs;
  }
  append(events_.syncs, incoming_.syncs);
  append(events_.scopes, incoming_.scopes);
  for (const MarkerRecord& m : incoming_.markers) marker_times_[m.id] = m.time;
  events_.dropped += incoming_.dropped + scopes.take_dropped();
}

void GpuMonitor::name_phases() {
  // The innermost phase open when it began (phases close in order: the latest that holds it).
  auto phase_at = [this](Nanos t) -> std::string {
    for (auto it = phases_.rbegin(); it != phases_.rend(); ++it) {
      if (t >= it->span.begin && t <= it->span.end) return it->name;
    }
    return {};
  };
  for (SyncRecord& s : incoming_.syncs) s.phase = phase_at(s.begin);
  for (HostOpScope& s : incoming_.scopes) s.phase = phase_at(s.begin);
}

const KernelIndex& GpuMonitor::kernel_index() {
  if (!kernel_index_) kernel_index_.emplace(events_.kernels);
  return *kernel_index_;
}

void GpuMonitor::finish(const PendingStep& step, const StepSpans& spans) {
  GpuStepRecord rec;
  rec.step = step.step;
  rec.epoch = step.epoch;
  rec.traced = step.traced;
  rec.gpu_timed = spans.gpu_timed;
  if (spans.gpu_timed) {
    rec.gpu_begin_ns = spans.gpu.begin;
    rec.gpu_end_ns = spans.gpu.end;
    rec.gpu_lag_ns = spans.gpu.end - spans.host.end;
  }
  const auto nvml_ns = static_cast<Nanos>(config_.nvml_interval_ms * 1e6);
  std::vector<SyncSite> sites;
  // Untraced steps have no kernels to look at: no index for them.
  const KernelIndex* index = step.traced ? &kernel_index() : nullptr;
  rec.stats = gpu_step_stats(events_, spans, device_.sm_count, nvml_ns, &sites, index);
  last_finished_end_ = std::max(last_finished_end_, step.span.end);
  epoch_->add(rec.stats);
  ++epoch_->steps;
  if (step.epoch < latest_epoch_) ++epoch_->earlier_steps;
  if (spans.gpu_timed) ++epoch_->gpu_timed_steps;
  if (rec.stats.traced_ns > 0) epoch_->add_sync_sites(sites);
  if (step.traced) {
    epoch_->add_kernels(index->overlapping(spans.figures()), spans.figures(), device_.sm_count);
    traced_finished_ = true;
    add_kernel_classes(epoch_->classes, events_, spans, device_.sm_count, index);
    add_phases(step, spans);
  }
  if (host_ != nullptr && !host_->config().report.trace_dir.empty()) {
    if (step.traced) {
      capture_window(step, spans);
    } else {
      publish_window();
    }
  }
  if (host_ != nullptr) host_->publish(make_late_step(rec.step, rec.epoch, std::move(rec)));
}

std::optional<Interval> GpuMonitor::phase_gpu_span(const PhaseMarks& p, Interval step) const {
  const auto b = marker_times_.find(p.begin_marker);
  const auto e = marker_times_.find(p.end_marker);
  if (p.begin_marker == 0 || p.end_marker == 0 || b == marker_times_.end() ||
      e == marker_times_.end()) {
    return std::nullopt;
  }
  // Clipped to the step's GPU span: a phase's work is the step's.
  return Interval{std::clamp(b->second, step.begin, step.end),
                  std::clamp(std::max(b->second, e->second), step.begin, step.end)};
}

void GpuMonitor::add_phases(const PendingStep& step, const StepSpans& spans) {
  if (step.phases.empty() || !spans.gpu_timed) return;  // a phase's GPU span needs its step's
  GpuPhaseTimes& out = epoch_->phases_gpu;
  // Each phase that ended in the step; one without a span (a marker not recorded or not
  // resolved) leaves the step out whole, so that the shares over the steps counted stay true.
  std::vector<std::pair<const PhaseMarks*, Interval>> spans_of;
  for (const PhaseMarks& p : step.phases) {
    if (p.host.end == std::numeric_limits<Nanos>::max()) continue;  // ends in a later step
    const std::optional<Interval> g =
        step.phases_complete ? phase_gpu_span(p, spans.gpu) : std::nullopt;
    if (!g) {
      ++out.incomplete_steps;
      return;
    }
    spans_of.emplace_back(&p, *g);
  }
  if (spans_of.empty()) return;
  std::vector<Interval> covered;
  for (const auto& [p, g] : spans_of) {
    auto it = std::find_if(out.phases.begin(), out.phases.end(),
                           [&](const GpuPhaseStats& x) { return x.name == p->name; });
    if (it == out.phases.end()) {
      if (out.phases.size() >= kMaxStepPhases) continue;
      out.phases.push_back({p->name});
      it = out.phases.end() - 1;
    }
    ++it->count;
    it->gpu_ns += g.end - g.begin;
    it->busy_ns += kernel_index().busy_within(g);
    it->host_ns += std::max<Nanos>(0, p->host.end - p->host.begin);
    covered.push_back(g);
  }
  ++out.steps;
  out.step_gpu_ns += spans.gpu.end - spans.gpu.begin;
  out.covered_ns += union_length(std::move(covered), spans.gpu);  // nested phases count once
}

void GpuMonitor::capture_window(const PendingStep& step, const StepSpans& spans) {
  if (window_ != nullptr && window_->epoch != step.epoch) publish_window();
  if (window_ == nullptr) {
    window_ = std::make_unique<GpuWindowRecord>();
    window_->epoch = step.epoch;
    window_->device = device_.name;
    window_until_ = spans.traced_part().begin;
  }
  GpuWindowRecord& w = *window_;
  // Each record once: those that begin between the previous traced step's end and this one's.
  const Interval take{window_until_, std::max(window_until_, spans.figures().end)};
  auto in = [&take](Nanos t) { return t >= take.begin && t < take.end; };
  WindowStep ws;
  ws.step = step.step;
  ws.host = spans.host;
  ws.data_wait = spans.data_wait;
  ws.gpu_timed = spans.gpu_timed;
  ws.gpu = spans.gpu;
  w.steps.push_back(ws);
  for (const PhaseSpan& p : phases_) {
    if (p.span.end != std::numeric_limits<Nanos>::max() && p.span.begin >= spans.host.begin &&
        p.span.begin < spans.host.end) {
      w.phases.push_back({p.name, p.span});
    }
  }
  for (const PhaseMarks& p : step.phases) {
    if (!spans.gpu_timed) break;
    if (const auto g = phase_gpu_span(p, spans.gpu)) w.gpu_phases.push_back({p.name, *g});
  }
  for (const KernelRecord& k : kernel_index().starting_in(take)) {
    if (in(k.begin)) w.kernels.push_back(k);
  }
  for (const CopyRecord& c : events_.copies) {
    if (in(c.begin)) w.copies.push_back(c);
  }
  // A sample that began before the window but runs into it is its first counter value.
  const bool first = w.steps.size() == 1;
  for (const PmSample& p : events_.pm) {
    if (in(p.begin) || (first && p.begin < take.begin && p.end > take.begin)) w.pm.push_back(p);
  }
  // Host syncs by the host's time: those that began in this step's host span.
  for (SyncRecord& s : resolve_host_syncs(events_, true, spans.host)) {
    if (s.thread == SyncThread::kOwn || s.thread == SyncThread::kInternal) continue;
    if (s.begin >= spans.host.begin && s.begin < spans.host.end) {
      w.host_syncs.push_back(std::move(s));
    }
  }
  window_until_ = take.end;
}

void GpuMonitor::publish_window() {
  if (window_ == nullptr) return;
  std::unique_ptr<GpuWindowRecord> w = std::move(window_);
  if (host_ == nullptr || w->steps.empty()) return;
  const int64_t step = w->steps.back().step;
  const int64_t epoch = w->epoch;
  host_->publish(make_late_step(step, epoch, std::move(*w)));
}

bool GpuMonitor::gpu_span(const PendingStep& p, Nanos now, bool all, StepSpans& spans,
                          bool& timed_out) {
  timed_out = false;
  spans.host = p.span;
  spans.data_wait = p.data_wait;
  spans.traced = p.traced;
  spans.trace_from = p.trace_from;
  spans.gpu_timed = false;
  if (p.begin_marker == 0 || p.end_marker == 0) return true;  // not recorded: host span
  const auto b = marker_times_.find(p.begin_marker);
  const auto e = marker_times_.find(p.end_marker);
  if (b != marker_times_.end() && e != marker_times_.end()) {
    spans.gpu = {b->second, std::max(b->second, e->second)};
    spans.gpu_timed = true;
    return true;
  }
  // Never held forever: a marker that does not resolve in time leaves the step its host span.
  if (all || now - p.span.end >= kMarkerWaitNs || pending_.size() > kMaxPendingSteps) {
    timed_out = true;
    return true;
  }
  return false;
}

void GpuMonitor::finish_ready_steps(bool all, Nanos now, bool pm_flushed, Nanos budget_ns) {
  // A window's records often arrive at once (its release's forced flush): finishing its steps
  // takes milliseconds each (13 ms a step at batch 32 on the H100), so a step call finishes
  // them for at most kFinishBudgetNs (two at least, so a backlog shrinks) and the next calls go
  // on; an epoch's end within what its wait allows; close() (all) finishes every one.
  const Nanos t0 = now_ns();
  int finished = 0;
  while (!pending_.empty()) {
    if (!all && finished >= 2 && now_ns() - t0 > budget_ns) break;
    const PendingStep& p = pending_.front();
    StepSpans spans;
    bool timed_out = false;
    bool ready = gpu_span(p, now, all, spans, timed_out);
    if (ready && !all && pending_.size() <= kMaxPendingSteps) {
      const Nanos end = spans.figures().end;
      // Just flushed: the samples there are, are all there will be for a step the GPU has run
      // (but the one being taken).
      const bool pm_ready = !pm_active_ || pm_flushed || pm_watermark_ >= end;
      // Traced steps: the window's records are final once its tail is over, and the tail starts
      // only after the GPU ran the window's last step.
      // A release running off the training thread still holds the window's last records.
      const bool trace_ready =
          !p.traced || (planner_.records_final(p.span.end) && !backend_->trace_releasing());
      ready = pm_ready && trace_ready;
    }
    if (!ready) break;  // steps finish in order
    if (timed_out) ++epoch_->marker_timeouts;
    finish(p, spans);
    pending_.pop_front();
    ++finished;
  }
  prune_events();
}

void GpuMonitor::prune_events() {
  // A bound whatever the clocks do: the oldest events go first.
  auto cap = [](auto& v) {
    if (v.size() > kMaxEvents)
      v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() - kMaxEvents));
  };
  cap(events_.pm);
  cap(events_.nvml);
  if (events_.kernels.size() > kMaxEvents) kernel_index_.reset();
  cap(events_.kernels);
  cap(events_.copies);
  cap(events_.syncs);
  cap(events_.scopes);
  // Resolved markers older than every one still needed (ids increase): the unfinished steps',
  // the next step's start, the one a window's stop waits for.
  uint64_t floor = std::numeric_limits<uint64_t>::max();
  auto need = [&floor](uint64_t id) {
    if (id != 0) floor = std::min(floor, id);
  };
  for (const PendingStep& p : pending_) {
    need(p.begin_marker);
    need(p.end_marker);
    if (p.begin_marker != 0 || p.end_marker != 0) break;
  }
  need(boundary_marker_);
  need(open_begin_marker_);
  if (stop_pending_) need(stop_marker_);
  marker_times_.erase(marker_times_.begin(), marker_times_.lower_bound(floor));
  // Events ending before the oldest unfinished step are not needed any more. A step's GPU span
  // starts after its host span's start (the GPU runs what the host queued); the slack covers the
  // clock conversions of markers and CUPTI timestamps.
  constexpr Nanos kSlackNs = 1000000;
  const Nanos keep_from =
      (pending_.empty() ? std::max<Nanos>(0, last_finished_end_) : pending_.front().span.begin) -
      kSlackNs;
  if (keep_from <= pruned_before_) return;
  pruned_before_ = keep_from;
  auto prune = [keep_from](auto& v, auto end_of) {
    v.erase(
        std::remove_if(v.begin(), v.end(), [&](const auto& e) { return end_of(e) < keep_from; }),
        v.end());
  };
  prune(events_.pm, [](const PmSample& s) { return s.end; });
  // NVML readings stand for the interval before them: keep the last one before the boundary.
  prune(events_.nvml, [this](const UtilSample& u) {
    return u.time + static_cast<Nanos>(config_.nvml_interval_ms * 1e6);
  });
  // Kernels: only once a quarter of them or more can go. A window's steps finish a few per step
  // call, and pruning a few steps' kernels at a time would scan (and re-index) all the window's
  // held kernels each time. Held in start order: those starting before keep_from are the most
  // that can go.
  const auto before = std::lower_bound(events_.kernels.begin(), events_.kernels.end(), keep_from,
                                       [](const KernelRecord& k, Nanos t) { return k.begin < t; });
  if (static_cast<size_t>(before - events_.kernels.begin()) * 4 >= events_.kernels.size() &&
      before != events_.kernels.begin()) {
    kernel_index_.reset();
    prune(events_.kernels, [](const KernelRecord& k) { return k.end; });
  }
  prune(events_.copies, [](const CopyRecord& c) { return c.end; });
  // Syncs and op scopes stay longer: the drain after a sync can idle the GPU steps later.
  prune(events_.syncs, [](const SyncRecord& s) { return s.end + kSyncKeepNs; });
  prune(events_.scopes, [](const HostOpScope& s) { return s.end + kSyncKeepNs; });
}

Nanos GpuMonitor::now_ns() const {
  return host_ != nullptr ? host_->clock().now_ns() : steady_ns();
}

void GpuMonitor::on_epoch_end(EpochSummary& summary) {
  const Nanos t0 = now_ns();
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
  if (a.release) backend_->release_trace();
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
