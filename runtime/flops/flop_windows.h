// When to count FLOPs (docs/metrics.md, "MFU and FLOPs"): FlopWindowPlanner decides which steps
// the counter's callbacks are on for, and which count applies to every other step.
// Internal: used by hooks/flop_counter (flop_counter.h includes it for its members) and the tests;
// not part of the user API.
//
// Thread-safety: FlopWindowPlanner is not thread-safe; its owner serializes access.
// Failure behaviour: nothing here throws; a step whose samples were never counted gets no count
// (null).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/flops/flop_accumulation.h"

namespace torchpilot {

// When to count. The first window opens after `skip_steps` steps and counts `count_steps` steps;
// their mean is the count of every later step with the same samples per step (StepRecord::samples;
// up to 8 sample counts are remembered). A step whose samples have no count opens a new window at
// the next step (no skip); so does every `recount_every_steps`-th step (if > 0), and recount().
// A counted step gets its own count. A window whose steps' samples differ restarts.
class FlopWindowPlanner {
 public:
  explicit FlopWindowPlanner(const FlopConfig& config);
  // At a step's start: count this step's ops?
  bool begin_step();
  // A step's end, with its own count if it was counted (begin_step said so), in step order but
  // not necessarily before the next begin_step (the counter adds uncounted steps' figures in
  // batches). Returns the count that applies to the step, or null (no count yet for its samples).
  const StepFlops* end_step(int64_t samples, const StepFlops* counted);
  void recount();
  // Count from the next step on, the counts kept (the counter forgets them with recount() once
  // the steps before have their figures).
  void start_counting();
  // A window is open, or opens with the next step.
  bool counting() const { return state_ == State::kCounting; }
  // Windows completed so far.
  int64_t windows() const { return windows_; }
  const StepFlops* count_for(int64_t samples) const;

  static constexpr size_t kMaxCached = 8;

 private:
  enum class State { kSkipping, kCounting, kIdle };
  void store(int64_t samples, StepFlops count);
  FlopConfig config_;
  State state_;
  int64_t steps_ = 0;         // steps ended
  int64_t since_window_ = 0;  // steps ended since the last window completed
  int64_t window_samples_ = 0;
  std::optional<int64_t> window_target_;  // the window counts this sample count (new shapes)
  StepFlopsSum window_;
  int64_t windows_ = 0;
  StepFlops last_counted_;
  std::vector<std::pair<int64_t, StepFlops>> cache_;  // most recent first
};

}  // namespace torchpilot
