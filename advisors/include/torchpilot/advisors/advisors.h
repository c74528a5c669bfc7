// Advisors: pure rules from an epoch's summary to advice, with thresholds from the config. The
// registry (advisor_registry) lists every rule once, in catalog order; the Pilot runs them at each
// epoch's end. Adding an advisor: write the rule in its own file here, add one registry row
// (advisors/src/registry.cpp), a config section for its thresholds and a docs/advice.md entry.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torchpilot/runtime/advice.h"
#include "torchpilot/runtime/config.h"
#include "torchpilot/runtime/flop_records.h"
#include "torchpilot/runtime/gpu_records.h"
#include "torchpilot/runtime/loader_records.h"
#include "torchpilot/runtime/records.h"

namespace torchpilot {

// One rule of the catalog: its advice id and the rule, which reads its thresholds from `config`.
struct AdvisorEntry {
  const char* id;
  std::optional<Advice> (*rule)(const EpochSummary& summary, const Config& config);
};
// Every advisor, in catalog order.
const std::vector<AdvisorEntry>& advisor_registry();
// Runs the registry's rules in order. A rule that throws is skipped; its id and error are appended
// to `errors` (when given) and the others still run.
std::vector<Advice> run_advisors(const EpochSummary& summary, const Config& config,
                                 std::vector<std::string>* errors = nullptr);

// Data starvation: the training thread waited for batches more than `threshold` of step time.
// Names the likely cause from the loader's counters and estimates the gain of removing the wait.
std::optional<Advice> advise_data_starvation(const EpochSummary& summary,
                                             const DataStarvationConfig& config);

// GPU advisors (advisors/src/gpu_advisors.cpp; need EpochSummary::gpu):
// busy but inefficient: GPU utilization high while SM efficiency is low; names the kernels with
// fewer blocks than SMs.
std::optional<Advice> advise_busy_inefficient(const EpochSummary& summary,
                                              const GpuAdvisorConfig& config);
// Host-sync stall: the host blocked in synchronizing calls (detailed windows).
std::optional<Advice> advise_host_sync(const EpochSummary& summary, const GpuAdvisorConfig& config);
// Host-to-device copies from pageable memory (detailed windows).
std::optional<Advice> advise_pageable_copies(const EpochSummary& summary,
                                             const GpuAdvisorConfig& config);
// Launch-bound: the GPU idles between the step's kernels (detailed windows).
std::optional<Advice> advise_launch_bound(const EpochSummary& summary,
                                          const GpuAdvisorConfig& config);

// Precision and fusion (advisors/src/precision_advisors.cpp; they read EpochSummary::flops and,
// when present, EpochSummary::gpu). Quiet without FLOP counts; the MFU-based ones quiet without a
// peak (CPU, unknown GPU).
// fp32 matmuls on a tensor-core GPU: the share of counted FLOPs in plain fp32 is above
// fp32_matmul_threshold and the device table's bf16 peak is at least 4x its fp32 peak. Suggests
// bf16 autocast or TF32 (flops.allow_tf32); the gain is estimated from the peak ratio and the
// fp32 work's share of the step at the datasheet peaks.
std::optional<Advice> advise_fp32_matmul(const EpochSummary& summary,
                                         const GpuAdvisorConfig& config);
// Unfused attention (matmul + softmax + matmul) above unfused_attention_threshold of model FLOPs:
// suggests at::scaled_dot_product_attention (or, for its math fallback, inputs a fused kernel
// takes); the time saved comes from the traced softmax kernels, else from the score matrices'
// estimated traffic at the device's DRAM bandwidth (estimated either way).
std::optional<Advice> advise_unfused_attention(const EpochSummary& summary,
                                               const GpuAdvisorConfig& config);
// MFU below low_mfu_threshold: where the step time goes (counted FLOPs at peak, data wait, GPU
// idle, the rest) and what to change for the largest loss. Info or warning, never high.
std::optional<Advice> advise_low_mfu(const EpochSummary& summary, const GpuAdvisorConfig& config);

}  // namespace torchpilot
