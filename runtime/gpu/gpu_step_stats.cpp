#include "torchpilot/runtime/gpu/gpu_step_stats.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "torchpilot/runtime/gpu/gpu_metrics.h"

namespace torchpilot {
namespace {

Nanos overlap(Interval a, Interval b) {
  return std::max<Nanos>(0, std::min(a.end, b.end) - std::max(a.begin, b.begin));
}

// Time-weighted mean of one PM field over the span; NaN when no sample has it.
template <typename Field>
double weighted(const std::vector<PmSample>& pm, Interval span, Field field) {
  double sum = 0, weight = 0;
  for (const PmSample& s : pm) {
    const double v = field(s);
    if (!measured(v)) continue;
    const double w = static_cast<double>(overlap({s.begin, s.end}, span));
    sum += v * w;
    weight += w;
  }
  return weight > 0 ? sum / weight : kNotMeasured;
}

// A sum-type PM field (bytes in a sample) prorated by the part of each sample inside the span.
template <typename Field>
double prorated(const std::vector<PmSample>& pm, Interval span, Field field) {
  double sum = 0;
  bool any = false;
  for (const PmSample& s : pm) {
    const double v = field(s);
    const Nanos len = s.end - s.begin;
    if (!measured(v) || len <= 0) continue;
    const Nanos o = overlap({s.begin, s.end}, span);
    if (o <= 0) continue;
    sum += v * static_cast<double>(o) / static_cast<double>(len);
    any = true;
  }
  return any ? sum : kNotMeasured;
}

// A host sync's wait ended in the span: it counts in this step (span ends are exclusive of the
// previous step's, so no sync counts twice).
bool ends_in(const SyncRecord& s, Interval span) { return s.end > span.begin && s.end <= span.end; }

// The span's syncs by call site; idle is filled by the caller.
void add_site(std::vector<SyncSite>& sites, const SyncRecord& s, bool counted, Nanos idle) {
  auto it = std::find_if(sites.begin(), sites.end(), [&](const SyncSite& x) {
    return x.cause == s.cause && x.phase == s.phase;
  });
  if (it == sites.end()) {
    sites.push_back({s.cause, to_string(s.api), s.phase, 0, 0, 0});
    it = sites.end() - 1;
  }
  if (counted) {
    ++it->count;
    it->host_wait_ns += s.end - s.begin;
    if (s.thread == SyncThread::kTrainer) ++it->trainer_calls;
    if (s.thread == SyncThread::kOther) ++it->other_thread_calls;
    if (s.stream_id >= 0) it->stream_id = s.stream_id;
    if (s.event_id >= 0) it->event_id = s.event_id;
  }
  it->idle_ns += idle;
}

bool pageable_h2d(const CopyRecord& c) {
  return !c.memset && c.kind == CopyKind::kHostToDevice && c.pageable;
}

// The op scope (if any) whose extent holds the midpoint of [begin, end]. CUPTI's times come
// through a measured clock offset: a midpoint is robust to its few microseconds of error.
const HostOpScope* scope_of(const std::vector<HostOpScope>& scopes, Nanos begin, Nanos end) {
  const Nanos mid = begin + (end - begin) / 2;
  for (const HostOpScope& s : scopes) {
    if (mid >= s.begin && mid <= s.end) return &s;
  }
  return nullptr;
}

}  // namespace

std::vector<SyncRecord> resolve_host_syncs(const GpuEventBatch& events, bool traced,
                                           Interval near) {
  auto is_near = [near](Nanos begin, Nanos end) { return end >= near.begin && begin <= near.end; };
  std::vector<HostOpScope> scopes;
  for (const HostOpScope& s : events.scopes) {
    if (!is_near(s.begin, s.end)) continue;
    // The CUDA calls of one op call (item(): a copy, then a synchronize) are one scope.
    auto same = std::find_if(scopes.begin(), scopes.end(),
                             [&](const HostOpScope& o) { return s.call != 0 && o.call == s.call; });
    if (same == scopes.end()) {
      scopes.push_back(s);
    } else {
      same->begin = std::min(same->begin, s.begin);
      same->end = std::max(same->end, s.end);
    }
  }
  std::vector<SyncRecord> out;
  if (!traced) {
    for (const HostOpScope& s : scopes) {
      if (s.always && s.end >= s.begin)
        out.push_back({s.begin, s.end, SyncApi::kUnknown, s.op, s.phase});
    }
    return out;
  }
  // What CUPTI saw the host block in: synchronize calls, and copies to pageable memory (the
  // host waits for those inside the copy call, with no sync record).
  std::vector<SyncRecord> candidates;
  for (const SyncRecord& c : events.syncs) {
    // torchpilot's own threads (step markers, PM decode, the trace release) never hold up the
    // training loop: their calls are no host syncs, wherever they fall in time.
    if (c.thread == SyncThread::kOwn || c.thread == SyncThread::kInternal) continue;
    if (is_near(c.begin, c.end)) candidates.push_back(c);
  }
  for (const CopyRecord& c : events.copies) {
    if (!c.memset && c.kind == CopyKind::kDeviceToHost && c.pageable && c.end >= c.begin &&
        is_near(c.begin, c.end)) {
      SyncRecord s;
      s.begin = c.begin;
      s.end = c.end;
      s.api = SyncApi::kBlockingCopy;
      candidates.push_back(s);
    }
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const SyncRecord& a, const SyncRecord& b) { return a.begin < b.begin; });
  // One sync per op scope that holds any of them, named by the op; the API (and the thread and
  // ids) of its first.
  // A wait made to copy from pageable memory to the device (the op that copies waits for the GPU
  // to reach the copy, then for the staged transfer) is that copy's stall: the pageable-copy
  // cause, whose remedy is pinning, not a host sync.
  std::vector<Interval> pageable_in;
  for (const CopyRecord& c : events.copies) {
    if (pageable_h2d(c) && is_near(c.begin, c.end)) pageable_in.push_back({c.begin, c.end});
  }
  const auto copies_pageable = [&](Nanos begin, Nanos end) {
    return std::any_of(pageable_in.begin(), pageable_in.end(), [&](const Interval& c) {
      const Nanos mid = c.begin + (c.end - c.begin) / 2;
      return mid >= begin && mid <= end;
    });
  };
  std::vector<std::pair<const HostOpScope*, const SyncRecord*>> hit;
  for (const SyncRecord& c : candidates) {
    const HostOpScope* scope = scope_of(scopes, c.begin, c.end);
    if (c.api != SyncApi::kBlockingCopy &&
        (scope != nullptr ? copies_pageable(scope->begin, scope->end)
                          : copies_pageable(c.begin, c.end))) {
      continue;
    }
    if (scope == nullptr) {
      SyncRecord s = c;
      s.cause = to_string(c.api);
      out.push_back(std::move(s));
      continue;
    }
    const bool seen =
        std::any_of(hit.begin(), hit.end(), [&](const auto& h) { return h.first == scope; });
    if (!seen) hit.emplace_back(scope, &c);
  }
  for (const auto& [scope, first] : hit) {
    SyncRecord s = *first;
    s.begin = scope->begin;
    s.end = scope->end;
    s.cause = scope->op;
    s.phase = scope->phase;
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(),
            [](const SyncRecord& a, const SyncRecord& b) { return a.begin < b.begin; });
  return out;
}

KernelIndex::KernelIndex(const std::vector<KernelRecord>& kernels) : kernels_(kernels) {
  busy_.reserve(kernels.size());
  for (size_t i = 0; i < kernels.size(); ++i) {
    const KernelRecord& k = kernels[i];
    if (i > 0 && k.begin < kernels[i - 1].begin) by_start_ = false;  // empty ones too
    longest_ = std::max(longest_, k.end - k.begin);
    if (k.end > k.begin) busy_.push_back({k.begin, k.end});
  }
  merge_in_place(busy_);  // disjoint busy intervals
}

KernelRange KernelIndex::starting_in(Interval span) const {
  if (!by_start_) return all();
  auto at = [this](Nanos t) {
    return std::lower_bound(kernels_.begin(), kernels_.end(), t,
                            [](const KernelRecord& k, Nanos v) { return k.begin < v; });
  };
  const auto first = at(span.begin);
  const auto last = std::max(first, at(span.end));
  return {kernels_.data() + (first - kernels_.begin()),
          kernels_.data() + (last - kernels_.begin())};
}

KernelRange KernelIndex::overlapping(Interval span) const {
  // A kernel that overlaps the span starts before its end, and at most the longest kernel's
  // length before its beginning.
  const Nanos from = span.begin > std::numeric_limits<Nanos>::min() + longest_
                         ? span.begin - longest_
                         : std::numeric_limits<Nanos>::min();
  return starting_in({from, span.end});
}

Nanos KernelIndex::at_or_after(Nanos t, Nanos never) const {
  // The first busy interval ending after t: t is inside it, or it is the next one.
  const auto it = std::upper_bound(busy_.begin(), busy_.end(), t,
                                   [](Nanos v, const Interval& i) { return v < i.end; });
  if (it == busy_.end()) return never;
  return std::max(t, it->begin);
}

Nanos KernelIndex::last_end_before(Nanos t) const {
  auto it = std::upper_bound(busy_.begin(), busy_.end(), t,
                             [](Nanos v, const Interval& i) { return v < i.end; });
  if (it == busy_.begin()) return std::numeric_limits<Nanos>::min();
  --it;
  return it->end;
}

Nanos KernelIndex::busy_within(Interval span) const {
  // The first busy interval ending after the span's start, then on until one starts at its end.
  auto it = std::upper_bound(busy_.begin(), busy_.end(), span.begin,
                             [](Nanos v, const Interval& i) { return v < i.end; });
  Nanos busy = 0;
  for (; it != busy_.end() && it->begin < span.end; ++it) {
    busy += std::min(it->end, span.end) - std::max(it->begin, span.begin);
  }
  return busy;
}

void KernelIndex::gaps_after(Nanos t, Nanos budget, Nanos stop, std::vector<Interval>& out) const {
  auto it = std::upper_bound(busy_.begin(), busy_.end(), t,
                             [](Nanos v, const Interval& i) { return v < i.end; });
  Nanos cursor = t;
  for (; it != busy_.end() && budget > 0 && cursor < stop; ++it) {
    if (it->begin > cursor) {
      const Nanos end = std::min({it->begin, stop, cursor + budget});
      out.push_back({cursor, end});
      budget -= end - cursor;
    }
    cursor = std::max(cursor, it->end);
  }
}

GpuStats gpu_step_stats(const GpuEventBatch& events, const StepSpans& spans, int sm_count,
                        Nanos nvml_interval_ns, std::vector<SyncSite>* sites,
                        const KernelIndex* kernel_index) {
  // GPU figures belong to the step whose GPU span contains them (host span when unknown).
  Interval span = spans.figures();
  const Interval data_wait = spans.data_wait;
  const bool traced = spans.traced;
  const Nanos trace_from = spans.trace_from;
  GpuStats g;
  g.wall_ns = std::max<Nanos>(0, span.end - span.begin);
  if (g.wall_ns == 0) return g;

  // Only the samples that overlap the step: the monitor keeps tens of them (every sample since
  // the oldest unfinished step began), and this runs for every step.
  // Scratch kept per thread: this runs for every step, and allocating costs more than the work.
  thread_local std::vector<PmSample> pm;
  pm.clear();
  auto pm_from = events.pm.begin();
  if (events.pm_by_begin) {
    // The first sample beginning at or after the step, then back over those that reach into it.
    pm_from = std::partition_point(events.pm.begin(), events.pm.end(),
                                   [&](const PmSample& s) { return s.begin < span.begin; });
    while (pm_from != events.pm.begin() && std::prev(pm_from)->end > span.begin) --pm_from;
  }
  for (auto it = pm_from; it != events.pm.end(); ++it) {
    if (events.pm_by_begin && it->begin >= span.end) break;
    if (it->end > span.begin && it->begin < span.end) pm.push_back(*it);
  }
  // The part of the step the samples cover: the epoch weighs the step's PM means by it (a step
  // half in a sampling gap, e.g. while a window's release restarts PM sampling, weighs half).
  {
    thread_local std::vector<Interval> covered;
    covered.clear();
    for (const PmSample& s : pm) {
      if (measured(s.counter_utilization) || measured(s.sm_efficiency))
        covered.push_back({s.begin, s.end});
    }
    g.pm_covered_ns = union_length_in_place(covered, span);
  }
  g.counter_utilization =
      weighted(pm, span, [](const PmSample& s) { return s.counter_utilization; });
  g.sm_efficiency = weighted(pm, span, [](const PmSample& s) { return s.sm_efficiency; });
  g.tensor_activity = weighted(pm, span, [](const PmSample& s) { return s.tensor_activity; });
  g.dram_throughput = weighted(pm, span, [](const PmSample& s) { return s.dram_throughput; });
  g.achieved_occupancy = weighted(pm, span, [](const PmSample& s) { return s.achieved_occupancy; });
  g.pcie_read_bytes = prorated(pm, span, [](const PmSample& s) { return s.pcie_read_bytes; });
  g.pcie_write_bytes = prorated(pm, span, [](const PmSample& s) { return s.pcie_write_bytes; });

  // NVML's utilization.gpu is already an average over its own period: the readings inside the
  // step, or else the latest one taken within an interval after the step ended.
  // The SM clock and its limits the same way, from the readings of a busy GPU only: an idle GPU
  // lowers its clock, and a rank that waits (for data, for the host, for a straggler) would
  // otherwise look slower-clocked.
  constexpr double kBusyReading = 0.5;  // utilization.gpu over the reading's period
  double nv_sum = 0, clock_sum = 0, limited_sum = 0;
  int nv_n = 0, clock_n = 0, limited_n = 0;
  const UtilSample* latest = nullptr;
  auto add = [&](const UtilSample& u) {
    nv_sum += u.utilization;
    ++nv_n;
    if (u.utilization < kBusyReading) return;
    if (!std::isnan(u.sm_clock_mhz)) {
      clock_sum += u.sm_clock_mhz;
      ++clock_n;
    }
    if (u.clock_limited >= 0) {
      limited_sum += u.clock_limited;
      ++limited_n;
    }
  };
  for (const UtilSample& u : events.nvml) {
    if (u.time >= span.begin && u.time <= span.end) {
      add(u);
    } else if (u.time > span.end && u.time <= span.end + nvml_interval_ns &&
               (latest == nullptr || u.time < latest->time)) {
      latest = &u;
    }
  }
  if (nv_n == 0 && latest != nullptr) add(*latest);
  if (nv_n > 0) g.nvml_utilization = nv_sum / nv_n;
  if (clock_n > 0) g.sm_clock_mhz = clock_sum / clock_n;
  if (limited_n > 0) g.clock_limited = limited_sum / limited_n;

  if (!traced) {
    // Without a trace, the scopes of ops that always synchronize (none unless their hook runs).
    if (events.scopes.empty()) return g;
    std::vector<Interval> waits;
    for (const SyncRecord& sync : resolve_host_syncs(events, false, span)) {
      if (!ends_in(sync, span)) continue;
      ++g.host_syncs;
      waits.push_back({sync.begin, sync.end});
      if (sites != nullptr) add_site(*sites, sync, true, 0);
    }
    g.host_sync_ns = union_length(
        waits, {std::numeric_limits<Nanos>::min() / 2, std::numeric_limits<Nanos>::max() / 2});
    return g;
  }
  // The trace covers the step from `trace_from` on (a window's first step: from its scope's start).
  const Interval whole = span;
  span.begin = std::max(span.begin, trace_from);
  if (span.end <= span.begin) return g;
  g.traced_ns = span.end - span.begin;
  std::optional<KernelIndex> own_index;
  if (kernel_index == nullptr) kernel_index = &own_index.emplace(events.kernels);
  const KernelIndex& index = *kernel_index;
  std::vector<KernelEvent> kernels;
  std::vector<Interval> busy;
  Nanos first_kernel = span.end, last_kernel = span.begin;
  bool communication = false;
  for (const KernelRecord& k : index.overlapping(span)) {
    const Interval i{std::max(k.begin, span.begin), std::min(k.end, span.end)};
    if (i.end <= i.begin) continue;
    kernels.push_back({k.begin, k.end, k.blocks, k.communication});
    busy.push_back(i);
    first_kernel = std::min(first_kernel, i.begin);
    last_kernel = std::max(last_kernel, i.end);
    if (k.begin >= span.begin) ++g.kernels;  // counted in the step it started in
    communication = communication || k.communication;
  }
  // One pass over the copies: those in the span are work beside compute for communication
  // overlap (needed only with a collective), host-to-device ones starting in it are counted.
  std::vector<Interval> copies;
  for (const CopyRecord& c : events.copies) {
    if (communication && c.end > span.begin && c.begin < span.end) {
      copies.push_back({c.begin, c.end});
    }
    if (c.memset || c.kind != CopyKind::kHostToDevice) continue;
    if (c.begin < span.begin || c.begin >= span.end) continue;
    g.h2d_bytes += c.bytes;
    if (c.pageable) {
      g.h2d_pageable_bytes += c.bytes;
      g.h2d_pageable_ns += c.end - c.begin;
    }
  }
  const GpuWindowMetrics m =
      gpu_window_metrics(kernels, span, std::max(1, sm_count), std::move(copies));
  g.gpu_utilization = m.gpu_utilization;
  g.estimated_sm_efficiency = m.estimated_sm_efficiency;
  g.comm_ns = m.comm_ns;
  g.exposed_comm_ns = m.exposed_comm_ns;

  // Idle = the span minus the kernel union, as gaps.
  std::sort(busy.begin(), busy.end(),
            [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  std::vector<Interval> gaps, inner_gaps;
  Nanos cursor = span.begin;
  for (const Interval& b : busy) {
    if (b.begin > cursor) {
      gaps.push_back({cursor, b.begin});
      if (cursor >= first_kernel) inner_gaps.push_back(gaps.back());  // between two kernels
    }
    cursor = std::max(cursor, b.end);
  }
  if (span.end > cursor) gaps.push_back({cursor, span.end});

  // What the host was doing, as host-time intervals on the same clock as the GPU's gaps: a gap
  // is time the host failed to keep the queue full. A sync's or a blocking copy's interval runs
  // on after it returns until the GPU starts a kernel again (the queue it drained is empty until
  // the host refills it) unless a kernel is running when it returns.
  constexpr Nanos kNever = std::numeric_limits<Nanos>::max() / 2;
  // The syncs that end in the step or whose drain can reach into it: a drain reaches past later
  // kernels (below), so those of the last second before the step too.
  constexpr Nanos kSyncReach = 1'000'000'000;
  const Nanos from = std::min(whole.begin, index.last_end_before(span.begin));
  const Interval near{
      from > std::numeric_limits<Nanos>::min() + kSyncReach ? from - kSyncReach : from, whole.end};
  const std::vector<SyncRecord> syncs = resolve_host_syncs(events, true, near);
  std::vector<std::vector<Interval>> sync_cover(syncs.size());
  for (size_t i = 0; i < syncs.size(); ++i) {
    const SyncRecord& sync = syncs[i];
    const Nanos resume = index.at_or_after(sync.end, kNever);
    sync_cover[i].push_back({sync.begin, std::max(sync.end, resume)});
    // The queue the sync emptied stays empty while the host works on (an optimizer's kernels,
    // then the next step's host work): the GPU gaps after the drain are the sync's too, up to the
    // host time it took (without it the host would have been that far ahead of the GPU), until
    // the next sync.
    const Nanos budget = (sync.end - sync.begin) - std::max<Nanos>(0, resume - sync.end);
    const Nanos stop = i + 1 < syncs.size() ? syncs[i + 1].begin : whole.end;
    // Only where the GPU was idle when it returned: the queue drained (a kernel still running
    // means work was queued after what it waited for).
    if (resume > sync.end && budget > 0 && resume < stop)
      index.gaps_after(resume, budget, stop, sync_cover[i]);
  }
  std::vector<Interval> copy_cover;
  std::vector<HostOpScope> near_scopes;
  for (const HostOpScope& s : events.scopes) {
    if (s.end >= near.begin && s.begin <= near.end) near_scopes.push_back(s);
  }
  for (const CopyRecord& c : events.copies) {
    if (!pageable_h2d(c) || c.end < near.begin || c.begin > near.end) continue;
    // The host entered the copy call with the op that made it (it waited there for the queue).
    const HostOpScope* scope = scope_of(near_scopes, c.begin, c.end);
    const Nanos begin = scope != nullptr ? std::min(scope->begin, c.begin) : c.begin;
    copy_cover.push_back({begin, std::max(c.end, index.at_or_after(c.end, kNever))});
  }

  // One cause per idle second, first match wins: data wait, pageable copy, host sync; the rest
  // is a launch gap between two kernels of the step, or other. The order is what each fix
  // removes: a pageable copy makes the host wait for the queue whether or not a sync comes
  // before or after it, so pinning removes that idle and removing the sync would not; with the
  // sync first, a sync at each step's end took the next step's copy as its drain, in some windows
  // and not others (the same steps named two causes).
  std::vector<Interval> claimed{data_wait};
  const Nanos idle = g.traced_ns - union_length(busy, span);
  const auto covered = [&](const std::vector<Interval>& in) {
    return intersection_length(in, claimed, span);
  };
  g.idle_data_wait_ns = covered(gaps);
  claimed.insert(claimed.end(), copy_cover.begin(), copy_cover.end());
  g.idle_pageable_copy_ns = covered(gaps) - g.idle_data_wait_ns;
  // Each sync, in order of its start, takes what earlier causes left: its site's idle.
  Nanos taken = g.idle_data_wait_ns + g.idle_pageable_copy_ns;
  for (size_t i = 0; i < syncs.size(); ++i) {
    claimed.insert(claimed.end(), sync_cover[i].begin(), sync_cover[i].end());
    const Nanos now = covered(gaps);
    const Nanos caused = now - taken;
    taken = now;
    g.idle_host_sync_ns += caused;
    const SyncRecord& sync = syncs[i];
    const bool counted = ends_in(sync, whole);
    if (counted) ++g.host_syncs;
    if (sites != nullptr && (counted || caused > 0)) add_site(*sites, sync, counted, caused);
  }
  {
    std::vector<Interval> waits;
    for (const SyncRecord& sync : syncs) {
      if (ends_in(sync, whole)) waits.push_back({sync.begin, sync.end});
    }
    g.host_sync_ns = union_length(
        waits, {std::numeric_limits<Nanos>::min() / 2, std::numeric_limits<Nanos>::max() / 2});
  }
  const Nanos rest = idle - g.idle_data_wait_ns - g.idle_host_sync_ns - g.idle_pageable_copy_ns;
  g.idle_launch_gap_ns = union_length(inner_gaps, span) - covered(inner_gaps);
  g.idle_other_ns = rest - g.idle_launch_gap_ns;
  return g;
}

}  // namespace torchpilot
