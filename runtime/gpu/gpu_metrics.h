// GPU-side metric math over vendor-neutral kernel intervals (docs/metrics.md, "GPU"). Pure
// functions: the CUPTI collectors of the GPU capability (issue 3) feed them; tests feed
// hand-made timelines.
#pragma once

#include <cstdint>
#include <vector>

#include "torchpilot/runtime/core/clock.h"

namespace torchpilot {

struct Interval {
  Nanos begin = 0;
  Nanos end = 0;  // exclusive; an interval with end <= begin is empty
};

// Sorts `intervals` by begin (unless they are) and merges them into their disjoint union, in
// place.
void merge_in_place(std::vector<Interval>& intervals);

// Length of the union of `intervals` inside `window`.
Nanos union_length(std::vector<Interval> intervals, Interval window);
// The same over a caller's scratch, which it clips, sorts and merges in place (no allocation).
Nanos union_length_in_place(std::vector<Interval>& intervals, Interval window);

// Length of (union of a) ∩ (union of b) inside `window`.
Nanos intersection_length(std::vector<Interval> a, std::vector<Interval> b, Interval window);

struct KernelEvent {
  Nanos begin = 0;
  Nanos end = 0;
  int64_t blocks = 0;          // grid size in blocks
  bool communication = false;  // a collective (NCCL) kernel rather than compute
};

// Gaps between compute kernels shorter than this count as compute for communication overlap,
// unless a communication kernel ends in the gap (the compute stream waited for it).
constexpr Nanos kComputeGapBridgeNs = 10'000;

// An idle gap (no kernel, no copy) shorter than this that ends where a communication kernel
// begins counts as communication: NCCL's launch and its streams' event waits before each
// collective (7-17 us measured before and between back-to-back all-reduces on an H100 pair),
// which a compute stream waiting for the collective pays as well. The gap after a collective (the
// compute stream resuming) does not: CUDA events the compute stream records around its wait end
// with the collective, and the always-on measure is such events.
constexpr Nanos kCommGapBridgeNs = 20'000;

struct GpuWindowMetrics {
  Nanos window_ns = 0;
  // Union of all kernel intervals / window: what nvidia-smi calls utilization.
  double gpu_utilization = 0;
  // Estimated SM efficiency (no counters): each kernel contributes min(1, blocks / SMs) while it
  // runs, overlapping kernels add up, the sum is clamped at 1, averaged over the window.
  double estimated_sm_efficiency = 0;
  Nanos comm_ns = 0;  // union of communication kernels and the idle gaps (< 20 us) before them
  Nanos comm_overlapped_ns = 0;  // ... that overlaps compute kernels or copies (gaps < 10 us
                                 // bridged)
  Nanos exposed_comm_ns = 0;     // comm_ns - comm_overlapped_ns
  double comm_overlap = 0;       // comm_overlapped_ns / comm_ns (0 without communication)
};

// Metrics of the kernels inside `window` on a GPU with `sm_count` SMs (> 0). `copies` (memcpy
// and memset on the GPU, any stream) are work beside compute kernels; they change only the
// communication figures (gaps, overlap), not utilization or SM efficiency.
GpuWindowMetrics gpu_window_metrics(const std::vector<KernelEvent>& kernels, Interval window,
                                    int sm_count, std::vector<Interval> copies = {});

}  // namespace torchpilot
