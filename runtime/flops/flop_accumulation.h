// FLOP accumulation without LibTorch (docs/metrics.md, "MFU and FLOPs"): one step's count
// (StepFlops), the sums of the ops counted in a window (FlopTally), sums and means of counts
// (StepFlopsSum), an epoch's steps -> FlopEpochStats (FlopEpochAccumulator), and a step record's
// FLOP fields (fill_step_flops).
// Internal: used by hooks/flop_counter (flop_counter.h includes it for its members) and the tests;
// not part of the user API.
//
// Thread-safety: FlopTally, StepFlopsSum and FlopEpochAccumulator are not thread-safe; their
// owner serializes access. fill_step_flops is a plain function.
// Failure behaviour: nothing here throws; negative or NaN FLOPs are not added, and a step
// without a count gets NaN FLOPs and MFU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/flops/attention_detector.h"
#include "torchpilot/runtime/flops/device_peaks.h"
#include "torchpilot/runtime/flops/flop_formulas.h"
#include "torchpilot/runtime/flops/flop_records.h"

namespace torchpilot {

// ---- one step's count ---------------------------------------------------------------------------

struct StepFlops {
  double model_flops = 0;     // recomputation excluded
  double hardware_flops = 0;  // recomputation included
  PrecisionArray model_by_precision{};
  PrecisionArray hardware_by_precision{};
  std::vector<OpFlops> ops;      // model FLOPs by (op, precision), largest first
  std::vector<OpFlops> modules;  // model FLOPs by module name (`op`), largest first
  double unfused_attention_flops = 0;
  double unfused_attention = 0;  // forward instances
  double sdpa_math_fallback = 0;
  double unfused_attention_traffic_bytes = 0;
  double fused_attention_flops = 0;
  int64_t unparsed_calls = 0;
  // Nonzero: a cached count (FlopWindowPlanner) that many steps repeat; sums merge its ops and
  // modules once per id, not at every step.
  uint64_t id = 0;
};

// Sums of the ops counted in a window (the hook serializes calls).
class FlopTally {
 public:
  // `module`: the innermost named module the op ran in ("" for none).
  void add(std::string_view op, OpKind kind, MathPrecision precision, double flops, bool recompute,
           std::string_view module = {});
  void add_attention(const AttentionDelta& delta);
  void add_unparsed() { ++unparsed_; }
  void clear();
  bool empty() const { return ops_.empty() && unparsed_ == 0; }
  // The window's per-step means over `steps` steps.
  StepFlops per_step(int64_t steps) const;

 private:
  struct Sum {
    double model = 0, calls = 0;
  };
  std::map<std::pair<std::string, MathPrecision>, Sum> ops_;
  std::map<std::string, Sum, std::less<>> modules_;
  PrecisionArray model_{}, hardware_{};
  double fused_ = 0;
  AttentionDelta attention_;
  int64_t unparsed_ = 0;
};

// Sums of several StepFlops (a window, an epoch), with their per-step mean.
class StepFlopsSum {
 public:
  void add(const StepFlops& s, int64_t times = 1);  // `times` steps of this count
  int64_t steps() const { return steps_; }
  StepFlops mean() const;
  void clear() { *this = StepFlopsSum(); }

 private:
  int64_t steps_ = 0;
  StepFlops sum_;
  std::map<std::pair<std::string, MathPrecision>, OpFlops> ops_;
  std::map<std::string, OpFlops> modules_;
  // Cached counts by id: one copy and how many steps added it (merged into ops_ and modules_ by
  // mean()); a step costs an integer lookup instead of a string-keyed map update per op.
  struct Repeated {
    int64_t steps = 0;
    std::vector<OpFlops> ops, modules;
  };
  std::map<uint64_t, Repeated> repeated_;
  void merge(const std::vector<OpFlops>& ops, const std::vector<OpFlops>& modules, double times,
             std::map<std::pair<std::string, MathPrecision>, OpFlops>& to_ops,
             std::map<std::string, OpFlops>& to_modules) const;
};

// An epoch's steps -> FlopEpochStats.
class FlopEpochAccumulator {
 public:
  // count: the step's count (null: unknown); counted: its ops were counted (callbacks on).
  // Steps between counting windows repeat one count: a run of them is added at once (at the next
  // other step or summarize()), so that an ordinary step costs a comparison and two additions.
  void add_step(const StepFlops* count, double step_seconds, bool counted);
  FlopEpochStats summarize(const DevicePeak& peak);
  void clear() { *this = FlopEpochAccumulator(); }

  static constexpr size_t kTopOps = 10;
  static constexpr size_t kTopModules = 32;

 private:
  void add_run();
  // The latest uncounted step's cached count (its id; its figures without the op lists, which
  // the sum keeps by id), and the steps after it with the same count, not yet added.
  uint64_t run_id_ = 0;
  StepFlops run_count_;
  int64_t run_steps_ = 0;
  double run_seconds_ = 0;
  int64_t counted_steps_ = 0;
  StepFlopsSum known_;  // steps with a count
  double known_seconds_ = 0;
  PrecisionArray steady_model_{}, steady_hardware_{};  // steps with a count, not counted
  double steady_seconds_ = 0;
  int64_t steady_steps_ = 0;
  PrecisionArray window_model_{}, window_hardware_{};  // counted steps
  double window_seconds_ = 0;
};

// Fills a step record's FLOP fields from its count (NaN without one).
void fill_step_flops(StepRecord& record, const StepFlops* count, const DevicePeak& peak);

}  // namespace torchpilot
