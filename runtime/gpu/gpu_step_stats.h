// The GPU figures of one step from the events that overlap it (docs/metrics.md, "GPU"). Pure;
// tested on hand-made and captured timelines (gpu_monitor_test, cupti_replay_test).
#pragma once

#include <algorithm>
#include <limits>

#include "torchpilot/runtime/gpu/gpu_backend.h"
#include "torchpilot/runtime/gpu/gpu_metrics.h"

namespace torchpilot {

// Where one step lies in time.
struct StepSpans {
  Interval host;  // the training thread's step, [begin, end] on the steady clock
  // When the GPU ran the step: from the completion of the marker recorded on the trainer's stream
  // at its start boundary to that of its end boundary. Unknown (gpu_timed false) without markers.
  Interval gpu;
  bool gpu_timed = false;
  bool gpu_shared = false;  // gpu is the step's share of a span its neighbours share
  Nanos run_gpu_ns = 0;     // gpu_shared: the length of that shared span (the whole run's)
  Interval data_wait;       // the part of it the training thread waited for its batch
  bool traced = false;      // inside a detailed window
  // The trace covers the step from here on (a window's first step: from its scope's start).
  Nanos trace_from = std::numeric_limits<Nanos>::min();

  // The span the step's GPU figures cover: its GPU span when known, else its host span.
  Interval figures() const { return gpu_timed ? gpu : host; }
  // ... and the part of it the trace covers.
  Interval traced_part() const {
    Interval s = figures();
    s.begin = std::max(s.begin, trace_from);
    return s;
  }
};

// A run of kernel records (C++17 has no std::span).
struct KernelRange {
  const KernelRecord* first = nullptr;
  const KernelRecord* last = nullptr;
  const KernelRecord* begin() const { return first; }
  const KernelRecord* end() const { return last; }
  size_t size() const { return static_cast<size_t>(last - first); }
};

// Kernels indexed for the questions each finished step asks: which may overlap a span, and where
// the GPU is busy (the union of the kernels). A detailed window of 100 steps holds ~300,000
// kernels: scanning them all for each of its steps made finishing a window quadratic in its
// length. The GPU monitor holds its kernels ordered by start and builds one index per set of
// kernels, not one per step. Refers to `kernels`, which must outlive it unchanged.
class KernelIndex {
 public:
  explicit KernelIndex(const std::vector<KernelRecord>& kernels);
  // A range holding every kernel that overlaps `span` (and a few more: callers clip). All of them
  // when the kernels are not ordered by start.
  KernelRange overlapping(Interval span) const;
  // Those that start in [span.begin, span.end).
  KernelRange starting_in(Interval span) const;
  KernelRange all() const { return {kernels_.data(), kernels_.data() + kernels_.size()}; }
  // Where the GPU next starts a kernel at or after `t`: `t` itself when a kernel runs at `t` (no
  // drain), else the next kernel's start (the host had to refill the queue), else `never`.
  Nanos at_or_after(Nanos t, Nanos never) const;
  // The end of the last busy interval ending at or before `t` (min() when none): a sync that
  // returned before it cannot idle the GPU after `t` (a kernel ran after it returned).
  Nanos last_end_before(Nanos t) const;
  // How long the GPU was busy (some kernel running) inside `span`.
  Nanos busy_within(Interval span) const;
  // The GPU's idle gaps from `t` on, in order, until they add up to `budget` or reach `stop`.
  void gaps_after(Nanos t, Nanos budget, Nanos stop, std::vector<Interval>& out) const;

 private:
  const std::vector<KernelRecord>& kernels_;
  bool by_start_ = true;  // kernels_ ordered by begin
  Nanos longest_ = 0;     // the longest kernel: how far before a span an overlapping one can start
  std::vector<Interval> busy_;  // disjoint, ordered
};

// PM samples and NVML readings time-weighted over the step; when traced, kernel, copy and sync
// records too, and the idle time split by cause. Host syncs count in the step whose span holds
// the end of their wait. `sites` (optional) receives the step's syncs by call site (cause and
// phase), with the idle each caused in this step.
// `kernels` (optional): an index over events.kernels, built here for traced steps when absent.
GpuStats gpu_step_stats(const GpuEventBatch& events, const StepSpans& spans, int sm_count,
                        Nanos nvml_interval_ns, std::vector<SyncSite>* sites = nullptr,
                        const KernelIndex* kernels = nullptr);

// The host syncs in `events` with their causes (docs/metrics.md, "Host syncs by cause").
// Traced: CUPTI's sync records and device-to-host copies into pageable memory; those whose
// midpoint lies in an op scope become one sync with the scope's extent, op and phase (an
// .item() is one sync, not its copy and its stream synchronize); the others are named by their
// API. Untraced (no CUPTI records): the scopes of ops that always synchronize
// (HostOpScope::always). Only records and scopes that overlap `near` are looked at.
std::vector<SyncRecord> resolve_host_syncs(const GpuEventBatch& events, bool traced,
                                           Interval near = {std::numeric_limits<Nanos>::min(),
                                                            std::numeric_limits<Nanos>::max()});

}  // namespace torchpilot
