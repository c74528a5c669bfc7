// memory_pressure: the CUDA caching allocator's figures of an epoch (MemoryEpochStats).
#include <algorithm>
#include <string>

#include "torchpilot/advisors/core/advice_text.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/gpu/gpu_records.h"
#include "torchpilot/runtime/memory/memory_records.h"

namespace torchpilot {

namespace {
using detail::num;
using detail::pct;

std::string gib(int64_t bytes) {
  return num(static_cast<double>(bytes) / (1024.0 * 1024 * 1024), "%.2f") + " GiB";
}
}  // namespace

std::optional<Advice> advise_memory_pressure(const EpochSummary& s, const AdvisorsConfig& config) {
  const MemoryEpochStats* m = s.sections.get<MemoryEpochStats>();
  if (m == nullptr || m->capacity_bytes <= 0) return std::nullopt;
  const double reserved = m->peak_reserved_fraction();
  const bool near = reserved >= config.memory_pressure.threshold;
  if (!near && m->alloc_retries == 0 && m->ooms == 0) return std::nullopt;
  Advice a;
  a.id = "memory_pressure";
  a.severity = m->ooms > 0 || m->alloc_retries > 0 ? Severity::kHigh : Severity::kWarning;
  a.finding = "GPU memory: peak reserved " + gib(m->peak_reserved_bytes) + " (" + pct(reserved) +
              " of " + gib(m->capacity_bytes) + "), peak allocated " +
              gib(m->peak_allocated_bytes) + " (" + pct(m->peak_allocated_fraction()) + ")";
  if (m->alloc_retries > 0) {
    a.finding += "; " + std::to_string(m->alloc_retries) +
                 " allocations failed and were retried after the cache was freed";
  }
  if (m->ooms > 0) a.finding += "; " + std::to_string(m->ooms) + " out-of-memory errors";
  a.evidence = {{"peak_reserved", static_cast<double>(m->peak_reserved_bytes), "bytes"},
                {"peak_allocated", static_cast<double>(m->peak_allocated_bytes), "bytes"},
                {"capacity", static_cast<double>(m->capacity_bytes), "bytes"},
                {"slack", static_cast<double>(m->slack_bytes()), "bytes"},
                {"alloc_retries", static_cast<double>(m->alloc_retries), "retries"},
                {"ooms", static_cast<double>(m->ooms), "errors"},
                {"threshold", config.memory_pressure.threshold, "fraction"}};
  // Slack: reserved but not allocated at the peaks. A large share of it, with retries, is
  // fragmentation: free blocks too small or split for the sizes asked for.
  const double slack_share =
      m->peak_reserved_bytes > 0
          ? static_cast<double>(m->slack_bytes()) / static_cast<double>(m->peak_reserved_bytes)
          : 0;
  const bool fragmented = slack_share >= 0.2;
  if (fragmented) {
    a.cause = gib(m->slack_bytes()) + " (" + pct(slack_share) +
              " of the reserved memory) is cached but not allocated at the peak: the allocator's "
              "blocks do not fit the sizes asked for (fragmentation)";
    a.action =
        "let the allocator grow segments instead of caching fixed blocks: "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (LibTorch 2.1+), which can return up "
        "to " +
        gib(m->slack_bytes()) +
        " at the peak; if tensors still do not fit: a smaller micro-batch with gradient "
        "accumulation (the same global batch), activation checkpointing or offloading";
  } else {
    a.cause = "tensors themselves fill the device: " + pct(m->peak_allocated_fraction()) +
              " of it is allocated at the peak (activations, parameters, gradients and optimizer "
              "state)";
    a.action =
        "free activation memory: activation checkpointing (recompute in backward) or offloading "
        "activations to pinned host memory, or a smaller micro-batch with gradient accumulation "
        "(the same global batch); bf16 weights and activations halve what fp32 holds";
  }
  if (m->alloc_retries > 0 || m->ooms > 0) {
    a.action +=
        "; each retry frees the allocator's cache and synchronizes the device, and an "
        "out-of-memory error ends a step";
  }
  a.gain_estimated = false;
  a.action += "; the effect is in memory (headroom), not estimated as throughput";
  return a;
}

std::optional<Advice> advise_small_micro_batch(const EpochSummary& s,
                                               const AdvisorsConfig& config) {
  const MemoryEpochStats* m = s.sections.get<MemoryEpochStats>();
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  if (m == nullptr || m->capacity_bytes <= 0 || m->peak_allocated_bytes <= 0 || gpu == nullptr ||
      gpu->traced_steps == 0 || gpu->stats.traced_ns <= 0 || m->alloc_retries > 0 || m->ooms > 0) {
    return std::nullopt;
  }
  const double gaps = static_cast<double>(gpu->stats.idle_launch_gap_ns) /
                      static_cast<double>(gpu->stats.traced_ns);
  if (gaps <= config.small_micro_batch.launch_gap_share) return std::nullopt;
  // Everything counted as growing with the batch (parameters and optimizer state do not): a
  // conservative factor.
  const double room =
      config.small_micro_batch.memory_share * static_cast<double>(m->capacity_bytes);
  const int k =
      static_cast<int>(std::min(8.0, room / static_cast<double>(m->peak_allocated_bytes)));
  if (k < 2) return std::nullopt;
  Advice a;
  a.id = "small_micro_batch";
  a.severity = Severity::kInfo;
  a.finding = "memory allows a " + std::to_string(k) + "x larger micro-batch (peak allocated " +
              gib(m->peak_allocated_bytes) + ", " + pct(m->peak_allocated_fraction()) + " of " +
              gib(m->capacity_bytes) + ") while the GPU idles " + pct(gaps) +
              " of step time between kernels";
  a.evidence = {{"max_factor", static_cast<double>(k), "x"},
                {"peak_allocated", static_cast<double>(m->peak_allocated_bytes), "bytes"},
                {"capacity", static_cast<double>(m->capacity_bytes), "bytes"},
                {"launch_gap_share", gaps, "fraction"}};
  a.cause =
      "the step launches the same kernels for few samples: their launches, not the GPU's "
      "work, set the pace";
  a.action = "raise the micro-batch, up to " + std::to_string(k) + "x (" + std::to_string(k) +
             " x the peak stays within " + pct(config.small_micro_batch.memory_share) +
             " of the device, counting all memory as growing with it), with fewer accumulation "
             "steps for the same global batch; the gain is launch_bound's estimate";
  a.gain_estimated = false;
  return a;
}

}  // namespace torchpilot
