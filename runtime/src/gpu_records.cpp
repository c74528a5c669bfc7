// The GPU sections' JSON and advisory-log text (gpu_records.h).
#include "torchpilot/runtime/gpu_records.h"

#include <algorithm>
#include <string>
#include <vector>

#include "format.h"
#include "torchpilot/runtime/flop_records.h"
#include "torchpilot/runtime/metrics.h"

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
          {"traced_ms", ms(g.traced_ns)},
          {"gpu_utilization", number(g.gpu_utilization)},
          {"estimated_sm_efficiency", number(g.estimated_sm_efficiency)},
          {"kernels", g.kernels},
          {"host_sync_ms", ms(g.host_sync_ns)},
          {"host_syncs", g.host_syncs},
          {"h2d_bytes", g.h2d_bytes},
          {"h2d_pageable_bytes", g.h2d_pageable_bytes},
          {"h2d_pageable_ms", ms(g.h2d_pageable_ns)},
          {"idle_ms",
           {{"data_wait", ms(g.idle_data_wait_ns)},
            {"host_sync", ms(g.idle_host_sync_ns)},
            {"launch_gap", ms(g.idle_launch_gap_ns)},
            {"other", ms(g.idle_other_ns)}}}};
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
  json collectors = json::array();
  for (const auto& c : e.collectors) {
    collectors.push_back({{"name", c.name}, {"active", c.active}, {"reason", c.reason}});
  }
  json j = gpu_stats_json(e.stats);
  j["device"] = e.device;
  j["sm_count"] = e.sm_count;
  j["traced_steps"] = e.traced_steps;
  j["gpu_timed_steps"] = e.gpu_timed_steps;
  j["marker_timeouts"] = e.marker_timeouts;
  j["dropped_records"] = e.dropped_records;
  j["top_kernels"] = kernels;
  j["collectors"] = collectors;
  return dump(j);
}

std::string section_json(const GpuStepRecord& r) {
  json j = {{"traced", r.traced}, {"gpu_timed", r.gpu_timed}};
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
        "  GPU " + gpu.device + ": utilization " + fmt_opt_pct(util) + " (NVML " +
        fmt_opt_pct(g.nvml_utilization) + "), SM efficiency " +
        (measured(g.sm_efficiency)             ? fmt_pct(g.sm_efficiency)
         : measured(g.estimated_sm_efficiency) ? fmt_pct(g.estimated_sm_efficiency) + " (estimated)"
                                               : std::string("n/a")) +
        ", tensor " + fmt_opt_pct(g.tensor_activity) + ", DRAM " + fmt_opt_pct(g.dram_throughput) +
        ", occupancy " + fmt_opt_pct(g.achieved_occupancy);
    if (flops != nullptr) {
      line += "; MFU " + fmt_opt_pct(flops->mfu) + " (HFU " + fmt_opt_pct(flops->hfu) + ")";
    }
    lines.push_back(line);
  }
  if (gpu.traced_steps > 0) {
    const GpuStats& g = gpu.stats;
    const double t = static_cast<double>(std::max<Nanos>(1, g.traced_ns));
    const double steps = static_cast<double>(gpu.traced_steps);
    lines.push_back(
        "  traced " + std::to_string(gpu.traced_steps) + " steps: kernel busy " +
        fmt_opt_pct(g.gpu_utilization) + ", estimated SM efficiency " +
        fmt_opt_pct(g.estimated_sm_efficiency) + ", " + fmt_num(g.kernels / steps) +
        " kernels/step; host sync " + fmt_pct(g.host_sync_ns / t) + " (" +
        fmt_num(g.host_syncs / steps) + "/step); H2D " + fmt_num(g.h2d_bytes / steps / 1e6) +
        " MB/step (" + fmt_pct(fraction(g.h2d_pageable_bytes, std::max<int64_t>(1, g.h2d_bytes))) +
        " pageable); GPU idle: data wait " + fmt_pct(g.idle_data_wait_ns / t) + ", host sync " +
        fmt_pct(g.idle_host_sync_ns / t) + ", launch gaps " + fmt_pct(g.idle_launch_gap_ns / t) +
        ", other " + fmt_pct(g.idle_other_ns / t) +
        (gpu.dropped_records > 0
             ? "; " + std::to_string(gpu.dropped_records) + " records dropped (understated)"
             : ""));
  }
}

}  // namespace torchpilot
