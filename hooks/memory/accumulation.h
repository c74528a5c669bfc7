// Accumulation: the trainer states its global batch; torchpilot chooses the micro-batch and so the
// accumulation count (micro-batch x accumulation x world size = global batch, the last
// micro-batch smaller when the micro-batch does not divide the rank's batch) and runs the
// accumulation loop, so that it can catch an out-of-memory error in a step (docs/memory.md).
//
//   torchpilot::Accumulation acc(pilot, model->parameters(),
//                                {/*global_batch=*/64, /*world_size=*/1, /*micro_batch=*/2});
//   for (auto& batch : loader) {              // the loader delivers the rank's share: 64 samples
//     auto step = pilot.step(acc.rank_batch());
//     acc.step({batch.data, batch.target},
//              [&](const std::vector<at::Tensor>& mb, const torchpilot::MicroBatch& m) {
//                auto loss = loss_fn(model->forward(mb[0]), mb[1]) * m.loss_scale;
//                loss.backward();             // gradients accumulate over the micro-batches
//              },
//              [&] { optimizer.step(); optimizer.zero_grad(); });
//   }
//
// The loader's batch never changes: each step's batch is split along dim 0 into views (no copy)
// and every sample runs exactly once per optimizer step, whatever the micro-batch, so a change of
// micro-batch loses or repeats no sample. loss_scale = micro-batch size / batch size: the scaled
// losses sum to the batch's mean, so the gradients equal those of the whole batch at once (up to
// rounding). With data parallelism, synchronize gradients once per step (in the optimizer
// callback, after every micro-batch): a rank that recovers from an out-of-memory error re-runs
// its micro-batches, and collectives issued from backward's hooks would not match the other
// ranks'. Gradients must be zero or none when step() starts (zero them after the optimizer step).
//
// Knob: "batch.micro" (domain: `choices`, or powers of two up to the rank's batch and the rank's
// batch; the start is always in it).
// In mode autotune the trial engine searches it after the loader's knobs (batch_policy.h): larger
// micro-batches from the start, smaller ones if the start does not fit; the best measured
// samples/s wins within autotune.memory_headroom of the device's memory (each trial's own peak of
// allocated bytes, from the CUDA caching allocator: its peak is reset at each trial's start, so
// the epoch's memory section counts its peak from the last trial's start during auto-tune).
// On the CPU, or without the allocator's statistics, the search runs by samples/s alone and says
// so in one log line.
//
// Out of memory (c10::OutOfMemoryError, or a c10::Error whose message says "out of memory") in a
// micro-batch callback while auto-tune runs: the step's partial gradients are dropped (set to
// none), the CUDA cache is emptied, the trial fails (the Pilot's fail_trial: on several ranks it
// fails on all of them at the window's end), and the SAME batch runs again from its first sample
// under the previous micro-batch (the incumbent's; a smaller one of the domain when the start
// itself does not fit); the optimizer callback runs once, on the whole batch. Outside auto-tune
// (mode advise, or after the decision) such an error is the trainer's own and is rethrown, as are
// every other error and any error in the optimizer callback (its partial update cannot be undone).
// After the decision the headroom (autotune.memory_headroom) is what keeps later steps from
// running out where the trial did not (fragmentation).
//
// Thread-safety: one training thread (step(), the getters and the knob's setter, which the trial
// engine calls between steps or from step()). Either may go first: when the Pilot goes, the
// Accumulation hears it (as a collector) and from then on runs its loop without tuning or
// recovery.
// Failure behaviour: the constructor throws std::invalid_argument on inconsistent sizes; step()
// throws std::invalid_argument on an empty batch or tensors of different lengths along dim 0,
// before any work, and lets the callbacks' errors through except the out-of-memory errors it
// recovers from as above.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/pilot.h"

namespace torchpilot {

struct AccumulationOptions {
  int64_t global_batch = 0;  // samples per optimizer step, over all ranks
  int world_size = 1;        // ranks sharing it (each runs global_batch / world_size)
  int64_t micro_batch = 0;   // the starting micro-batch; 0: the rank's whole batch
  // Micro-batches the search may try (within [1, rank batch]); empty: powers of two up to the
  // rank's batch, the rank's batch itself and the start.
  std::vector<int64_t> choices;
  // Register the knob "batch.micro" (mode autotune searches it); false: a fixed micro-batch and
  // no out-of-memory recovery.
  bool tune = true;
};

// One micro-batch of a step, as the micro-step callback sees it.
struct MicroBatch {
  int64_t index = 0;      // 0 .. count - 1
  int64_t count = 1;      // micro-batches in this step: the accumulation count
  int64_t offset = 0;     // its first sample within the rank's batch
  int64_t size = 0;       // its samples (the last may be fewer than the micro-batch)
  double loss_scale = 1;  // size / the batch's size: multiply a mean loss by it
  bool last() const { return index + 1 == count; }
};

class Accumulation {
 public:
  using MicroStep = std::function<void(const std::vector<at::Tensor>& micro, const MicroBatch& m)>;
  using OptimizerStep = std::function<void()>;

  // `parameters`: the model's, whose gradients are dropped after an out-of-memory error.
  Accumulation(Pilot& pilot, std::vector<at::Tensor> parameters, AccumulationOptions options);
  ~Accumulation();
  Accumulation(const Accumulation&) = delete;
  Accumulation& operator=(const Accumulation&) = delete;

  // One optimizer step over the rank's batch (the tensors of `batch` split along dim 0): the
  // micro-step callback per micro-batch, in order, then the optimizer callback once.
  void step(const std::vector<at::Tensor>& batch, const MicroStep& micro_step,
            const OptimizerStep& optimizer_step);

  int64_t global_batch() const { return options_.global_batch; }
  int64_t rank_batch() const { return rank_batch_; }
  int64_t micro_batch() const { return micro_; }  // what the next step uses
  int64_t accumulation() const { return (rank_batch_ + micro_ - 1) / micro_; }
  const std::vector<int64_t>& choices() const { return domain_; }
  // Out-of-memory errors recovered from so far (each re-ran its step's batch).
  int64_t recoveries() const { return recoveries_; }

 private:
  void run(const std::vector<at::Tensor>& batch, int64_t n, int64_t micro,
           const MicroStep& micro_step);
  // After an out-of-memory error at `micro`: true when the batch can run again (micro_ set).
  bool recover(const std::string& what, int64_t micro, std::vector<Setting>& attempted);
  void drop_gradients();
  void install_memory_probe();
  void note_peak();
  struct Link;  // a collector that hears when the Pilot goes

  Pilot* pilot_;  // null once the Pilot went
  std::unique_ptr<Link> link_;
  std::vector<at::Tensor> parameters_;
  AccumulationOptions options_;
  int64_t rank_batch_ = 0;
  int64_t micro_ = 0;
  std::vector<int64_t> domain_;
  int64_t recoveries_ = 0;
  bool cuda_ = false;  // the parameters live on a CUDA device
  // The running trial's peak of allocated bytes, noted after each step (CUDA only; null: none).
  std::shared_ptr<int64_t> peak_seen_;
  int device_ = -1;
  bool knob_added_ = false;
  bool probe_set_ = false;
};

}  // namespace torchpilot
