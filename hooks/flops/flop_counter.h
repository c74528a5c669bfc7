// FlopCounter: counts the FLOPs a training step runs from LibTorch's RecordFunction callbacks and
// reports them with MFU/HFU per step (StepRecord::metrics, section "flops") and per epoch (the
// summary's "flops" section, FlopEpochStats).
// docs/metrics.md, "MFU and FLOPs", has the definitions.
//
//   torchpilot::Pilot pilot(config);
//   torchpilot::FlopCounter flops(pilot);         // after the Pilot, before the first step
//   for (...) { auto step = pilot.step(batch); ... }
//
// How it counts:
//   - One global RecordFunction callback (scopes FUNCTION and BACKWARD_FUNCTION, with inputs). It
//     is disabled outside counting windows, so steady-state steps pay nothing; boxing the inputs
//     is what makes a counted step slower.
//   - Windows (FlopWindowPlanner, flop_windows.h): `flops.count_steps` steps after
//   `flops.skip_steps`;
//     again when a step's samples (StepRecord::samples) have no count yet, every
//     `flops.recount_every_steps` steps (if > 0), and after recount(). The mean of a window is
//     the count of every later step with the same samples; a counted step carries its own count;
//     a step whose samples were never counted has NaN FLOPs.
//   - Leaf ops only: an op with a FLOP formula (flop_formulas.h, OpKind) counts only when no other
//   such
//     op ran inside it (aten::matmul -> aten::mm, aten::_convolution -> aten::mkldnn_convolution,
//     autocast's re-dispatched aten::mm with bf16 inputs inside the fp32 one: the innermost
//     counts). Tracked per thread; backward ops arrive on autograd threads, so the per-window
//     sums are guarded by a mutex.
//   - Precision: the operands' dtype; fp32 on CUDA counts as TF32 when
//     at::globalContext().allowTF32CuBLAS() (matmuls) or allowTF32CuDNN() (convolutions) is on
//     at the window's start.
//   - Unfused attention: the AttentionDetector heuristic of attention_detector.h on each thread's
//   sequence of
//     leaf matmuls and softmaxes (a softmax over the last dim of a rank >= 3 tensor with a matmul
//     producing/consuming that matrix shape before it and one after it). SDPA's fused ops count
//     as fused attention; an unfused one found while aten::scaled_dot_product_attention is open
//     is its math fallback.
//   - Peak: in CUDA builds the name of CUDA device `gpu.device` picks the row of the device table;
//     `flops.peak_tflops` > 0 overrides it. No peak (CPU, unknown GPU): FLOPs are reported, MFU
//     and HFU are NaN. `flops.allow_tf32: true` turns TF32 on for cuBLAS at construction.
//
// Thread-safety: construct, destroy, recount(), counting() and the collector calls on the training
// thread. RecomputeScope on any thread: it marks that thread's ops. One FlopCounter per process
// counts; a second one made while the first lives is inert (logged).
// Failure behaviour: the constructor does not throw for a missing GPU; after construction nothing
// throws. Callback errors are swallowed (an op whose arguments cannot be read is counted as
// unparsed and reported in FlopEpochStats::unparsed_calls); collector errors are logged once.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/flops/device_peaks.h"
#include "torchpilot/runtime/flops/flop_accumulation.h"
#include "torchpilot/runtime/flops/flop_windows.h"

namespace torchpilot {

// Names a module for FLOP attribution: the ops that run on this thread while the scope lives
// count for `name` (the innermost scope wins), and their backward ops, which run on autograd's
// threads, count for it too (matched by autograd's sequence numbers). Costs a string push/pop;
// nothing is looked up outside counting windows.
//   { torchpilot::ModuleScope m("blocks.3.attn"); y = attn->forward(x); }
class ModuleScope {
 public:
  explicit ModuleScope(std::string name);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;
};

class FlopCounter : public Collector {
 public:
  explicit FlopCounter(Pilot& pilot);
  ~FlopCounter() override;
  FlopCounter(const FlopCounter&) = delete;
  FlopCounter& operator=(const FlopCounter&) = delete;

  // Ops run on this thread while a RecomputeScope lives count as recomputation (activation
  // checkpointing: the forward run again in backward): hardware FLOPs (HFU) only. Nests.
  class RecomputeScope {
   public:
    RecomputeScope();
    ~RecomputeScope();
    RecomputeScope(RecomputeScope&& other) noexcept;
    RecomputeScope(const RecomputeScope&) = delete;
    RecomputeScope& operator=(const RecomputeScope&) = delete;
    RecomputeScope& operator=(RecomputeScope&&) = delete;

   private:
    bool active_;
  };
  RecomputeScope recompute() { return RecomputeScope(); }

  // Forget the counts; count again from the next step.
  void recount();
  // A counting window is open or opens with the next step.
  bool counting() const;
  // Windows completed so far.
  int64_t windows() const;
  // The peak MFU is held against (no peak: DevicePeak::any() is false).
  const DevicePeak& peak() const { return peak_; }

  std::string name() const override { return "flop_counter"; }
  // Between counting windows only on_step_record: the boundaries are not called (refresh_hooks).
  unsigned step_hooks() const override { return hooks_; }
  void on_step_begin(int64_t step, Nanos now) override;
  // Closes a counting window (the step is then taken at once); the step's figures are added in
  // on_step_record, in the Pilot's batches for short steps.
  void on_step_end(StepRecord& record) override;
  void on_step_record(StepRecord& record) override;
  void on_epoch_end(EpochSummary& summary) override;
  // Detached (host null): the Pilot is gone; an open counting window is closed.
  void attach(CollectorHost* host) override;

 private:
  void open_window();
  StepFlops close_window();
  void log_window(const StepFlops& count, int64_t samples);
  void warn_not_counted(int64_t step, const std::exception& e);  // said once
  // The step callbacks the counter needs now: a step's begin while a window is due, its end while
  // one is open.
  unsigned wanted_hooks() const;
  void refresh_hooks();

  Pilot* pilot_;
  CollectorHost* host_ = nullptr;  // the Pilot as a collector's host (take_step_now)
  bool active_ = false;            // this counter owns the callback
  uint64_t handle_ = 0;            // at::CallbackHandle
  bool window_open_ = false;
  std::optional<StepFlops> counted_;  // the count of the step counted_step_, for on_step_record
  int64_t counted_step_ = -1;
  unsigned hooks_ = kHookStepRecord;      // what the Pilot calls now (step_hooks, set_step_hooks)
  std::optional<int64_t> recount_after_;  // recount(): the counts go at the record of a later step
  bool warned_ = false;
  DevicePeak peak_;
  FlopWindowPlanner planner_;
  FlopEpochAccumulator epoch_;
};

}  // namespace torchpilot
