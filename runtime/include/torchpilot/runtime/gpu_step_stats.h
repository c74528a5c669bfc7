// The GPU figures of one step from the events that overlap it (docs/metrics.md, "GPU"). Pure;
// tested on hand-made and captured timelines (gpu_monitor_test, cupti_replay_test).
#pragma once

#include <algorithm>
#include <limits>

#include "torchpilot/runtime/gpu_backend.h"
#include "torchpilot/runtime/gpu_metrics.h"

namespace torchpilot {

// Where one step lies in time.
struct StepSpans {
  Interval host;  // the training thread's step, [begin, end] on the steady clock
  // When the GPU ran the step: from the completion of the marker recorded on the trainer's stream
  // at its start boundary to that of its end boundary. Unknown (gpu_timed false) without markers.
  Interval gpu;
  bool gpu_timed = false;
  Interval data_wait;   // the part of it the training thread waited for its batch
  bool traced = false;  // inside a detailed window
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

// PM samples and NVML readings time-weighted over the step; when traced, kernel, copy and sync
// records too, and the idle time split by cause. Host syncs count in the step whose span holds
// the end of their wait. `sites` (optional) receives the step's syncs by call site (cause and
// phase), with the idle each caused in this step.
GpuStats gpu_step_stats(const GpuEventBatch& events, const StepSpans& spans, int sm_count,
                        Nanos nvml_interval_ns, std::vector<SyncSite>* sites = nullptr);

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
