// The micro-batch's tuning policy and the policy that runs several searches one after the other
// (tuning.h, TuningPolicy). The knob, "batch.micro", belongs to torchpilot::Accumulation
// (hooks/memory/accumulation.h), which keeps the global batch by gradient accumulation whatever the
// micro-batch: only the work per kernel launch changes, never the optimization.
// Thread-safety: as every policy, called by the trial engine on the training thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/tuning.h"

namespace torchpilot {

inline constexpr const char* kMicroBatchKnob = "batch.micro";

// From the best setting so far, larger micro-batches in the knob's domain, one at a time, on
// through one that merely fails to win (a larger micro-batch's gain can sit under the noise
// margin while the next clears it), ending at a clear decline (below 85% of the best) or a
// failure (out of memory, or a peak above autotune.memory_headroom: larger ones would not fit
// either). When the start itself failed, smaller ones, largest first, until one runs. The best
// measured samples/s wins (the trial engine's comparison), not the largest that fits.
// Without the knob (no Accumulation attached) it proposes nothing.
std::unique_ptr<TuningPolicy> make_micro_batch_policy(const AutotuneConfig& config);

// Runs each stage's search in turn, each from the best setting the earlier ones found: a stage
// proposes until it has nothing more, then the next one starts. When the best setting moved
// during a pass (the knob `repeat_knob` in it; empty: any knob) and passes remain (max_passes),
// every stage runs again from the new best, each a fresh policy from its factory. Its name lists
// the stages that proposed a trial.
// A later stage joins here (e.g. "offload.enabled" after the micro-batch: offloading is worth
// trying when memory, not throughput, ended the micro-batch search).
using PolicyFactory = std::function<std::unique_ptr<TuningPolicy>()>;
struct PolicyStage {
  PolicyFactory make;
  // false: from the second pass on, the stage sees only the best at the pass's start and the
  // pass's own trials (for a search, as the loader's, that counts a value tried under other
  // settings as tried); true: every trial (a search that keeps what failed in earlier passes).
  bool whole_history = true;
};
std::unique_ptr<TuningPolicy> make_sequence_policy(std::vector<PolicyStage> stages,
                                                   int max_passes = 1,
                                                   std::string repeat_knob = {});

// What auto-tune runs (pilot.cpp): the loader's search, then the micro-batch's
// (autotune.tune_micro_batch), and both once more when the micro-batch search moved the best's
// micro-batch (kAutotunePasses passes at most). The loader comes first: a starved loader makes
// every micro-batch look alike (the steps wait for data). The second pass is there because a loader
// sized for the start's slower steps can starve a faster micro-batch. Without the micro-batch knob
// there is no second pass: the loader's search runs as alone.
inline constexpr int kAutotunePasses = 2;
std::unique_ptr<TuningPolicy> make_autotune_policy(const AutotuneConfig& config);

}  // namespace torchpilot
