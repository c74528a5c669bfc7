// The GPU sections' JSON and advisory-log text (gpu_records.h).
#include "torchpilot/runtime/gpu/gpu_records.h"

#include <algorithm>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/format.h"
#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/flops/flop_records.h"

namespace torchpilot {
namespace {
using namespace detail;

json gpu_stats_json(const GpuStats& g) {
  return {{"wall_ms", ms(g.wall_ns)},
          {"counter_utilization", number(g.counter_utilization)},
          {"sm_efficiency", number(g.sm_efficiency)},
          {"tensor_activity", number(g.tensor_activity)},
          {"dram_throughput", number(g.dram_throughput)},
          {"achieved_occupancy", number(g.achieved_occupancy)},
          {"pcie_read_bytes", number(g.pcie_read_bytes)},
          {"pcie_write_bytes", number(g.pcie_write_bytes)},
          {"nvml_utilization", number(g.nvml_utilization)},
          {"sm_clock_mhz", number(g.sm_clock_mhz)},
          {"clock_limited", number(g.clock_limited)},
          {"pm_covered_ms", ms(g.pm_covered_ns)},
          {"traced_ms", ms(g.traced_ns)},
          {"gpu_utilization", number(g.gpu_utilization)},
          {"estimated_sm_efficiency", number(g.estimated_sm_efficiency)},
          {"kernels", g.kernels},
          {"host_sync_ms", ms(g.host_sync_ns)},
          {"host_syncs", g.host_syncs},
          {"h2d_bytes", g.h2d_bytes},
          {"h2d_pageable_bytes", g.h2d_pageable_bytes},
          {"h2d_pageable_ms", ms(g.h2d_pageable_ns)},
          {"comm_ms", ms(g.comm_ns)},
          {"exposed_comm_ms", ms(g.exposed_comm_ns)},
          {"idle_ms",
           {{"data_wait", ms(g.idle_data_wait_ns)},
            {"host_sync", ms(g.idle_host_sync_ns)},
            {"pageable_copy", ms(g.idle_pageable_copy_ns)},
            {"launch_gap", ms(g.idle_launch_gap_ns)},
            {"other", ms(g.idle_other_ns)}}}};
}

// Per traced step: each class's time, launches, and the parts the gain models read.
json kernel_classes_json(const KernelClassStats& k) {
  json time = json::object(), launches = json::object();
  for (int i = 0; i < kKernelClasses; ++i) {
    const auto c = static_cast<KernelClass>(i);
    time[to_string(c)] = k.per_step_ms(k.ns[static_cast<size_t>(i)]);
    launches[to_string(c)] =
        k.steps > 0 ? static_cast<double>(k.launches[static_cast<size_t>(i)]) / k.steps : 0.0;
  }
  time["idle"] = k.per_step_ms(k.idle_ns);
  return {{"steps", k.steps},
          {"traced_ms", ms(k.traced_ns)},
          {"ms_per_step", time},
          {"launches_per_step", launches},
          {"fused_attention_ms_per_step", k.per_step_ms(k.fused_attention_ns)},
          {"fused_optimizer_ms_per_step", k.per_step_ms(k.fused_optimizer_ns)},
          {"per_parameter_optimizer_launches_per_step",
           k.steps > 0 ? static_cast<double>(k.per_parameter_optimizer_launches) / k.steps : 0.0},
          {"memcpy_ms_per_step", k.per_step_ms(static_cast<double>(k.memcpy_ns))},
          {"memset_ms_per_step", k.per_step_ms(static_cast<double>(k.memset_ns))},
          {"unfused_attention_ms_per_step", k.per_step_ms(k.unfused_attention_pieces_ns)},
          {"unfused_attention_gemm_ms_per_step", k.per_step_ms(k.unfused_attention_gemm_ns)},
          {"unfused_attention_launches_per_step",
           k.steps > 0 ? static_cast<double>(k.unfused_attention_launches) / k.steps : 0.0},
          {"unfused_attention_softmaxes_per_step",
           k.steps > 0 ? static_cast<double>(k.unfused_attention_softmaxes) / k.steps : 0.0},
          {"unfused_bias_ms_per_step", k.per_step_ms(k.unfused_bias_add_ns)},
          {"unfused_bias_gemm_ms_per_step", k.per_step_ms(k.unfused_bias_gemm_ns)},
          {"unfused_bias_adds_per_step",
           k.steps > 0 ? static_cast<double>(k.unfused_bias_adds) / k.steps : 0.0}};
}

// Per traced step: each phase's GPU time (docs/metrics.md, "GPU time of a phase").
json phases_gpu_json(const GpuPhaseTimes& e) {
  const double steps = static_cast<double>(std::max<int64_t>(1, e.steps));
  json phases = json::array();
  for (const GpuPhaseStats& p : e.phases) {
    phases.push_back({{"name", p.name},
                      {"count", p.count},
                      {"gpu_ms_per_step", p.gpu_ns / steps / 1e6},
                      {"host_ms_per_step", p.host_ns / steps / 1e6},
                      {"kernel_busy", p.gpu_ns > 0 ? number(fraction(p.busy_ns, p.gpu_ns))
                                                   : number(kNotMeasured)}});
  }
  return {{"steps", e.steps},
          {"incomplete_steps", e.incomplete_steps},
          {"step_gpu_ms", e.step_gpu_ns / steps / 1e6},
          {"outside_phases_ms", e.outside_ns() / steps / 1e6},
          {"phases", phases}};
}

}  // namespace

std::string section_json(const GpuEpochStats& e) {
  json kernels = json::array();
  for (const auto& k : e.top_kernels) {
    kernels.push_back({{"name", k.name},
                       {"launches", k.launches},
                       {"total_ms", ms(k.total_ns)},
                       {"mean_blocks_per_sm", k.mean_blocks_per_sm},
                       {"estimated_sm_efficiency", k.estimated_sm_efficiency}});
  }
  json sync_sites = json::array();
  for (const auto& x : e.top_sync_sites) {
    sync_sites.push_back({{"cause", x.cause},
                          {"api", x.api},
                          {"phase", x.phase},
                          {"count", x.count},
                          {"host_wait_ms", ms(x.host_wait_ns)},
                          {"idle_ms", ms(x.idle_ns)},
                          {"trainer_calls", x.trainer_calls},
                          {"other_thread_calls", x.other_thread_calls},
                          {"stream_id", x.stream_id},
                          {"event_id", x.event_id}});
  }
  json collectors = json::array();
  for (const auto& c : e.collectors) {
    collectors.push_back({{"name", c.name}, {"active", c.active}, {"reason", c.reason}});
  }
  json j = gpu_stats_json(e.stats);
  j["device"] = e.device;
  j["device_index"] = e.device_index;
  j["sm_count"] = e.sm_count;
  j["traced_steps"] = e.traced_steps;
  j["traced_steps_left_out"] = e.traced_steps_left_out;
  j["gpu_timed_steps"] = e.gpu_timed_steps;
  j["marker_timeouts"] = e.marker_timeouts;
  j["steps"] = e.steps;
  j["carried_steps"] = e.carried_steps;
  j["earlier_steps"] = e.earlier_steps;
  j["epoch_end_wait_ms"] = ms(e.epoch_end_wait_ns);
  j["dropped_records"] = e.dropped_records;
  j["own_thread_syncs"] = e.own_thread_syncs;
  j["next_window"] = e.next_window;
  j["next_window_step"] = e.next_window_step >= 0 ? json(e.next_window_step) : json(nullptr);
  j["windows_predicted"] = e.windows_predicted;
  j["window_estimate_ms"] = ms(e.window_estimate_ns);
  j["window_cost_ms"] = ms(e.window_cost_ns);
  j["windows_cut"] = e.windows_cut;
  j["top_kernels"] = kernels;
  j["top_sync_sites"] = sync_sites;
  j["collectors"] = collectors;
  j["max_step_call_ms"] = ms(e.max_step_call_ns);
  j["collections"] = e.collections;
  j["collect_ms"] = ms(e.collect_ns);
  j["collect_drain_ms"] = ms(e.collect_drain_ns);
  j["steps_joined"] = e.steps_joined;
  j["sync_probed_steps"] = e.sync_probed_steps;
  j["sync_probed_ms"] = ms(e.sync_probed_ns);
  j["ordinary_steps"] = e.ordinary_steps;
  j["ordinary_step_p50_ms"] = ms(e.ordinary_step_p50_ns);
  j["ordinary_compute_p50_ms"] = ms(e.ordinary_compute_p50_ns);
  j["ordinary_data_wait_ms"] = ms(e.ordinary_data_wait_ns);
  j["ordinary_gpu_steps"] = e.ordinary_gpu_steps;
  j["ordinary_gpu_step_p50_ms"] = ms(e.ordinary_gpu_step_p50_ns);
  j["ordinary_gpu_ms"] = ms(e.ordinary_gpu_ns);
  j["ordinary_gpu_host_ms"] = ms(e.ordinary_gpu_host_ns);
  j["kernel_classes"] = kernel_classes_json(e.kernel_classes);
  j["phases_gpu"] = phases_gpu_json(e.phases_gpu);
  return dump(j);
}

std::string section_json(const GpuStepRecord& r) {
  json j = {{"traced", r.traced}, {"gpu_timed", r.gpu_timed}, {"gpu_shared", r.gpu_shared}};
  if (r.gpu_timed) {
    j["gpu_begin_ns"] = r.gpu_begin_ns;
    j["gpu_end_ns"] = r.gpu_end_ns;
    j["gpu_lag_ms"] = ms(r.gpu_lag_ns);
  } else {
    j["gpu_begin_ns"] = nullptr;
    j["gpu_end_ns"] = nullptr;
    j["gpu_lag_ms"] = nullptr;
  }
  j.update(gpu_stats_json(r.stats));
  return dump(j);
}

void section_text(const GpuEpochStats& gpu, const EpochSummary& s,
                  std::vector<std::string>& lines) {
  const FlopEpochStats* flops = s.sections.get<FlopEpochStats>();
  // The truth side by side: what nvidia-smi says, what the SMs did, what the math units did.
  {
    const GpuStats& g = gpu.stats;
    const double util = measured(g.counter_utilization) ? g.counter_utilization : g.gpu_utilization;
    std::string line =
        "  GPU " +
        (gpu.device_index >= 0 ? std::to_string(gpu.device_index) + " " : std::string()) +
        gpu.device + ": utilization " + fmt_opt_pct(util) + " (NVML " +
        fmt_opt_pct(g.nvml_utilization) + "), SM efficiency " +
        (measured(g.sm_efficiency)             ? fmt_pct(g.sm_efficiency)
         : measured(g.estimated_sm_efficiency) ? fmt_pct(g.estimated_sm_efficiency) + " (estimated)"
                                               : std::string("n/a")) +
        ", tensor " + fmt_opt_pct(g.tensor_activity) + ", DRAM " + fmt_opt_pct(g.dram_throughput) +
        ", occupancy " + fmt_opt_pct(g.achieved_occupancy);
    if (measured(g.sm_clock_mhz)) {
      line += ", SM clock " + fmt_num(g.sm_clock_mhz) + " MHz while busy";
      if (measured(g.clock_limited)) {
        line += " (at a power or thermal limit " + fmt_pct(g.clock_limited) + " of the time)";
      }
    }
    if (flops != nullptr) {
      line += "; " + mfu_text(*flops);
    }
    // Short epochs end before the GPU's figures of their last steps are final (the end does not
    // wait long): say which steps these figures are over.
    if (gpu.carried_steps > 0 || gpu.earlier_steps > 0) {
      line += " (over " + std::to_string(gpu.steps) + " steps, " +
              std::to_string(gpu.earlier_steps) + " of them from earlier epochs; " +
              std::to_string(gpu.carried_steps) + " still running go to the next epoch)";
    }
    lines.push_back(line);
  }
  if (gpu.traced_steps > 0) {
    const GpuStats& g = gpu.stats;
    const double t = static_cast<double>(std::max<Nanos>(1, g.traced_ns));
    const double steps = static_cast<double>(gpu.traced_steps);
    lines.push_back(
        "  traced " + std::to_string(gpu.traced_steps) + " steps" +
        (gpu.traced_steps_left_out > 0
             ? " (and " + std::to_string(gpu.traced_steps_left_out) +
                   " left out: a window's first step over twice its others)"
             : std::string()) +
        ": kernel busy " + fmt_opt_pct(g.gpu_utilization) + ", estimated SM efficiency " +
        fmt_opt_pct(g.estimated_sm_efficiency) + ", " + fmt_num(g.kernels / steps) +
        " kernels/step; host sync " + fmt_pct(g.host_sync_ns / t) + " (" +
        fmt_num(g.host_syncs / steps) + "/step); H2D " + fmt_num(g.h2d_bytes / steps / 1e6) +
        " MB/step (" + fmt_pct(fraction(g.h2d_pageable_bytes, std::max<int64_t>(1, g.h2d_bytes))) +
        " pageable); " +
        (g.comm_ns > 0 ? "communication " + fmt_num(g.comm_ns / steps / 1e6) + " ms/step (" +
                             fmt_num(g.exposed_comm_ns / steps / 1e6) + " exposed); "
                       : std::string()) +
        "GPU idle: data wait " + fmt_pct(g.idle_data_wait_ns / t) + ", host sync " +
        fmt_pct(g.idle_host_sync_ns / t) + ", pageable copies " +
        fmt_pct(g.idle_pageable_copy_ns / t) + ", launch gaps " +
        fmt_pct(g.idle_launch_gap_ns / t) + ", other " + fmt_pct(g.idle_other_ns / t) +
        (gpu.dropped_records > 0
             ? "; " + std::to_string(gpu.dropped_records) + " records dropped (understated)"
             : ""));
  }
  const KernelClassStats& k = gpu.kernel_classes;
  if (k.steps > 0 && k.traced_ns > 0) {
    // Where the traced step's GPU time goes: the classes and idle add up to it.
    const double t = static_cast<double>(k.traced_ns);
    std::string line =
        "  GPU time by kernel class (" + fmt_num(k.per_step_ms(t)) + " ms per traced step): ";
    for (int i = 0; i < kKernelClasses; ++i) {
      const double ns = k.ns[static_cast<size_t>(i)];
      if (ns <= 0) continue;
      line += std::string(label(static_cast<KernelClass>(i))) + " " + fmt_pct(ns / t) + ", ";
    }
    line += "idle " + fmt_pct(k.idle_ns / t) + "; copies " +
            fmt_num(k.per_step_ms(static_cast<double>(k.memcpy_ns + k.memset_ns))) +
            " ms per step on the copy engines";
    lines.push_back(line);
  }
  if (const GpuPhaseTimes& ph = gpu.phases_gpu; ph.steps > 0 && ph.step_gpu_ns > 0) {
    // The phases by the GPU's time, not the host's: the host may run steps ahead.
    const double t = static_cast<double>(ph.step_gpu_ns);
    const double steps = static_cast<double>(ph.steps);
    std::string line = "  GPU time by phase (" + std::to_string(ph.steps) + " traced steps, " +
                       fmt_num(t / steps / 1e6) + " ms per step): ";
    for (const GpuPhaseStats& p : ph.phases) {
      line += p.name + " " + fmt_num(p.gpu_ns / steps / 1e6) + " ms (" + fmt_pct(p.gpu_ns / t) +
              ", kernels busy " +
              (p.gpu_ns > 0 ? fmt_pct(fraction(p.busy_ns, p.gpu_ns)) : std::string("n/a")) +
              ", host " + fmt_num(p.host_ns / steps / 1e6) + " ms), ";
    }
    const double outside = static_cast<double>(ph.outside_ns());
    line +=
        "outside phases " + fmt_num(outside / steps / 1e6) + " ms (" + fmt_pct(outside / t) + ")";
    if (ph.incomplete_steps > 0) {
      line += "; " + std::to_string(ph.incomplete_steps) +
              " traced steps left out (a phase marker missing)";
    }
    lines.push_back(line);
  }
  if (!gpu.top_sync_sites.empty()) {
    // Where the host synchronized, by the GPU idle it caused (the drain after each included).
    std::string line = "  host syncs by cause:";
    for (size_t i = 0; i < gpu.top_sync_sites.size(); ++i) {
      const SyncSite& x = gpu.top_sync_sites[i];
      line += std::string(i == 0 ? " " : "; ") + x.cause +
              (x.phase.empty() ? "" : " in " + x.phase) + " " + std::to_string(x.count) +
              "x, wait " + fmt_num(x.host_wait_ns / 1e6) + " ms, GPU idle " +
              fmt_num(x.idle_ns / 1e6) + " ms";
    }
    lines.push_back(line);
  }
}

}  // namespace torchpilot
