// GradSync: data-parallel gradient averaging worth using from C++ (LibTorch has no
// DistributedDataParallel). Gradients go into buckets of about bucket_mb MiB (parameters in
// reverse order, the order backward produces them); with overlap on, each bucket is all-reduced
// asynchronously from the gradient accumulators' post hooks as soon as its last gradient is
// ready, while backward goes on; synchronize() waits for them (issuing what backward did not
// reach), divides by the world size and writes the averaged gradients back. With overlap off,
// synchronize() all-reduces every bucket after backward (the usual hand-written loop), for
// comparison. Buckets synchronize() issues are all copied before their all-reduces start, so that
// the compute stream only waits from then on (the always-on exposed time; the first all-reduce
// starts after every copy: estimated 0.3 ms for 405 MB of gradients at an H100's bandwidth).
//
//   torchpilot::GradSync sync(model->parameters(), pg, {/*bucket_mb=*/25, /*overlap=*/true});
//   loss.backward();
//   sync.synchronize();            // before the optimizer step
//   optimizer.step();
//
// Buckets are issued in the same order on every rank (bucket i waits for buckets before it), so
// ranks running the same model issue the same collectives in the same order, as c10d requires.
// The result equals one process's gradients on the concatenated batch (up to the sum's rounding).
//
// GPU time: while a torchpilot::Collectives observes (collectives.h) and the gradients are on CUDA
// (LibTorch 2.x), each synchronize() is timed on the GPU without waiting for it: a CUDA event on
// the compute stream when it starts and one after the stream waits for the all-reduces (their
// difference: communication exposed after backward), and each Work's duration (NCCL's own timing,
// which the group constructor enables: enableCollectivesTiming; with the AllReduce constructor set
// TORCH_NCCL_ENABLE_TIMING=1). The figures reach the "comm" section a step or two later.
//
// Thread-safety: the hooks run on autograd's threads, synchronize() and the setters on the training
// thread, never during backward. Failure behaviour: an all-reduce that fails (a peer gone) makes
// synchronize() throw c10::Error naming the bucket (the trainer's own communication failed: it
// decides); hooks never throw into backward.
#pragma once

#if __has_include(<torch/csrc/distributed/c10d/Work.hpp>)
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "torchpilot/runtime/core/knobs.h"

namespace torchpilot {

namespace detail {
// LibTorch 2.x groups time their collectives on request (NCCL: start and end events per work).
template <typename Group>
auto enable_collectives_timing(Group& group, int) -> decltype(group.enableCollectivesTiming()) {
  try {
    group.enableCollectivesTiming();
  } catch (...) {  // not supported by this backend: the syncs go untimed
  }
}
template <typename Group>
void enable_collectives_timing(Group&, long) {}
}  // namespace detail

struct GradSyncOptions {
  double bucket_mb = 25;  // bucket size, MiB; 0: one bucket per parameter
  bool overlap = true;    // all-reduce from backward's hooks; false: all after backward
  bool average = true;    // divide the sum by the world size
};

class GradSync {
 public:
  // Sums tensors in place across the ranks, asynchronously.
  using AllReduce = std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&)>;
  GradSync(std::vector<at::Tensor> params, AllReduce all_reduce, int world_size,
           GradSyncOptions options = {});
  // A c10d ProcessGroup (or, in LibTorch 2.x, a Backend such as ProcessGroupNCCL).
  template <typename Group>
  GradSync(std::vector<at::Tensor> params, const c10::intrusive_ptr<Group>& group,
           GradSyncOptions options = {})
      : GradSync(
            std::move(params), [group](std::vector<at::Tensor>& t) { return group->allreduce(t); },
            group->getSize(), options) {
    if (group) detail::enable_collectives_timing(*group, 0);
  }
  ~GradSync();  // removes the hooks
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // After backward, before the optimizer step.
  void synchronize();

  // Take effect from the next backward.
  void set_bucket_mb(double mb);
  void set_overlap(bool overlap);
  double bucket_mb() const { return options_.bucket_mb; }
  bool overlap() const { return options_.overlap; }
  int buckets() const;
  // "grad_sync.bucket_mb" over `choices` (MiB) for a Pilot's knob registry.
  Knob knob(std::vector<int64_t> choices = {1, 4, 16, 25, 64, 128, 256});

  struct State;  // shared with the hooks

 private:
  std::shared_ptr<State> state_;
  GradSyncOptions options_;
};

}  // namespace torchpilot
#endif
