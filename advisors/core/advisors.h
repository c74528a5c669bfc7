// Advisors: pure rules from an epoch's summary to advice, with thresholds from the config. The
// catalog (advisors/core/registry.cpp) registers every rule once, in the order its advice is
// listed, with the kernel's advisor registry (runtime/core/advisor_registry.h); the Pilot runs the
// registry at each epoch's end. Adding an advisor: write the rule in its own file here, add one
// catalog row, a config section for its thresholds (a struct in AdvisorsConfig whose field path is
// its key, advisors.<rule>.*, and a schema row in runtime/core/config_schema.cpp) and a
// docs/advice.md entry. A subsystem outside this library registers its rule itself
// (register_advisor) with a config section of its own (runtime/core/config_section.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/advice.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/flops/flop_records.h"
#include "torchpilot/runtime/gpu/gpu_records.h"
#include "torchpilot/runtime/loader/loader_records.h"
#include "torchpilot/runtime/stalls/step_outliers.h"

namespace torchpilot {

// Runs every registered rule in order (run_registered_advisors). A rule that throws is skipped;
// its id and error are appended to `errors` (when given) and the others still run.
std::vector<Advice> run_advisors(const EpochSummary& summary, const Config& config,
                                 std::vector<std::string>* errors = nullptr);

// The advice that removes GPU idle time, one cause each: data_starvation, host_sync,
// pageable_copies, launch_bound.
bool is_idle_cause(const std::string& advice_id);
// One idle second is removed once: the idle-cause advice's gains, each converted to the share of
// the step it removes (r = gain / (1 + gain)), must not sum above the traced idle share of step
// time (the GpuEpochStats section's five idle causes / traced time). Above it, each removed share
// is scaled down in proportion and its gain recomputed (marked estimated, the uncapped gain kept
// as evidence). Without a traced window nothing changes. run_advisors applies it.
void cap_idle_gains(std::vector<Advice>& advice, const EpochSummary& summary);

// Data starvation: the training thread waited for batches more than
// advisors.data_starvation.threshold of step time (high severity from .high_severity).
// Names the likely cause from the loader's counters and estimates the gain of removing the wait.
std::optional<Advice> advise_data_starvation(const EpochSummary& summary,
                                             const AdvisorsConfig& config);

// GPU advisors (advisors/gpu/gpu_advisors.cpp; need the epoch's GpuEpochStats section):
// busy but inefficient: GPU utilization at least advisors.busy_inefficient.utilization while SM
// efficiency is below advisors.busy_inefficient.sm_efficiency; names the kernels with fewer blocks
// than SMs.
std::optional<Advice> advise_busy_inefficient(const EpochSummary& summary,
                                              const AdvisorsConfig& config);
// Host-sync stall: the GPU idle that host syncs cause (the host's wait plus the drain after it)
// is above advisors.host_sync.threshold of step time (detailed windows); names the top call sites
// (op and phase).
std::optional<Advice> advise_host_sync(const EpochSummary& summary, const AdvisorsConfig& config);
// Host-to-device copies from pageable memory cause GPU idle above
// advisors.pageable_copies.threshold of step time (detailed windows).
std::optional<Advice> advise_pageable_copies(const EpochSummary& summary,
                                             const AdvisorsConfig& config);
// Launch-bound (advisors/gpu/launch_bound.cpp): the GPU idles between the step's kernels more than
// advisors.launch_bound.threshold of step time (detailed windows).
std::optional<Advice> advise_launch_bound(const EpochSummary& summary,
                                          const AdvisorsConfig& config);

// Precision and fusion (advisors/gpu/precision_advisors.cpp; they read the FlopEpochStats section
// and, when present, GpuEpochStats). Quiet without FLOP counts; the MFU-based ones quiet without a
// peak (CPU, unknown GPU).
// fp32 matmuls on a tensor-core GPU: the share of counted FLOPs in plain fp32 is above
// advisors.fp32_matmul.threshold and the device table's bf16 peak is at least 4x its fp32
// peak. Suggests bf16 autocast or TF32 (flops.allow_tf32); the gain replaces the fp32 kernels'
// measured time with their FLOPs at a calibrated tensor-core rate plus autocast's casts
// (gain_models.h).
std::optional<Advice> advise_fp32_matmul(const EpochSummary& summary, const AdvisorsConfig& config);
// Unfused attention (matmul + softmax + matmul) above advisors.unfused_attention.threshold of
// model FLOPs: suggests at::scaled_dot_product_attention (or, for its math fallback, inputs a fused
// kernel takes); the gain sets the unfused form's measured kernels against a fused kernel's
// predicted time (gain_models.h).
std::optional<Advice> advise_unfused_attention(const EpochSummary& summary,
                                               const AdvisorsConfig& config);
// Biases added outside their GEMMs (in the trace window, a GEMM without a bias epilogue followed by
// a broadcast add kernel) taking more than advisors.unfused_linear_bias.threshold of the step:
// suggests at::linear (LibTorch's C++ torch::nn::Linear runs matmul, then `+= bias`, on inputs of
// more than 2 dims); the gain removes the adds' measured time less what the epilogue adds to the
// GEMMs (gain_models.h).
std::optional<Advice> advise_unfused_linear_bias(const EpochSummary& summary,
                                                 const AdvisorsConfig& config);
// A per-parameter Adam-style optimizer (addcmul/addcdiv kernels per parameter in the trace window)
// whose update takes more than advisors.per_parameter_optimizer.threshold of the step: suggests a
// fused or multi-tensor update (at::_fused_adamw_, _foreach_*); the gain sets its measured host
// time (the optimizer phase, else its launches at the step's cost per launch) or kernel time
// against a fused update's predicted kernel time (gain_models.h).
std::optional<Advice> advise_per_parameter_optimizer(const EpochSummary& summary,
                                                     const AdvisorsConfig& config);
// Host-bound steps (advisors/stalls/host_advisors.cpp): the GPU idles more than
// advisors.host_bound.threshold of the step outside data waits, host syncs and torchpilot's own
// time (GpuEpochStats' busy share: traced, else counters, else NVML). Says where (phases, the
// thread's CPU time: busy or blocked) and what to do; the gain is not estimated (how much host
// work can leave the thread is not measured): its bound, step / GPU busy time, is evidence.
std::optional<Advice> advise_host_bound(const EpochSummary& summary, const AdvisorsConfig& config);
// Periodic stalls: outliers every N steps (OutlierStats) whose time above the median is more
// than advisors.periodic_stall.threshold of the epoch; the cause from data wait, phase and the
// thread's CPU time, actions by cause, the gain from removing that excess.
std::optional<Advice> advise_periodic_stall(const EpochSummary& summary,
                                            const AdvisorsConfig& config);
// MFU below advisors.low_mfu.threshold: where the step time goes (with a trace window: the traced
// step's GPU time by kernel class; else counted FLOPs at peak, data wait, GPU idle, the rest) and
// what to change for the largest fixable share, with its estimated gain. Info or warning, never
// high.
std::optional<Advice> advise_low_mfu(const EpochSummary& summary, const AdvisorsConfig& config);

// GPU memory under pressure (MemoryEpochStats): peak reserved above advisors.memory_pressure
// .threshold of the device's memory, or allocator retries or OOMs this epoch. Evidence: peaks,
// the cache's slack (fragmentation), retries, OOMs; actions by what dominates. Its effect is in
// memory (the slack expandable segments can return), not throughput: no gain is estimated.
std::optional<Advice> advise_memory_pressure(const EpochSummary& summary,
                                             const AdvisorsConfig& config);

// A micro-batch memory would allow larger while the step is launch-bound (detailed windows: launch
// gaps above advisors.small_micro_batch.launch_gap_share): the largest factor k (2..8) with k x
// the peak allocated within advisors.small_micro_batch.memory_share of the device. Info; the gain
// of a larger batch is launch_bound's (not repeated here).
std::optional<Advice> advise_small_micro_batch(const EpochSummary& summary,
                                               const AdvisorsConfig& config);

// Checkpoints too rare for the failure rate the run journal saw (RunJournalStats): the expected
// share of wall time lost, half a checkpoint interval per failure (or, without checkpoints, the
// measured loss), above advisors.checkpoint.threshold.
std::optional<Advice> advise_checkpoint(const EpochSummary& summary, const AdvisorsConfig& config);
// Exposed communication: collectives block the step more than
// advisors.exposed_communication.threshold of step time (section "comm"). Gain: the step at
// max(compute, communication) once fully overlapped.
std::optional<Advice> advise_exposed_communication(const EpochSummary& summary,
                                                   const AdvisorsConfig& config);
// Low bus bandwidth: while communication takes advisors.low_bus_bandwidth.threshold of step time,
// the bus bandwidth is below .fraction of the link's peak, or all-reduces average fewer than
// .small_message_bytes. Gain: the exposed time at the reference rate.
std::optional<Advice> advise_low_bus_bandwidth(const EpochSummary& summary,
                                               const AdvisorsConfig& config);
// Straggler rank (rank 0, section "ranks"): the rank whose compute or data wait exceeds the
// others' median by advisors.straggler_rank.threshold of the step, its cause and the others' wait.
// Gain: its excess removed from every rank's step.
std::optional<Advice> advise_straggler_rank(const EpochSummary& summary,
                                            const AdvisorsConfig& config);

}  // namespace torchpilot
