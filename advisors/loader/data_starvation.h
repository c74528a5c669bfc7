// What data_starvation sizes, for the advisors that state the same quantity (low_mfu's idle split):
// one worker count and one gain per epoch.
#pragma once

#include <optional>

#include "torchpilot/advisors/core/gain_models.h"
#include "torchpilot/runtime/core/records.h"

namespace torchpilot {

// The worker count the advice names: the loader model's (runtime/loader/loader_model.h) from the
// batch time over the median compute, at least the loader's own count; 0 without the loader's
// production counters.
int advised_workers(const EpochSummary& s);

// The data-starvation gain for that count (gains::starvation_gain).
std::optional<gains::StarvationGain> advised_starvation_gain(const EpochSummary& s);

}  // namespace torchpilot
