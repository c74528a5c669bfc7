// Vendor-neutral GPU records (docs/metrics.md, "GPU"; docs/records.md): what the GPU collectors
// (hooks/, CUPTI PM sampling and activity, NVML) measured over a step or an epoch. Plain values.
// A figure that was not measured is NaN (JSON: null); `estimated` flags say when a figure comes
// from a model rather than a counter.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"

namespace torchpilot {

// GPU figures over a span of wall time (one step, or an epoch).
struct GpuStats {
  Nanos wall_ns = 0;  // the span these figures cover
  // Always-on (hardware counters and NVML), time-weighted over the span.
  double counter_utilization = kNotMeasured;  // gr__cycles_active: the GPU's busy fraction
  double sm_efficiency = kNotMeasured;        // sm__cycles_active: mean fraction of SMs busy
  double tensor_activity = kNotMeasured;      // sm__pipe_tensor_cycles_active, % of peak / 100
  double dram_throughput = kNotMeasured;      // dram__throughput, % of peak / 100
  double achieved_occupancy = kNotMeasured;   // sm__warps_active, % of peak sustained / 100
  double pcie_read_bytes = kNotMeasured;      // pcie__read_bytes.sum over the span
  double pcie_write_bytes = kNotMeasured;
  double nvml_utilization = kNotMeasured;  // NVML utilization.gpu (what nvidia-smi shows)
  double sm_clock_mhz = kNotMeasured;      // NVML SM clock while busy: mean of the readings with
                                           // utilization.gpu >= 50% (MHz)
  double clock_limited = kNotMeasured;     // share of those readings with the clock held down by
                                           // a limit (power cap, thermal, slowdown, power brake)
  Nanos pm_covered_ns = 0;  // the part of the span PM samples cover (epoch means weigh by it)
  // Detailed windows only (CUPTI activity trace); traced_ns is the part of the span traced.
  Nanos traced_ns = 0;
  double gpu_utilization = kNotMeasured;          // kernel-interval union / traced time
  double estimated_sm_efficiency = kNotMeasured;  // from launch shapes (gpu_metrics.h)
  int64_t kernels = 0;
  // Host syncs whose wait ended in the span (docs/metrics.md, "Host syncs by cause").
  Nanos host_sync_ns = 0;  // host blocked in synchronizing calls (union of their waits)
  int64_t host_syncs = 0;
  int64_t h2d_bytes = 0;           // host-to-device copies
  int64_t h2d_pageable_bytes = 0;  // ... of which from pageable (not pinned) memory
  Nanos h2d_pageable_ns = 0;
  // Communication kernels (NCCL): the union of their intervals in the span (with the launch gaps
  // before them), and the part of it in which no compute kernel or copy ran (docs/metrics.md).
  Nanos comm_ns = 0;
  Nanos exposed_comm_ns = 0;
  // Idle time (no kernel running) split by cause, one cause per second, first match wins; the
  // five add up to traced idle time.
  Nanos idle_data_wait_ns = 0;      // the training thread was waiting for a batch
  Nanos idle_host_sync_ns = 0;      // ... was in a synchronizing call, or the queue it drained
                                    // had not been refilled yet
  Nanos idle_pageable_copy_ns = 0;  // ... was in a pageable host-to-device copy (same drain)
  Nanos idle_launch_gap_ns = 0;     // between two kernels of the step, none of the above
  Nanos idle_other_ns = 0;          // before the first or after the last kernel, none of the above
};

// The host syncs of one call site: the op (or API) that blocked, in one phase.
struct SyncSite {
  std::string cause;  // "aten::item", or the API ("cudaDeviceSynchronize") outside any op
  std::string api;    // the call it blocked in (to_string(SyncApi)); "unknown" outside windows
  std::string phase;  // the Pilot's phase it began in; empty outside phases
  int64_t count = 0;
  Nanos host_wait_ns = 0;  // the host's time blocked in them
  Nanos idle_ns = 0;       // GPU idle they caused (their part of idle_host_sync_ns)
  // Of `count`, by the thread that made the call (SyncThread); the rest: thread unknown.
  int64_t trainer_calls = 0, other_thread_calls = 0;
  // CUPTI's stream and CUDA event ids of the latest call (-1: not applicable or unknown).
  int64_t stream_id = -1, event_id = -1;
};

// One kernel name's share of the traced time in an epoch's detailed windows.
struct KernelSummary {
  std::string name;  // demangled where CUPTI gives a mangled name
  int64_t launches = 0;
  Nanos total_ns = 0;
  double mean_blocks_per_sm = 0;       // grid blocks / SMs, duration-weighted
  double estimated_sm_efficiency = 0;  // min(1, blocks / SMs), duration-weighted
};

// One Pilot phase's GPU time in an epoch's traced steps (docs/metrics.md, "GPU time of a
// phase"): from the GPU reaching the marker recorded on the trainer's stream at the phase's start
// to it reaching the one at its end. Only phases of traced, GPU-timed steps whose two markers
// resolved count (`count` of them).
struct GpuPhaseStats {
  std::string name;
  int64_t count = 0;  // occurrences with a GPU span (a phase run twice in a step counts twice)
  Nanos gpu_ns = 0;   // its GPU spans, summed
  Nanos busy_ns = 0;  // the kernel union inside them (any stream)
  Nanos host_ns = 0;  // the same occurrences' host spans, summed
};

// An epoch's GPU time by Pilot phase (the "gpu" section's `phases_gpu`).
struct GpuPhaseTimes {
  std::vector<GpuPhaseStats> phases;  // in order of first appearance
  int64_t steps = 0;                  // the traced, GPU-timed steps they were measured over
  Nanos step_gpu_ns = 0;              // those steps' GPU spans summed: the shares' whole
  Nanos covered_ns = 0;               // the part of it inside some phase's GPU span
  Nanos outside_ns() const { return step_gpu_ns > covered_ns ? step_gpu_ns - covered_ns : 0; }
  // Traced steps left out: a phase marker not recorded (more than 64 phases in the step, or the
  // marker events kept for step markers) or not resolved.
  int64_t incomplete_steps = 0;
};

// The GPU backend's collectors, by the names CollectorStatus uses.
inline constexpr const char* kPmSamplingCollector = "pm_sampling";
inline constexpr const char* kActivityCollector = "activity";
inline constexpr const char* kNvmlCollector = "nvml";
inline constexpr const char* kNvtxCollector = "nvtx";

// Why a collector is off, reported once.
struct CollectorStatus {
  std::string name;  // "pm_sampling", "activity", "nvml", "nvtx"
  bool active = false;
  std::string reason;  // empty when active
};

// The epoch summary's "gpu" section.
struct GpuEpochStats {
  static constexpr const char* kSectionName = "gpu";
  std::string device;     // e.g. "NVIDIA H200"
  int device_index = -1;  // the CUDA device observed (gpu.device); -1: unknown (a Kineto trace)
  int sm_count = 0;
  GpuStats stats;
  int64_t traced_steps = 0;  // steps inside detailed windows
  // Windows' first steps left out of the traced figures (counted as untraced): their own work
  // was more than twice the median of their window's other steps (a trace's start holding the
  // GPU). Not anomaly windows, whose first step is what they are for.
  int64_t traced_steps_left_out = 0;
  int64_t gpu_timed_steps = 0;  // steps attributed by their GPU span (step markers resolved)
  int64_t marker_timeouts = 0;  // steps whose markers did not resolve in time: host span used
  // The epoch's end does not wait long for the GPU (gpu.epoch_end_wait_ms, cost.budget): steps
  // whose GPU work or samples were not final then count in the next epoch's figures.
  int64_t steps = 0;                       // steps whose figures are in this section
  int64_t carried_steps = 0;               // this epoch's steps left to the next epoch's section
  int64_t earlier_steps = 0;               // steps of earlier epochs counted here
  Nanos epoch_end_wait_ns = 0;             // how long the epoch's end waited for the GPU
  std::vector<KernelSummary> top_kernels;  // by traced time, longest first
  std::vector<SyncSite> top_sync_sites;    // traced steps; by idle caused, then host wait
  std::vector<CollectorStatus> collectors;
  int64_t dropped_records = 0;  // trace records lost to full buffers, samples never drained
  // The longest the GPU monitor held the training thread at one step boundary this epoch (a
  // window's start or end included): its stall, measured.
  Nanos max_step_call_ns = 0;
  // The collections this epoch (every 100 ms of host time, each step in and around a window): the
  // backend drained and the steps whose GPU figures were ready finished. Their time on the
  // training thread, and the drain's share of it: in the step calls' gpu part where a step call
  // took the batch, in the epoch end's where it did (its last batch of short steps).
  int64_t collections = 0;
  Nanos collect_ns = 0;
  Nanos collect_drain_ns = 0;
  // Of `steps`, those finished a joined run at a time (untraced, their late records read by
  // nobody: one computation over consecutive steps' joined span).
  int64_t steps_joined = 0;
  // Ordinary steps after a window that saw host syncs, timed by the sync probe (item(), copies
  // to the host; no trace): how long the host waits in those syncs when launches are not slowed
  // by tracing. The window's own waits are shorter where tracing made the host the slower side.
  int64_t sync_probed_steps = 0;
  Nanos sync_probed_ns = 0;
  // The epoch's ordinary steps (no trace attached, no window's release running, not probed),
  // their median host step, their median step less its data wait (EpochSummary::compute_p50_ns
  // over them) and their data wait in total: a short epoch's window and release can be half of
  // its steps, and a traced step both runs longer and waits less (the loader had longer).
  int64_t ordinary_steps = 0;
  Nanos ordinary_step_p50_ns = 0;
  Nanos ordinary_compute_p50_ns = 0;
  Nanos ordinary_data_wait_ns = 0;
  // Those of them whose GPU span is known (step markers resolved), and its median: where the GPU
  // is the slower side, the host runs ahead after any stall (a window's release, the first
  // steps) until the launch queue is full again, and those steps' host time is no step's length
  // (a planted fp32 GPT: 5-8 ms on the host for 32 ms on the GPU).
  int64_t ordinary_gpu_steps = 0;
  Nanos ordinary_gpu_step_p50_ns = 0;
  // Those steps' GPU lengths in total, and their host lengths taken the same way (a run's mean
  // where they share markers): the GPU is the slower side only against the same steps. Two
  // medians are not paired (a GPU span after a burst holds the backlog it built), and the
  // host's median step is no run's mean: a loader's bursty waits (2 and 30 ms steps) put it
  // well below.
  Nanos ordinary_gpu_ns = 0;
  Nanos ordinary_gpu_host_ns = 0;
  int64_t own_thread_syncs = 0;  // sync records of torchpilot's own threads: never host syncs
  // The next trace window at the epoch's end: "planned" (from step next_window_step on),
  // "deferred" (due, waiting for room in the cost budget), "done" (the run's windows ran, none
  // due), "off" (no activity trace here). Advice that needs a window says so.
  std::string next_window = "off";
  int64_t next_window_step = -1;
  // Windows opened on the budget's word whose cost was complete this epoch (after the step that
  // followed their release): what they were predicted to cost beside what they cost (the steps'
  // work above the median, torchpilot's calls in them, the epoch end's part while one was open).
  int64_t windows_predicted = 0;
  Nanos window_estimate_ns = 0;
  Nanos window_cost_ns = 0;
  int64_t windows_cut = 0;  // windows ended before their steps: the budget had no more room
  // Traced time by kernel class (kernel_classes.h).
  KernelClassStats kernel_classes;
  GpuPhaseTimes phases_gpu;  // traced time by Pilot phase
};

// GPU figures of one step; published after the step, once its samples and trace records arrived.
struct GpuStepRecord {
  static constexpr const char* kSectionName = "gpu";
  static constexpr const char* kRecordType = "gpu_step";
  int64_t step = 0;
  int64_t epoch = 0;
  bool traced = false;  // inside a detailed window
  // The step's GPU span (steady clock): from the GPU reaching the marker at its start boundary to
  // it reaching the one at its end. gpu_timed false: unknown, the figures cover the host span.
  bool gpu_timed = false;
  // The step shares its markers with its neighbours (gpu.marker_interval_ms): its GPU span is its
  // host time's share of theirs, not its own.
  bool gpu_shared = false;
  Nanos gpu_begin_ns = 0, gpu_end_ns = 0;
  Nanos gpu_lag_ns = 0;   // GPU span end - host span end: how far the GPU ran behind the host
  int device_index = -1;  // the CUDA device observed (gpu.device); -1: unknown
  GpuStats stats;
};

std::string section_json(const GpuEpochStats& gpu);
// The "GPU" line (utilization beside SM efficiency, tensor, DRAM, occupancy; MFU from the
// epoch's FlopEpochStats when present) and the traced-steps line.
void section_text(const GpuEpochStats& gpu, const EpochSummary& epoch,
                  std::vector<std::string>& lines);
std::string section_json(const GpuStepRecord& step);
inline void section_text(const GpuStepRecord&, const EpochSummary&, std::vector<std::string>&) {}

}  // namespace torchpilot
