// GpuMonitor's step completion: draining the backend, matching kernels to steps and phases,
// capturing windows and pruning the held events.
#include <algorithm>
#include <iterator>
#include <limits>
#include <utility>

#include "gpu_monitor_internal.h"
#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/gpu/gpu_metrics.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"
#include "torchpilot/runtime/gpu/host_op_scopes.h"
#include "torchpilot/runtime/reports/trace_events.h"

namespace torchpilot {
using namespace gpu_monitor_detail;

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
  const size_t pm_held = events_.pm.size();
  append(events_.pm, incoming_.pm);
  // Samples arrive in time order; should a batch not (a restarted sampler), the held ones are
  // sorted once, so that each step finds its own by binary search.
  auto by_begin = [](const PmSample& a, const PmSample& b) { return a.begin < b.begin; };
  if (!std::is_sorted(events_.pm.begin() + static_cast<std::ptrdiff_t>(pm_held ? pm_held - 1 : 0),
                      events_.pm.end(), by_begin)) {
    std::stable_sort(events_.pm.begin(), events_.pm.end(), by_begin);
  }
  // The search walks back from the step's begin over samples that reach into it: exact when
  // their ends are in order too (a sampler's samples do not overlap); else the whole pass.
  events_.pm_by_begin =
      std::is_sorted(events_.pm.begin(), events_.pm.end(),
                     [](const PmSample& a, const PmSample& b) { return a.end < b.end; });
  append(events_.nvml, incoming_.nvml);
  if (!incoming_.kernels.empty()) kernel_index_.reset();
  add_kernels_in_order(events_.kernels, incoming_.kernels);
  append(events_.copies, incoming_.copies);
  HostOpScopes& scopes = HostOpScopes::instance();
  scopes.drain(incoming_.scopes);
  // Op scopes come only from a window's synchronizing calls (CUPTI's callbacks, as they happen):
  // the window had host syncs before its records are flushed (the probe that follows needs no
  // wait for its release).
  window_syncs_ += static_cast<int64_t>(incoming_.scopes.size());
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

void GpuMonitor::finish(const PendingStep& step, const StepSpans& spans, bool publish,
                        bool capture) {
  GpuStepRecord rec;
  rec.step = step.step;
  rec.epoch = step.epoch;
  rec.traced = spans.traced;
  rec.device_index = device_.index;
  rec.gpu_timed = spans.gpu_timed;
  rec.gpu_shared = spans.gpu_shared;
  if (spans.gpu_timed) {
    rec.gpu_begin_ns = spans.gpu.begin;
    rec.gpu_end_ns = spans.gpu.end;
    rec.gpu_lag_ns = spans.gpu.end - spans.host.end;
  }
  std::vector<SyncSite> sites;
  // Untraced steps have no kernels to look at: no index for them. (A window's first step left
  // out of its figures, spans.traced false, counts as untraced; its trace is still captured.)
  const KernelIndex* index = spans.traced ? &kernel_index() : nullptr;
  rec.stats = gpu_step_stats(events_, spans, device_.sm_count, nvml_interval_ns(), &sites, index);
  last_finished_end_ = std::max(last_finished_end_, step.span.end);
  epoch_->add(rec.stats);
  ++epoch_->steps;
  if (step.epoch < latest_epoch_) ++epoch_->earlier_steps;
  if (spans.gpu_timed) ++epoch_->gpu_timed_steps;
  if (rec.stats.traced_ns > 0) epoch_->add_sync_sites(sites);
  if (spans.traced) {
    window_syncs_ += rec.stats.host_syncs;
    epoch_->add_kernels(index->overlapping(spans.figures()), spans.figures(), device_.sm_count);
    traced_finished_ = true;
    add_kernel_classes(epoch_->classes, events_, spans, device_.sm_count, index);
    add_phases(step, spans);
  }
  if (capture) {
    if (step.traced) {
      StepSpans traced = spans;  // a step left out of the figures is still in the trace
      traced.traced = true;
      capture_window(step, traced);
    } else {
      publish_window();
    }
  }
  // Built for every step, read by default only around a recurring stall (the stall tracker):
  // not published while nobody would read it.
  if (publish) host_->publish(make_late_step(rec.step, rec.epoch, std::move(rec)));
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
  spans.gpu_shared = false;
  const bool give_up =
      all || now - p.span.end >= kMarkerWaitNs || pending_.size() > kMaxPendingSteps;
  if (p.begin_marker == 0) return true;  // not recorded: host span
  if (!p.end_known) {
    // Its run's end marker is still to be recorded.
    timed_out = give_up;
    return give_up;
  }
  if (p.end_marker == 0) return true;
  const auto b = marker_times_.find(p.begin_marker);
  const auto e = marker_times_.find(p.end_marker);
  if (b != marker_times_.end() && e != marker_times_.end()) {
    const Interval run{b->second, std::max(b->second, e->second)};
    spans.gpu_timed = true;
    if (p.span.begin <= p.marked.begin && p.span.end >= p.marked.end) {
      spans.gpu = run;  // markers of its own
      return true;
    }
    // One of a run of steps between two markers: its host time's share of their GPU span.
    const Nanos host = std::max<Nanos>(1, p.marked.end - p.marked.begin);
    const double scale = static_cast<double>(run.end - run.begin) / static_cast<double>(host);
    auto at = [&](Nanos h) {
      const Nanos into = std::clamp(h, p.marked.begin, p.marked.end) - p.marked.begin;
      return run.begin + static_cast<Nanos>(static_cast<double>(into) * scale);
    };
    spans.gpu = {at(p.span.begin), at(p.span.end)};
    spans.gpu_shared = true;
    spans.run_gpu_ns = run.end - run.begin;
    return true;
  }
  // Never held forever: a marker that does not resolve in time leaves the step its host span.
  if (give_up) {
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
  // Read once a collection: whether anyone reads the steps' late records, whether windows are
  // captured; where neither, untraced steps are joined (merge_untraced).
  const bool publish = host_ != nullptr && host_->late_steps_wanted();
  const bool capture = host_ != nullptr && !host_->config().report.trace_dir.empty();
  const bool join = !publish && !capture;
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
    // This epoch's own steps only: the host figures beside it are the epoch's.
    if (p.ordinary && spans.gpu_timed && p.epoch >= latest_epoch_) {
      const StepLengths l = step_lengths(p, spans);
      epoch_->ordinary_gpu_steps.add(l.gpu);
      epoch_->ordinary_gpu_ns += l.gpu;
      epoch_->ordinary_gpu_host_ns += l.host;
    }
    if (p.traced && p.window_first && !p.anomaly_window && window_start_outlier(p)) {
      spans.traced = false;  // its figures as an untraced step's; its trace is kept
      ++epoch_->traced_steps_left_out;
    }
    if (!join || !merge_untraced(p, spans)) {
      finish_untraced();  // in order
      finish(p, spans, publish, capture);
    }
    pending_.pop_front();
    ++finished;
  }
  finish_untraced();
  prune_events();
}

GpuMonitor::StepLengths GpuMonitor::step_lengths(const PendingStep& p,
                                                 const StepSpans& spans) const {
  if (!spans.gpu_shared || p.run_steps <= 1) {
    return {spans.gpu.end - spans.gpu.begin, p.span.end - p.span.begin};
  }
  return {spans.run_gpu_ns / p.run_steps,
          std::max<Nanos>(0, p.marked.end - p.marked.begin) / p.run_steps};
}

bool GpuMonitor::merge_untraced(const PendingStep& p, const StepSpans& spans) {
  if (p.traced || spans.traced) return false;
  // Joined only where they meet: a gap between two spans is no step's.
  const Interval f = spans.figures();
  if (untraced_.steps > 0 &&
      (spans.gpu_timed != untraced_.gpu_timed || f.begin != untraced_.span.end)) {
    finish_untraced();
  }
  if (untraced_.steps == 0) {
    untraced_.span = f;
    untraced_.gpu_timed = spans.gpu_timed;
  }
  untraced_.span.end = std::max(untraced_.span.end, f.end);
  ++untraced_.steps;
  if (p.epoch < latest_epoch_) ++untraced_.earlier_steps;
  if (spans.gpu_timed) ++untraced_.gpu_timed_steps;
  last_finished_end_ = std::max(last_finished_end_, p.span.end);
  // A run ends with a step that holds an NVML reading: one by one, the steps before it took that
  // reading (the first after them), so the run's figures take the same one.
  for (auto it = events_.nvml.rbegin(); it != events_.nvml.rend() && it->time >= f.begin; ++it) {
    if (it->time <= f.end) {
      finish_untraced();
      break;
    }
  }
  return true;
}

void GpuMonitor::finish_untraced() {
  if (untraced_.steps == 0) return;
  StepSpans joined;
  joined.host = joined.gpu = untraced_.span;
  joined.gpu_timed = untraced_.gpu_timed;
  epoch_->add(
      gpu_step_stats(events_, joined, device_.sm_count, nvml_interval_ns(), nullptr, nullptr));
  epoch_->steps += untraced_.steps;
  epoch_->earlier_steps += untraced_.earlier_steps;
  epoch_->gpu_timed_steps += untraced_.gpu_timed_steps;
  epoch_->steps_joined += untraced_.steps;
  untraced_ = {};
}

bool GpuMonitor::window_start_outlier(const PendingStep& first) const {
  auto work = [](const PendingStep& p) {
    return std::max<Nanos>(
        0, (p.span.end - p.span.begin) - (p.data_wait.end - p.data_wait.begin) - p.own_ns);
  };
  std::vector<Nanos> others;
  for (auto it = pending_.begin() + 1; it != pending_.end() && it->traced && !it->window_first;
       ++it) {
    others.push_back(work(*it));
  }
  if (others.size() < 2) return false;
  return static_cast<double>(work(first)) >
         kWindowStartOutlierFactor * static_cast<double>(median(std::move(others)));
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
  // The steps whose records are still to come (on_step_record) are later than every pending one.
  for (size_t i = runs_head_; i < runs_.size(); ++i) {
    need(runs_[i].begin_marker);
    need(runs_[i].end_marker);
    if (runs_[i].begin_marker != 0 || runs_[i].end_marker != 0) break;
  }
  need(b_.boundary_marker);
  if (b_.run_open) need(b_.run_begin_marker);
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
  prune(events_.nvml, [this](const UtilSample& u) { return u.time + nvml_interval_ns(); });
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

}  // namespace torchpilot
