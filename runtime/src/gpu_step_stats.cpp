#include "torchpilot/runtime/gpu_step_stats.h"

#include <algorithm>

#include "torchpilot/runtime/gpu_metrics.h"

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

}  // namespace

GpuStats gpu_step_stats(const GpuEventBatch& events, const StepSpans& spans, int sm_count,
                        Nanos nvml_interval_ns) {
  // GPU figures belong to the step whose GPU span contains them (host span when unknown).
  Interval span = spans.gpu_timed ? spans.gpu : spans.host;
  const Interval data_wait = spans.data_wait;
  const bool traced = spans.traced;
  const Nanos trace_from = spans.trace_from;
  GpuStats g;
  g.wall_ns = std::max<Nanos>(0, span.end - span.begin);
  if (g.wall_ns == 0) return g;

  const auto& pm = events.pm;
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
  double nv_sum = 0;
  int nv_n = 0;
  const UtilSample* latest = nullptr;
  for (const UtilSample& u : events.nvml) {
    if (u.time >= span.begin && u.time <= span.end) {
      nv_sum += u.utilization;
      ++nv_n;
    } else if (u.time > span.end && u.time <= span.end + nvml_interval_ns &&
               (latest == nullptr || u.time < latest->time)) {
      latest = &u;
    }
  }
  if (nv_n > 0) {
    g.nvml_utilization = nv_sum / nv_n;
  } else if (latest != nullptr) {
    g.nvml_utilization = latest->utilization;
  }

  if (!traced) return g;
  // The trace covers the step from `trace_from` on (a window's first step: from its scope's start).
  span.begin = std::max(span.begin, trace_from);
  if (span.end <= span.begin) return g;
  g.traced_ns = span.end - span.begin;
  std::vector<KernelEvent> kernels;
  std::vector<Interval> busy;
  Nanos first_kernel = span.end, last_kernel = span.begin;
  for (const KernelRecord& k : events.kernels) {
    const Interval i{std::max(k.begin, span.begin), std::min(k.end, span.end)};
    if (i.end <= i.begin) continue;
    kernels.push_back({k.begin, k.end, k.blocks, k.communication});
    busy.push_back(i);
    first_kernel = std::min(first_kernel, i.begin);
    last_kernel = std::max(last_kernel, i.end);
    if (k.begin >= span.begin) ++g.kernels;  // counted in the step it started in
  }
  const GpuWindowMetrics m = gpu_window_metrics(kernels, span, std::max(1, sm_count));
  g.gpu_utilization = m.gpu_utilization;
  g.estimated_sm_efficiency = m.estimated_sm_efficiency;

  // Host syncs are the training thread's: counted over its (traced) host span. Those over the GPU
  // span explain the idle gaps below.
  const Interval host{std::max(spans.host.begin, trace_from), spans.host.end};
  std::vector<Interval> host_syncs, syncs;
  for (const SyncRecord& s : events.syncs) {
    if (overlap({s.begin, s.end}, span) > 0) syncs.push_back({s.begin, s.end});
    if (overlap({s.begin, s.end}, host) <= 0) continue;
    host_syncs.push_back({s.begin, s.end});
    if (s.begin >= host.begin) ++g.host_syncs;
  }
  if (host.end > host.begin) g.host_sync_ns = union_length(host_syncs, host);
  for (const CopyRecord& c : events.copies) {
    if (c.memset || c.kind != CopyKind::kHostToDevice) continue;
    if (c.begin < span.begin || c.begin >= span.end) continue;
    g.h2d_bytes += c.bytes;
    if (c.pageable) {
      g.h2d_pageable_bytes += c.bytes;
      g.h2d_pageable_ns += c.end - c.begin;
    }
  }

  // Idle = the span minus the kernel union; each idle gap is split by cause, data wait first.
  std::sort(busy.begin(), busy.end(),
            [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  std::vector<Interval> gaps;
  Nanos cursor = span.begin;
  for (const Interval& b : busy) {
    if (b.begin > cursor) gaps.push_back({cursor, b.begin});
    cursor = std::max(cursor, b.end);
  }
  if (span.end > cursor) gaps.push_back({cursor, span.end});
  // A gap that starts while the host is blocked in a synchronizing call is the sync's doing: the
  // GPU drained while the host waited, and stays idle until the host launches again.
  const std::vector<Interval> wait{data_wait};
  auto starts_in_sync = [&](Nanos t) {
    for (const Interval& s : syncs) {
      if (t >= s.begin && t <= s.end) return true;
    }
    return false;
  };
  for (const Interval& gap : gaps) {
    const std::vector<Interval> one{gap};
    const Nanos len = gap.end - gap.begin;
    const Nanos dw = intersection_length(one, wait, span);
    const Nanos sync = starts_in_sync(gap.begin) ? len - dw : 0;
    const Nanos rest = std::max<Nanos>(0, len - dw - sync);
    g.idle_data_wait_ns += dw;
    g.idle_host_sync_ns += sync;
    if (!kernels.empty() && gap.begin >= first_kernel && gap.end <= last_kernel) {
      g.idle_launch_gap_ns += rest;
    } else {
      g.idle_other_ns += rest;
    }
  }
  return g;
}

}  // namespace torchpilot
