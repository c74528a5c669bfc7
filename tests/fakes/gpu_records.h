// Records the GPU monitor's tests build by hand: a step's spans, PM samples, kernels, and an epoch
// summary with a
// traced GPU section that each advisor test then plants its figures in.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/gpu/gpu_records.h"
#include "torchpilot/runtime/gpu/gpu_step_stats.h"

namespace torchpilot {
namespace test {

// The spans of a step whose GPU work ran inside its host span.
inline StepSpans spans(Interval host, Interval wait, bool traced,
                       Nanos trace_from = std::numeric_limits<Nanos>::min()) {
  StepSpans s;
  s.host = host;
  s.data_wait = wait;
  s.traced = traced;
  s.trace_from = trace_from;
  return s;
}

// A PM sample of [b, e) at SM efficiency `sm`.
inline PmSample pm(Nanos b, Nanos e, double sm, double gr = 1.0) {
  PmSample s;
  s.begin = b;
  s.end = e;
  s.sm_efficiency = sm;
  s.counter_utilization = gr;
  s.tensor_activity = 0.0;
  s.dram_throughput = 0.01;
  s.achieved_occupancy = sm / 2;
  s.pcie_read_bytes = 1000;
  return s;
}

// A kernel of `blocks` blocks over [b, e).
inline KernelRecord kernel(Nanos b, Nanos e, int64_t blocks, std::string name = "k") {
  KernelRecord k;
  k.begin = b;
  k.end = e;
  k.blocks = blocks;
  k.name = std::move(name);
  return k;
}

// A copy of `bytes` over [b, e).
inline CopyRecord copy_record(Nanos b, Nanos e, int64_t bytes, CopyKind kind, bool pageable) {
  return CopyRecord{b, e, bytes, kind, pageable};
}

// An epoch of 10 steps in 1 s, all traced on a 132-SM "Fake GPU" with 1000 kernels; the caller
// sets the utilization and idle figures its advisor reads.
inline EpochSummary traced_gpu_summary() {
  constexpr Nanos kMs = 1000000;
  EpochSummary s;
  s.steps = 10;
  s.wall_ns = 1000 * kMs;
  GpuEpochStats e;
  e.device = "Fake GPU";
  e.sm_count = 132;
  e.traced_steps = 10;
  e.stats.wall_ns = s.wall_ns;
  e.stats.traced_ns = s.wall_ns;
  e.stats.kernels = 1000;
  s.sections.set<GpuEpochStats>(e);
  return s;
}

}  // namespace test
}  // namespace torchpilot
