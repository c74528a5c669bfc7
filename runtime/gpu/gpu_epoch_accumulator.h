// An epoch's GPU figures from its steps' (docs/metrics.md, "GPU"): time-weighted means of the PM
// and NVML figures, sums over the traced steps, the top kernels and the top host-sync call sites.
// The GPU monitor feeds it each finished step (gpu_step_stats); the Kineto trace analyzer
// (kineto_trace.h) feeds it the steps of a profiler trace, so both give the same numbers.
//
// Pure: no vendor, no LibTorch. Thread-safety: plain values; one owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"
#include "torchpilot/runtime/gpu/gpu_metrics.h"
#include "torchpilot/runtime/gpu/gpu_records.h"
#include "torchpilot/runtime/gpu/gpu_step_stats.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"

namespace torchpilot {

struct GpuEpochAccumulator {
  static constexpr size_t kTopKernels = 10;
  static constexpr size_t kTopSyncSites = 5;
  static constexpr size_t kMaxSyncSites = 256;  // distinct (cause, phase) per epoch

  // Sums of value x weight for the time-weighted epoch means; a field counts only where measured.
  struct Mean {
    double sum = 0, weight = 0;
    void add(double v, double w) {
      if (measured(v) && w > 0) {
        sum += v * w;
        weight += w;
      }
    }
    double get() const { return weight > 0 ? sum / weight : kNotMeasured; }
  };
  struct Sum {
    double sum = 0;
    bool any = false;
    void add(double v) {
      if (measured(v)) {
        sum += v;
        any = true;
      }
    }
    double get() const { return any ? sum : kNotMeasured; }
  };
  struct Kernel {
    int64_t launches = 0;
    Nanos ns = 0;
    double blocks_ns = 0, eff_ns = 0;
  };
  Nanos wall_ns = 0, pm_covered_ns = 0;
  Mean counter_utilization, sm_efficiency, tensor_activity, dram_throughput, achieved_occupancy,
      nvml_utilization, sm_clock_mhz, clock_limited, gpu_utilization, estimated_sm_efficiency;
  Sum pcie_read, pcie_write;
  GpuStats traced;  // integer sums over traced steps
  int64_t traced_steps = 0;
  int64_t traced_steps_left_out = 0;  // GpuEpochStats::traced_steps_left_out
  int64_t collections = 0;            // GpuEpochStats::collections, collect_ns, collect_drain_ns
  Nanos collect_ns = 0, collect_drain_ns = 0;
  int64_t steps_joined = 0;       // GpuEpochStats::steps_joined
  int64_t sync_probed_steps = 0;  // GpuEpochStats::sync_probed_steps, sync_probed_ns
  Nanos sync_probed_ns = 0;
  DurationHistogram ordinary_steps;      // GpuEpochStats::ordinary_steps, ordinary_step_p50_ns
  DurationHistogram ordinary_compute;    // GpuEpochStats::ordinary_compute_p50_ns
  Nanos ordinary_data_wait_ns = 0;       // GpuEpochStats::ordinary_data_wait_ns
  DurationHistogram ordinary_gpu_steps;  // GpuEpochStats::ordinary_gpu_steps, _step_p50_ns
  Nanos ordinary_gpu_ns = 0, ordinary_gpu_host_ns = 0;  // GpuEpochStats' sums of the same name
  int64_t gpu_timed_steps = 0, marker_timeouts = 0;
  int64_t steps = 0, earlier_steps = 0;
  int64_t own_thread_syncs = 0;
  std::map<std::string, Kernel> kernels;
  KernelClassStats classes;
  std::map<std::pair<std::string, std::string>, SyncSite> sync_sites;  // by (cause, phase)
  GpuPhaseTimes phases_gpu;                                            // GPU time by phase

  // One step's figures (gpu_step_stats).
  void add(const GpuStats& g);
  // A traced step's kernels inside its span, by name.
  void add_kernels(KernelRange records, Interval span, int sm_count);
  // A traced step's host syncs by call site (gpu_step_stats' `sites`).
  void add_sync_sites(const std::vector<SyncSite>& sites);
  // By GPU idle caused, then host wait; at most kTopSyncSites.
  std::vector<SyncSite> top_sync_sites() const;
  // The epoch's figures.
  GpuStats stats() const;
  // By traced time, longest first; at most kTopKernels.
  std::vector<KernelSummary> top_kernels() const;
};

}  // namespace torchpilot
