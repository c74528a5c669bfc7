// Limits and the epoch accumulator shared by the GpuMonitor's sources (gpu_monitor.cpp,
// gpu_monitor_steps.cpp).
#pragma once

#include <cstddef>

#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/gpu/gpu_epoch_accumulator.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"

namespace torchpilot::gpu_monitor_detail {

inline constexpr size_t kMaxPendingSteps = 1024;  // PM samples stalled: finish steps without them
inline constexpr size_t kMaxEvents = 1 << 20;  // per kind; a window of huge steps loses its oldest
inline constexpr size_t kMaxPhaseSpans = 256;
// Phase occurrences with markers per traced step (two markers each); a step with more is left out
// of the phase figures (its phases would be incomplete). Distinct phase names per epoch: as many.
inline constexpr size_t kMaxStepPhases = 64;
// A sync's drain may run into later steps: syncs and op scopes are kept this long after the
// oldest unfinished step began.
inline constexpr Nanos kSyncKeepNs = 2'000'000'000;

}  // namespace torchpilot::gpu_monitor_detail

namespace torchpilot {

// The epoch's sums (gpu_epoch_accumulator.h: shared with the Kineto trace analyzer).
struct GpuMonitor::EpochAcc : GpuEpochAccumulator {};

}  // namespace torchpilot
