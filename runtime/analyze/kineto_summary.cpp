// The Kineto trace's epoch summary: the parsed steps as one EpochSummary (kineto_epoch_summary).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <utility>

#include "kineto_trace_internal.h"
#include "torchpilot/runtime/analyze/kineto_trace.h"
#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/flops/device_peaks.h"
#include "torchpilot/runtime/gpu/gpu_epoch_accumulator.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"

namespace torchpilot {

EpochSummary kineto_epoch_summary(const KinetoTrace& t, const KinetoOptions& options) {
  EpochAccumulator acc;
  for (size_t i = 0; i < t.steps.size(); ++i) {
    const KinetoStep& k = t.steps[i];
    StepRecord r;
    r.step = static_cast<int64_t>(i);
    r.step_in_epoch = static_cast<int64_t>(i);
    // The step's time is its GPU span: in a few profiled steps a host running ahead of a
    // GPU-bound queue is not yet throttled by it, as it is in a long run (docs/analyze.md).
    r.begin_ns = k.spans.figures().begin;
    r.end_ns = k.spans.figures().end;
    r.data_wait_ns = k.data_wait_ns;
    r.phase_ns = k.phase_ns;
    acc.add(r);
  }
  EpochSummary summary = acc.summarize(0, t.phases);
  summary.epoch = 1;
  // The steps are GPU spans here, so their shortest is no issue time: the host's own spans are
  // (a host that ran ahead of the queue), less their data wait (gain models' host floor).
  summary.compute_min_ns = 0;
  for (const KinetoStep& k : t.steps) {
    const Nanos own = std::max<Nanos>(0, k.spans.host.end - k.spans.host.begin - k.data_wait_ns);
    if (own > 0 && (summary.compute_min_ns == 0 || own < summary.compute_min_ns)) {
      summary.compute_min_ns = own;
    }
  }

  const std::string device = options.device_name.empty() ? t.device : options.device_name;
  if (!t.device.empty() || !options.device_name.empty()) {
    GpuEpochAccumulator gpu;
    const int sm = std::max(1, t.sm_count);
    const KernelIndex index(t.events.kernels);  // one for all the trace's steps
    // Each step sees the copies, syncs and op scopes from the previous step's start to its end
    // (kernels through the index): a sync's drain counts in the step it ends in and the next.
    // The live library looks back up to a second, a window of ~100 steps; over all of a trace
    // of 20,000 short steps that look-back made the analysis quadratic.
    const auto& ev = t.events;
    kineto_detail::Overlaps copies_in(
        ev.copies.size(), [&](size_t i) { return ev.copies[i].begin; },
        [&](size_t i) { return ev.copies[i].end; });
    kineto_detail::Overlaps syncs_in(
        ev.syncs.size(), [&](size_t i) { return ev.syncs[i].begin; },
        [&](size_t i) { return ev.syncs[i].end; });
    kineto_detail::Overlaps scopes_in(
        ev.scopes.size(), [&](size_t i) { return ev.scopes[i].begin; },
        [&](size_t i) { return ev.scopes[i].end; });
    std::vector<size_t> found;
    Nanos look_back = std::numeric_limits<Nanos>::min();
    for (size_t i = 0; i < t.steps.size(); ++i) {
      const KinetoStep& k = t.steps[i];
      const Interval span = k.spans.figures();
      const Interval previous = i > 0 ? t.steps[i - 1].spans.figures() : span;
      look_back = std::max(look_back, std::min({previous.begin, span.begin, k.spans.host.begin}));
      const Nanos until = std::max(span.end, k.spans.host.end);
      GpuEventBatch near;
      copies_in.find(look_back, until, found);
      for (size_t c : found) near.copies.push_back(ev.copies[c]);
      syncs_in.find(look_back, until, found);
      for (size_t c : found) near.syncs.push_back(ev.syncs[c]);
      scopes_in.find(look_back, until, found);
      for (size_t c : found) near.scopes.push_back(ev.scopes[c]);
      std::vector<SyncSite> sites;
      const GpuStats g = gpu_step_stats(near, k.spans, sm, 0, &sites, &index);
      gpu.add(g);
      ++gpu.steps;
      if (k.spans.gpu_timed) ++gpu.gpu_timed_steps;
      if (g.traced_ns > 0) gpu.add_sync_sites(sites);
      if (k.spans.traced) gpu.add_kernels(index.overlapping(span), span, sm);
      add_kernel_classes(gpu.classes, near, k.spans, sm, &index);
    }
    GpuEpochStats e;
    e.device = device;
    e.sm_count = t.sm_count;
    e.stats = gpu.stats();
    e.traced_steps = gpu.traced_steps;
    e.gpu_timed_steps = gpu.gpu_timed_steps;
    e.steps = gpu.steps;
    e.top_kernels = gpu.top_kernels();
    e.top_sync_sites = gpu.top_sync_sites();
    e.kernel_classes = gpu.classes;
    e.collectors = {
        {kPmSamplingCollector, false, "not in a Kineto trace"},
        {kActivityCollector, true, ""},
        {kNvmlCollector, false, "not in a Kineto trace"},
        {kNvtxCollector, false, "not in a Kineto trace"},
    };
    summary.sections.set(std::move(e));
  }

  if (t.shapes) {
    FlopEpochAccumulator flops;
    for (const KinetoStep& k : t.steps) {
      // Every profiled step ran with the profiler's callbacks on: all are "counted" steps.
      flops.add_step(k.flops_known ? &k.flops : nullptr,
                     static_cast<double>(k.spans.figures().end - k.spans.figures().begin) / 1e9,
                     true);
    }
    summary.sections.set(flops.summarize(resolve_peak(device, options.peak_tflops)));
  }

  if (!t.collectives.empty() || !t.comm_backend.empty()) {
    CommEpochStats c;
    c.backend = t.comm_backend;
    c.rank = t.rank;
    c.world_size = t.world_size;
    c.method =
        "GPU: communication kernels not overlapped by compute kernels or copies (Kineto trace)";
    c.steps = static_cast<int64_t>(t.steps.size());
    c.step_wall_ns = summary.wall_ns;
    std::map<CommOp, CommOpStats> ops;
    for (const CollectiveRecord& r : t.collectives) {
      // In a step: the last step starting at or before it holds it (steps never overlap).
      const auto after =
          std::upper_bound(t.steps.begin(), t.steps.end(), r.begin_ns,
                           [](Nanos at, const KinetoStep& k) { return at < k.spans.host.begin; });
      if (after == t.steps.begin() || r.begin_ns >= std::prev(after)->spans.host.end) continue;
      CommOpStats& o = ops[r.op];
      o.op = r.op;
      ++o.count;
      o.bytes += r.bytes;
      ++c.stats.collectives;
      c.stats.bytes += r.bytes;
    }
    // Communication time: the NCCL kernels in each step's GPU span, exposed where no compute
    // kernel or copy runs (gpu_window_metrics, as the trace windows' figures). The kernels and
    // copies near each span come from the index and a sweep, not from all of the trace.
    const KernelIndex index(t.events.kernels);
    kineto_detail::Overlaps copies_in(
        t.events.copies.size(), [&](size_t i) { return t.events.copies[i].begin; },
        [&](size_t i) { return t.events.copies[i].end; });
    std::vector<size_t> found;
    for (const KinetoStep& k : t.steps) {
      std::vector<KernelEvent> kernels;
      for (const KernelRecord& r : index.overlapping(k.spans.gpu)) {
        kernels.push_back({r.begin, r.end, r.blocks, r.communication});
        if (r.communication && r.begin >= k.spans.gpu.begin && r.begin < k.spans.gpu.end) {
          c.stats.busy_ns += r.end - r.begin;
        }
      }
      std::vector<Interval> copies;
      copies_in.find(k.spans.gpu.begin, k.spans.gpu.end, found);
      for (size_t i : found) copies.push_back({t.events.copies[i].begin, t.events.copies[i].end});
      const GpuWindowMetrics m =
          gpu_window_metrics(kernels, k.spans.gpu, std::max(1, t.sm_count), copies);
      c.stats.comm_ns += m.comm_ns;
      c.stats.exposed_ns += m.exposed_comm_ns;
    }
    // Per op: the kernels' time shared by bytes (a kernel is not tied to its collective here).
    std::vector<CommOpStats> op_stats;
    for (auto& [op, o] : ops) {
      o.busy_ns = c.stats.bytes > 0 ? static_cast<Nanos>(static_cast<double>(c.stats.busy_ns) *
                                                         static_cast<double>(o.bytes) /
                                                         static_cast<double>(c.stats.bytes))
                                    : 0;
      op_stats.push_back(o);
    }
    set_op_bandwidths(c, std::move(op_stats));
    if (options.link_peak_gbps > 0) c.link_peak = options.link_peak_gbps * 1e9;
    summary.sections.set(std::move(c));
  }
  return summary;
}

}  // namespace torchpilot
