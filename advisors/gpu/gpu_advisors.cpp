// GPU advisors: busy but inefficient, host-sync stall, pageable copies (launch_bound.cpp). Pure
// functions of an epoch's GPU figures (EpochSummary::gpu); docs/advice.md has the rules.
#include <algorithm>
#include <cstdio>
#include <string>

#include "torchpilot/advisors/core/advice_text.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/advisors/core/gain_models.h"
#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/flops/device_peaks.h"

namespace torchpilot {
namespace {

using detail::gain_from_removing;
using detail::lower;
using detail::num;
using detail::pct;
using gains::gain;

// The traced share of time (detailed windows) a GPU figure refers to.
double traced_share(const GpuStats& g, Nanos ns) {
  return g.traced_ns > 0 ? static_cast<double>(ns) / static_cast<double>(g.traced_ns) : 0.0;
}

bool contains(const std::string& text, const char* word) {
  return lower(text).find(word) != std::string::npos;
}

// Ops that copy a tensor (a blocking one synchronizes).
bool copy_op(const std::string& op) {
  return op == "aten::to" || op == "aten::copy_" || op == "aten::_to_copy";
}

std::string short_name(const std::string& name) {
  constexpr size_t kMax = 80;
  return name.size() <= kMax ? name : name.substr(0, kMax - 3) + "...";
}

}  // namespace

std::optional<Advice> advise_busy_inefficient(const EpochSummary& s, const AdvisorsConfig& config) {
  const GpuEpochStats* section = s.sections.get<GpuEpochStats>();
  if (section == nullptr || s.steps == 0) return std::nullopt;
  const GpuEpochStats& e = *section;
  const GpuStats& g = e.stats;
  // Busy: the kernel union (traced) or the counters' busy figure, else NVML's.
  const double busy = measured(g.gpu_utilization)       ? g.gpu_utilization
                      : measured(g.counter_utilization) ? g.counter_utilization
                                                        : g.nvml_utilization;
  const bool hardware = measured(g.sm_efficiency);
  const double sm = hardware ? g.sm_efficiency : g.estimated_sm_efficiency;
  if (!measured(busy) || !measured(sm)) return std::nullopt;
  if (busy < config.busy_inefficient.utilization || sm >= config.busy_inefficient.sm_efficiency) {
    return std::nullopt;
  }

  Advice a;
  a.id = "busy_inefficient";
  a.severity = sm < 0.1 ? Severity::kHigh : Severity::kWarning;
  a.finding =
      "the GPU reads " + pct(busy) + " busy" +
      (measured(g.nvml_utilization) ? " (NVML utilization.gpu " + pct(g.nvml_utilization) + ")"
                                    : "") +
      " but only " + pct(sm) + " of its SMs are at work" +
      (hardware ? " (hardware counter sm__cycles_active)"
                : " (estimated from launch shapes: no counters)");
  if (measured(g.tensor_activity)) a.finding += "; tensor pipes " + pct(g.tensor_activity);
  if (measured(g.dram_throughput)) a.finding += ", DRAM " + pct(g.dram_throughput);
  a.evidence = {{"gpu_utilization", busy, "fraction"},
                {hardware ? "sm_efficiency" : "estimated_sm_efficiency", sm, "fraction"},
                {"sm_count", static_cast<double>(e.sm_count), "SMs"}};
  if (measured(g.nvml_utilization)) {
    a.evidence.push_back({"nvml_utilization", g.nvml_utilization, "fraction"});
  }
  if (measured(g.tensor_activity)) {
    a.evidence.push_back({"tensor_activity", g.tensor_activity, "fraction"});
  }
  if (measured(g.dram_throughput)) {
    a.evidence.push_back({"dram_throughput", g.dram_throughput, "fraction"});
  }

  // The kernels that take the time with fewer blocks than SMs.
  std::string kernels;
  bool softmax = false;
  for (const KernelSummary& k : e.top_kernels) {
    if (k.mean_blocks_per_sm >= 1.0) continue;
    const double share = traced_share(g, k.total_ns);
    if (share < 0.01) continue;
    if (!kernels.empty()) kernels += "; ";
    kernels += short_name(k.name) + " (" + pct(share) + " of traced time, " +
               num(k.mean_blocks_per_sm * e.sm_count, "%.0f") + " blocks for " +
               std::to_string(e.sm_count) + " SMs)";
    softmax = softmax || contains(k.name, "softmax");
  }
  if (!kernels.empty()) {
    a.cause =
        "kernels launch fewer blocks than the GPU has SMs, so most SMs idle while they "
        "run: " +
        kernels;
  } else if (!e.top_kernels.empty()) {
    a.cause = "the time goes to kernels that keep few SMs busy, longest first: " +
              short_name(e.top_kernels.front().name);
    softmax = contains(e.top_kernels.front().name, "softmax");
  } else {
    a.cause =
        "kernels keep few SMs busy (no detailed trace window this epoch names them; see "
        "gpu.trace_* settings)";
  }
  a.action =
      "give each kernel enough parallel work to fill the GPU: batch the small operations "
      "(larger batch or fused/batched ops instead of loops over tensors), and use fused "
      "kernels";
  if (softmax) {
    a.action +=
        "; attention built from matmul + softmax + matmul runs as several small or "
        "memory-bound kernels: use torch::scaled_dot_product_attention";
  }
  // With every SM at work the busy time would shrink to sm/busy of itself; but how much more
  // parallel work a kernel can be given is the program's to say, so that bound (often 10-100x)
  // is no promise: no gain is stated, the bound is evidence.
  const double bound = gain_from_removing(busy - sm);
  a.evidence.push_back({"gain_bound_if_every_sm_busy", bound, "fraction"});
  a.expected_gain = 0;
  a.gain_estimated = true;
  a.action += "; no gain is estimated: it depends on how much parallel work each kernel can get";
  return a;
}

std::optional<Advice> advise_host_sync(const EpochSummary& s, const AdvisorsConfig& config) {
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  if (!gpu || gpu->traced_steps == 0) return std::nullopt;
  const GpuStats& g = gpu->stats;
  // What a sync costs is the GPU idle it causes: the queue drains while the host waits, and stays
  // empty until the host launches again. A host blocked while the GPU stays busy loses nothing.
  const double f = traced_share(g, g.host_sync_ns);
  const double idle = traced_share(g, g.idle_host_sync_ns);
  if (idle <= config.host_sync.threshold) return std::nullopt;
  const double steps = static_cast<double>(gpu->traced_steps);
  const double per_step = static_cast<double>(g.host_syncs) / steps;
  Advice a;
  a.id = "host_sync";
  a.severity = idle > 0.25 ? Severity::kHigh : Severity::kWarning;
  a.finding = "host syncs cost " + pct(idle) +
              " of step time in GPU idle (the host's wait plus the drain after it until the next "
              "kernel starts): " +
              num(per_step, "%.1f") + " per step, the host blocked " + pct(f) + " of step time";
  a.evidence = {{"host_sync_fraction", f, "fraction"},
                {"host_syncs_per_step", per_step, "calls"},
                {"gpu_idle_in_sync_fraction", idle, "fraction"},
                {"threshold", config.host_sync.threshold, "fraction"}};
  // The call sites that cost the most idle, with the phase they ran in.
  std::string sites;
  for (const SyncSite& x : gpu->top_sync_sites) {
    if (x.count == 0 && x.idle_ns == 0) continue;
    if (!sites.empty()) sites += "; ";
    sites += x.cause + (x.phase.empty() ? "" : " in phase " + x.phase) + " (" +
             num(static_cast<double>(x.count) / steps, "%.1f") + " per step, " +
             pct(traced_share(g, x.idle_ns)) + " of step time in GPU idle)";
  }
  if (!gpu->top_sync_sites.empty()) {
    a.evidence.push_back({"top_site_idle_fraction",
                          traced_share(g, gpu->top_sync_sites.front().idle_ns), "fraction"});
  }
  a.cause = sites.empty()
                ? "the training loop waits for the GPU every step (e.g. loss.item(), .cpu(), "
                  "printing a tensor, a blocking copy, or torch::cuda::synchronize), so the host "
                  "stops queuing work and the GPU drains"
                : "the training loop waits for the GPU, so the host stops queuing work and the "
                  "GPU drains; top call sites: " +
                      sites;
  a.action =
      "keep values on the GPU and read them every N steps (accumulate the loss in a "
      "tensor), use non_blocking copies into pinned memory, avoid ops whose output size depends "
      "on the data (nonzero, masked_select, unique, boolean indexing) in the step, and remove "
      "explicit synchronizations";
  // A blocking .to(device) from pageable memory synchronizes (the partition counts it here, not
  // as a pageable copy): when the top site is a copy and the window copied pageable bytes to the
  // device, pinning is the fix to name first.
  if (!gpu->top_sync_sites.empty() && g.h2d_pageable_bytes > 0 &&
      copy_op(gpu->top_sync_sites.front().cause)) {
    const double mb = static_cast<double>(g.h2d_pageable_bytes) / 1e6 / steps;
    a.cause += "; " + num(mb, "%.1f") +
               " MB per step went to the device from pageable memory, and a blocking copy from "
               "pageable memory waits for the GPU to reach it";
    a.action =
        "pin the host tensors copied to the device (tensor.pin_memory(), or the loader's "
        "pin_memory: TunableLoader pins with pin_memory or mode: autotune) and copy them "
        "with non_blocking=true; then " +
        a.action;
    a.evidence.push_back({"pageable_mb_per_step", mb, "MB"});
  }
  // Removing the syncs removes the idle they cause: new step = step - that idle. The window's own
  // cost lengthens the drain after each sync (tracing slows the host's launches): the idle an
  // untraced step keeps, in its own step (gains::untraced_idle).
  const gains::HostSyncGain m = *gains::host_sync_gain(s);
  if (m.untraced_known()) {
    a.evidence.push_back({"untraced_idle_share", m.u.share, "fraction"});
    a.evidence.push_back({"gpu_idle_in_sync_untraced_fraction", m.untraced, "fraction"});
    if (m.u.share < 0.9) {
      a.action += "; estimated for the untraced steps: the traced ones ran " +
                  num(m.u.traced_s * 1e3, "%.2f") + " ms on the GPU against " +
                  num(m.u.untraced_s * 1e3, "%.2f") +
                  " ms (tracing slowed the host's launches), so their syncs idle the GPU " +
                  pct(m.untraced) + " of a step, not " + pct(idle);
    }
  }
  // The host still issues every launch and does its own work without the syncs: the step can
  // lose at most the time the host was blocked in them. Where the kernels between two syncs are
  // short, the drain after each sync is mostly the host's own launching, which stays (a sync per
  // micro-step of small matmuls: the idle said +229%, removing the reads measured +7% to +24%).
  if (m.probed_blocked_s > 0) {
    a.evidence.push_back(
        {"host_blocked_in_syncs_untraced_per_step", m.probed_blocked_s * 1e3, "ms"});
  }
  if (m.blocked_bound) {
    a.evidence.push_back({"host_blocked_in_syncs_per_step", m.traced_blocked_s * 1e3, "ms"});
    a.action += "; estimated: at most the host's time blocked in syncs (" +
                num(m.blocked_s * 1e3, "%.3g") + " ms of a " + num(m.step_s * 1e3, "%.3g") +
                " ms step" +
                (m.probed_blocked_s > m.traced_blocked_s
                     ? ", timed in untraced steps after the window: " +
                           num(m.traced_blocked_s * 1e3, "%.3g") + " ms in its traced ones"
                     : std::string()) +
                "), as the host still issues the rest of the step";
    // Severity by what the change gives, not by the idle: a host-bound step keeps most of it.
    if (m.removed < 0.05) {
      a.severity = Severity::kInfo;
    } else if (m.removed <= 0.2) {
      a.severity = Severity::kWarning;
    }
  }
  a.expected_gain = m.gain;
  a.gain_estimated = true;
  return a;
}

std::optional<Advice> advise_pageable_copies(const EpochSummary& s, const AdvisorsConfig& config) {
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  if (!gpu || gpu->traced_steps == 0) return std::nullopt;
  const GpuStats& g = gpu->stats;
  if (g.h2d_pageable_bytes == 0) return std::nullopt;
  // What the copies cost is the GPU idle they cause (the partition's pageable-copy share: the
  // copy, the wait for the queue before it and the refill after it, unless a host sync or a data
  // wait claimed that time first).
  const double idle = traced_share(g, g.idle_pageable_copy_ns);
  if (idle <= config.pageable_copies.threshold) return std::nullopt;
  const double f = traced_share(g, g.h2d_pageable_ns);
  const double share =
      static_cast<double>(g.h2d_pageable_bytes) / std::max<int64_t>(1, g.h2d_bytes);
  const double mb = static_cast<double>(g.h2d_pageable_bytes) / 1e6 / gpu->traced_steps;
  Advice a;
  a.id = "pageable_copies";
  a.severity = idle > 0.2 ? Severity::kHigh : Severity::kWarning;
  a.finding = pct(share) + " of host-to-device bytes (" + num(mb, "%.1f") +
              " MB per step) came from pageable memory, copying for " + pct(f) +
              " of step time; the GPU sat idle for " + pct(idle) + " of step time because of them";
  a.evidence = {{"pageable_copy_fraction", f, "fraction"},
                {"gpu_idle_in_pageable_copy_fraction", idle, "fraction"},
                {"pageable_bytes_share", share, "fraction"},
                {"pageable_mb_per_step", mb, "MB"},
                {"threshold", config.pageable_copies.threshold, "fraction"}};
  a.cause =
      "pageable copies are staged through a driver buffer and block the host; they cannot "
      "overlap compute";
  a.action =
      "pin the batches (TunableLoader pin_memory, or tensor.pin_memory()) and copy with "
      "non_blocking=true; with mode: autotune the loader tries this itself";
  // Gain: the idle removed, less the pinned copy that stays in the stream: the same bytes at the
  // calibrated pinned host-to-device rate (device_peaks.h), as a share of the step.
  const Calibration cal = calibration(gpu->device);
  const double step_s = gains::steady_step_seconds(s);
  const double pinned_s = mb * 1e6 / cal.h2d_pinned_bytes_per_s;
  const double pinned = step_s > 0 ? std::min(idle, pinned_s / step_s) : 0.0;
  a.expected_gain = gain(1.0, 1.0 - idle + pinned);
  a.evidence.push_back({"predicted_pinned_copy_time", pinned_s * 1e3, "ms"});
  a.evidence.push_back({"pinned_h2d_rate", cal.h2d_pinned_bytes_per_s / 1e9, "GB/s"});
  a.action += "; estimated: the idle removed, less the pinned copy (" +
              num(pinned_s * 1e3, "%.3g") + " ms at " +
              num(cal.h2d_pinned_bytes_per_s / 1e9, "%.0f") + " GB/s)";
  a.gain_estimated = true;
  return a;
}

}  // namespace torchpilot
