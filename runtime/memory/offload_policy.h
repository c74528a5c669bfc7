// The activation-offloading stage of auto-tune (tuning.h, TuningPolicy), meant to run after the
// micro-batch's search (a sequence of stages): offloading is worth a trial only where memory, not
// throughput, ended that search. Its knob, "offload.enabled" {0, 1}, belongs to
// torchpilot::ActivationOffload (hooks/memory/activation_offload.h); the micro-batch's,
// "batch.micro", to the micro-batch search (docs/offload.md, "In auto-tune").
//
// What it proposes, from the best setting so far (the incumbent):
//   - nothing without the offload knob, or when offloading is already on;
//   - the incumbent failed (even the smallest micro-batch does not fit): offloading on at the
//     incumbent's micro-batch;
//   - else, the smallest micro-batch above the incumbent's that failed with offloading off (out
//     of memory, or a peak above the headroom), with offloading on; then, as long as a trial
//     neither fails nor falls below 85% of the best samples/s, the next larger micro-batch of the
//     knob's domain with offloading on;
//   - nothing when no larger micro-batch failed (memory did not limit the search).
// The trial engine keeps a setting with offloading only if its measured samples/s beat the best,
// net of the copies' cost; a run whose start did not fit keeps one that runs.
// Thread-safety: as every policy, called by the trial engine on the training thread.
#pragma once

#include <memory>
#include <string>

#include "torchpilot/runtime/core/tuning.h"

namespace torchpilot {

inline constexpr const char* kOffloadKnob = "offload.enabled";

std::unique_ptr<TuningPolicy> make_offload_policy(std::string micro_batch_knob = "batch.micro");

}  // namespace torchpilot
