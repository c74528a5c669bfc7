// The Kineto trace's epoch summary: the parsed steps as one EpochSummary (kineto_epoch_summary).
#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

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
    for (const KinetoStep& k : t.steps) {
      std::vector<SyncSite> sites;
      const GpuStats g = gpu_step_stats(t.events, k.spans, sm, 0, &sites, &index);
      gpu.add(g);
      ++gpu.steps;
      if (k.spans.gpu_timed) ++gpu.gpu_timed_steps;
      if (g.traced_ns > 0) gpu.add_sync_sites(sites);
      if (k.spans.traced)
        gpu.add_kernels(index.overlapping(k.spans.figures()), k.spans.figures(), sm);
      add_kernel_classes(gpu.classes, t.events, k.spans, sm, &index);
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
      bool in_step = false;
      for (const KinetoStep& k : t.steps) {
        in_step = in_step || (r.begin_ns >= k.spans.host.begin && r.begin_ns < k.spans.host.end);
      }
      if (!in_step) continue;
      CommOpStats& o = ops[r.op];
      o.op = r.op;
      ++o.count;
      o.bytes += r.bytes;
      ++c.stats.collectives;
      c.stats.bytes += r.bytes;
    }
    // Communication time: the NCCL kernels in each step's GPU span, exposed where no compute
    // kernel or copy runs (gpu_window_metrics, as the trace windows' figures).
    std::vector<Interval> copies;
    for (const CopyRecord& r : t.events.copies) copies.push_back({r.begin, r.end});
    for (const KinetoStep& k : t.steps) {
      std::vector<KernelEvent> kernels;
      for (const KernelRecord& r : t.events.kernels) {
        kernels.push_back({r.begin, r.end, r.blocks, r.communication});
        if (r.communication && r.begin >= k.spans.gpu.begin && r.begin < k.spans.gpu.end) {
          c.stats.busy_ns += r.end - r.begin;
        }
      }
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
