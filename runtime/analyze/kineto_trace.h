// PyTorch profiler (Kineto) traces, offline (docs/analyze.md): a trace's events become the records
// the live library collects — step spans, kernel, copy and sync records, op scopes, loader waits,
// phases, FLOP counts from recorded shapes, collectives — and one epoch summary (the profiled
// steps) is built from them by the same pure functions the GPU monitor, the FLOP counter and the
// Pilot's accumulator use (gpu_step_stats, add_kernel_classes, GpuEpochAccumulator, FlopTally,
// EpochAccumulator). The advisors then run on it unchanged (tools/analyze.cpp).
//
// Pure: no LibTorch, no CUDA. Thread-safety: plain values and functions.
// Failure behaviour: parse_kineto_trace and read_trace_file throw KinetoError with one line
// saying what is wrong and where (unreadable or not a regular file, over a limit, not JSON, a
// value of the wrong type or an impossible one, no profiler steps). Hostile input is bounded:
// KinetoLimits caps the bytes read and decompressed and the events parsed, and the work after
// parsing is n log n in the events (docs/analyze.md, "Limits and refusals").
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "torchpilot/runtime/comm/comm_records.h"
#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/flops/flop_accumulation.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"
#include "torchpilot/runtime/gpu/gpu_step_stats.h"

namespace torchpilot {

class KinetoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One profiled step (a ProfilerStep#N span on the training thread).
struct KinetoStep {
  int64_t number = 0;  // N of ProfilerStep#N
  // host: the ProfilerStep span; gpu: when the GPU reached the step's boundaries (the end of the
  // work on the trainer's stream launched before each, as a step marker would); data_wait: the
  // longest loader wait (enumerate(DataLoader)...__next__) in the step.
  StepSpans spans;
  Nanos data_wait_ns = 0;  // all loader waits in the step
  std::array<Nanos, kMaxPhases> phase_ns{};
  StepFlops flops;  // from recorded shapes (leaf ops, the FLOP counter's formulas)
  bool flops_known = false;
  int64_t collectives = 0;  // record_param_comms ops launched in the step
};

struct KinetoTrace {
  std::string device;   // deviceProperties[0].name ("" without a GPU)
  int sm_count = 0;     // deviceProperties[0].numSms
  bool shapes = false;  // record_shapes was on (FLOPs need it)
  int64_t trainer_thread = 0;
  uint32_t marker_stream = 0;  // the stream most of the trainer's kernels ran on
  std::vector<KinetoStep> steps;
  std::vector<std::string> phases;  // phase names by id (user annotations on the trainer)
  GpuEventBatch events;             // kernels, copies, syncs, op scopes (all of the trace)
  // Collectives (record_param_comms): their ops and payloads; NCCL's view from distributedInfo.
  std::vector<CollectiveRecord> collectives;
  std::string comm_backend;  // "nccl", "gloo", "" when none
  int rank = 0, world_size = 1;
  std::vector<std::string> notes;  // what the trace does not say (printed by the tool)
  // Who made it: "python" (torch.profiler: the process python*, Optimizer.step#..., the
  // DataLoader's enumerate(DataLoader)#..., python_function events) or "cxx" (none of those:
  // LibTorch's C++ profiler); the evidence names the first mark found.
  std::string frontend = "cxx";
  std::string frontend_evidence;
};

// What one trace may cost: a trace over a limit is refused, never read in part.
struct KinetoLimits {
  int64_t max_input_bytes = int64_t{512} << 20;  // the file, and its text once decompressed
  int64_t max_events = 4'000'000;                // entries of "traceEvents"
};

// Reads a trace file, gunzipping it when it starts with gzip's magic bytes. Only a regular file
// is read (a FIFO or a device could block or never end).
std::string read_trace_file(const std::string& path, const KinetoLimits& limits = {});

// Parses a Kineto JSON trace (the object with "traceEvents"). Names (device, kernels, ops,
// annotations) are kept printable (see printable).
KinetoTrace parse_kineto_trace(std::string_view json_text, const KinetoLimits& limits = {});

// `text` safe to print on a terminal and in a log: control characters (C0, DEL and C1, which
// terminals read as escape sequences) written as \xHH and \u00HH.
std::string printable(std::string_view text);

struct KinetoOptions {
  double peak_tflops = 0;     // > 0: every precision's peak (as flops.peak_tflops)
  std::string device_name;    // non-empty: replaces the trace's device name (peak table row)
  double link_peak_gbps = 0;  // comm.link_peak_gbps
};

// The profiled steps as one epoch: core fields (EpochAccumulator), and the sections "gpu"
// (GpuEpochStats), "flops" (FlopEpochStats, where shapes were recorded) and "comm"
// (CommEpochStats, where collectives ran).
EpochSummary kineto_epoch_summary(const KinetoTrace& trace, const KinetoOptions& options = {});

}  // namespace torchpilot
