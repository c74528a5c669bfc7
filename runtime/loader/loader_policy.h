// The loader's tuning policy: a stateful search over the loader knobs that the trial engine asks
// for the next setting to try (tuning.h, TuningPolicy).
#pragma once

#include <memory>

#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/tuning.h"

namespace torchpilot {

// Coordinate search over the loader knobs (loader.workers, loader.prefetch, loader.pin_memory,
// loader.device_prefetch): a doubling sweep of workers, then pinning and GPU prefetch toggled, then
// deeper prefetch, then bisection of workers around the best; then, in a data-parallel run, the
// gradient all-reduce's bucket size (grad_sync.bucket_mb) around its starting value
// (loader_policy.cpp has the details). Knobs that are not registered, or not available on this
// machine, are skipped.
std::unique_ptr<TuningPolicy> make_loader_policy(const AutotuneConfig& config);

}  // namespace torchpilot
