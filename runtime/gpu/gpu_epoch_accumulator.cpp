#include "torchpilot/runtime/gpu/gpu_epoch_accumulator.h"

#include <algorithm>

namespace torchpilot {
namespace {

Nanos overlap(Interval a, Interval b) {
  return std::max<Nanos>(0, std::min(a.end, b.end) - std::max(a.begin, b.begin));
}

}  // namespace

void GpuEpochAccumulator::add(const GpuStats& g) {
  const double w = static_cast<double>(g.wall_ns);
  wall_ns += g.wall_ns;
  // PM means by the time the samples cover, not the steps' wall time: a step that lies mostly in
  // a sampling gap must not weigh as much as one sampled throughout.
  const double pw = static_cast<double>(g.pm_covered_ns);
  counter_utilization.add(g.counter_utilization, pw);
  sm_efficiency.add(g.sm_efficiency, pw);
  tensor_activity.add(g.tensor_activity, pw);
  dram_throughput.add(g.dram_throughput, pw);
  achieved_occupancy.add(g.achieved_occupancy, pw);
  pm_covered_ns += g.pm_covered_ns;
  nvml_utilization.add(g.nvml_utilization, w);
  sm_clock_mhz.add(g.sm_clock_mhz, w);
  clock_limited.add(g.clock_limited, w);
  pcie_read.add(g.pcie_read_bytes);
  pcie_write.add(g.pcie_write_bytes);
  if (g.traced_ns <= 0) return;
  ++traced_steps;
  gpu_utilization.add(g.gpu_utilization, static_cast<double>(g.traced_ns));
  estimated_sm_efficiency.add(g.estimated_sm_efficiency, static_cast<double>(g.traced_ns));
  traced.traced_ns += g.traced_ns;
  traced.kernels += g.kernels;
  traced.host_sync_ns += g.host_sync_ns;
  traced.host_syncs += g.host_syncs;
  traced.h2d_bytes += g.h2d_bytes;
  traced.h2d_pageable_bytes += g.h2d_pageable_bytes;
  traced.h2d_pageable_ns += g.h2d_pageable_ns;
  traced.comm_ns += g.comm_ns;
  traced.exposed_comm_ns += g.exposed_comm_ns;
  traced.idle_data_wait_ns += g.idle_data_wait_ns;
  traced.idle_host_sync_ns += g.idle_host_sync_ns;
  traced.idle_pageable_copy_ns += g.idle_pageable_copy_ns;
  traced.idle_launch_gap_ns += g.idle_launch_gap_ns;
  traced.idle_other_ns += g.idle_other_ns;
}

void GpuEpochAccumulator::add_kernels(KernelRange records, Interval span, int sm_count) {
  for (const KernelRecord& k : records) {
    const Nanos ns = overlap({k.begin, k.end}, span);
    if (ns <= 0) continue;
    Kernel& s = kernels[k.name];
    if (k.begin >= span.begin) ++s.launches;
    s.ns += ns;
    const double per_sm = static_cast<double>(k.blocks) / std::max(1, sm_count);
    s.blocks_ns += per_sm * static_cast<double>(ns);
    s.eff_ns += std::min(1.0, per_sm) * static_cast<double>(ns);
  }
}

void GpuEpochAccumulator::add_sync_sites(const std::vector<SyncSite>& sites) {
  for (const SyncSite& s : sites) {
    const auto key = std::make_pair(s.cause, s.phase);
    auto it = sync_sites.find(key);
    if (it == sync_sites.end()) {
      if (sync_sites.size() >= kMaxSyncSites) continue;
      it = sync_sites.emplace(key, SyncSite{s.cause, s.api, s.phase, 0, 0, 0}).first;
    }
    it->second.count += s.count;
    it->second.host_wait_ns += s.host_wait_ns;
    it->second.idle_ns += s.idle_ns;
    it->second.trainer_calls += s.trainer_calls;
    it->second.other_thread_calls += s.other_thread_calls;
    if (s.stream_id >= 0) it->second.stream_id = s.stream_id;
    if (s.event_id >= 0) it->second.event_id = s.event_id;
  }
}

std::vector<SyncSite> GpuEpochAccumulator::top_sync_sites() const {
  std::vector<SyncSite> out;
  for (const auto& [key, site] : sync_sites) out.push_back(site);
  std::sort(out.begin(), out.end(), [](const SyncSite& a, const SyncSite& b) {
    return a.idle_ns != b.idle_ns ? a.idle_ns > b.idle_ns : a.host_wait_ns > b.host_wait_ns;
  });
  if (out.size() > kTopSyncSites) out.resize(kTopSyncSites);
  return out;
}

GpuStats GpuEpochAccumulator::stats() const {
  GpuStats g = traced;
  g.wall_ns = wall_ns;
  g.pm_covered_ns = pm_covered_ns;
  g.counter_utilization = counter_utilization.get();
  g.sm_efficiency = sm_efficiency.get();
  g.tensor_activity = tensor_activity.get();
  g.dram_throughput = dram_throughput.get();
  g.achieved_occupancy = achieved_occupancy.get();
  g.nvml_utilization = nvml_utilization.get();
  g.sm_clock_mhz = sm_clock_mhz.get();
  g.clock_limited = clock_limited.get();
  g.pcie_read_bytes = pcie_read.get();
  g.pcie_write_bytes = pcie_write.get();
  g.gpu_utilization = gpu_utilization.get();
  g.estimated_sm_efficiency = estimated_sm_efficiency.get();
  return g;
}

std::vector<KernelSummary> GpuEpochAccumulator::top_kernels() const {
  std::vector<KernelSummary> out;
  for (const auto& [name, k] : kernels) {
    const double ns = static_cast<double>(std::max<Nanos>(1, k.ns));
    out.push_back({name, k.launches, k.ns, k.blocks_ns / ns, k.eff_ns / ns});
  }
  std::sort(out.begin(), out.end(),
            [](const KernelSummary& a, const KernelSummary& b) { return a.total_ns > b.total_ns; });
  if (out.size() > kTopKernels) out.resize(kTopKernels);
  return out;
}

}  // namespace torchpilot
