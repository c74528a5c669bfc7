// The advisor catalog in one place: every rule, in the order its advice is listed.
#include <exception>
#include <string>

#include "torchpilot/advisors/core/advisors.h"

namespace torchpilot {

bool is_idle_cause(const std::string& id) {
  return id == "data_starvation" || id == "host_sync" || id == "pageable_copies" ||
         id == "launch_bound";
}

const std::vector<AdvisorEntry>& advisor_registry() {
  static const std::vector<AdvisorEntry> rules = {
      {"data_starvation", [](const EpochSummary& s,
                             const Config& c) { return advise_data_starvation(s, c.advisors); }},
      {"busy_inefficient", [](const EpochSummary& s,
                              const Config& c) { return advise_busy_inefficient(s, c.advisors); }},
      {"host_sync",
       [](const EpochSummary& s, const Config& c) { return advise_host_sync(s, c.advisors); }},
      {"pageable_copies", [](const EpochSummary& s,
                             const Config& c) { return advise_pageable_copies(s, c.advisors); }},
      {"launch_bound",
       [](const EpochSummary& s, const Config& c) { return advise_launch_bound(s, c.advisors); }},
      {"fp32_matmul",
       [](const EpochSummary& s, const Config& c) { return advise_fp32_matmul(s, c.advisors); }},
      {"unfused_attention",
       [](const EpochSummary& s, const Config& c) {
         return advise_unfused_attention(s, c.advisors);
       }},
      {"unfused_linear_bias",
       [](const EpochSummary& s, const Config& c) {
         return advise_unfused_linear_bias(s, c.advisors);
       }},
      {"per_parameter_optimizer",
       [](const EpochSummary& s, const Config& c) {
         return advise_per_parameter_optimizer(s, c.advisors);
       }},
      {"host_bound",
       [](const EpochSummary& s, const Config& c) { return advise_host_bound(s, c.advisors); }},
      {"periodic_stall",
       [](const EpochSummary& s, const Config& c) { return advise_periodic_stall(s, c.advisors); }},
      {"low_mfu",
       [](const EpochSummary& s, const Config& c) { return advise_low_mfu(s, c.advisors); }},
      {"memory_pressure", [](const EpochSummary& s,
                             const Config& c) { return advise_memory_pressure(s, c.advisors); }},
      {"small_micro_batch",
       [](const EpochSummary& s, const Config& c) {
         return advise_small_micro_batch(s, c.advisors);
       }},
      {"checkpoint",
       [](const EpochSummary& s, const Config& c) { return advise_checkpoint(s, c.advisors); }},
      {"exposed_communication",
       [](const EpochSummary& s, const Config& c) {
         return advise_exposed_communication(s, c.advisors);
       }},
      {"low_bus_bandwidth",
       [](const EpochSummary& s, const Config& c) {
         return advise_low_bus_bandwidth(s, c.advisors);
       }},
      {"straggler_rank",
       [](const EpochSummary& s, const Config& c) { return advise_straggler_rank(s, c.advisors); }},
  };
  return rules;
}

void cap_idle_gains(std::vector<Advice>& advice, const EpochSummary& summary) {
  const GpuEpochStats* gpu = summary.sections.get<GpuEpochStats>();
  if (gpu == nullptr || gpu->traced_steps == 0 || gpu->stats.traced_ns <= 0) return;
  const GpuStats& g = gpu->stats;
  const Nanos idle_ns = g.idle_data_wait_ns + g.idle_host_sync_ns + g.idle_pageable_copy_ns +
                        g.idle_launch_gap_ns + g.idle_other_ns;
  const double idle = static_cast<double>(idle_ns) / static_cast<double>(g.traced_ns);
  // A gain g comes from removing r = g / (1 + g) of the step (g = r / (1 - r)).
  auto removed = [](double gain) { return gain > 0 ? gain / (1.0 + gain) : 0.0; };
  double total = 0;
  for (const Advice& a : advice) {
    if (is_idle_cause(a.id)) total += removed(a.expected_gain);
  }
  if (total <= idle) return;
  const double scale = idle / total;
  for (Advice& a : advice) {
    if (!is_idle_cause(a.id) || a.expected_gain <= 0) continue;
    const double r = removed(a.expected_gain) * scale;
    a.evidence.push_back({"uncapped_expected_gain", a.expected_gain, "fraction"});
    a.expected_gain = r < 1.0 ? r / (1.0 - r) : 0.0;
    a.gain_estimated = true;
    a.action +=
        " (estimated gain scaled down: the idle-cause advice together cannot remove more than "
        "the " +
        std::to_string(static_cast<int>(100 * idle + 0.5)) + "% of step time the GPU idled)";
  }
}

std::vector<Advice> run_advisors(const EpochSummary& summary, const Config& config,
                                 std::vector<std::string>* errors) {
  std::vector<Advice> out;
  for (const AdvisorEntry& entry : advisor_registry()) {
    try {
      if (auto a = entry.rule(summary, config)) out.push_back(std::move(*a));
    } catch (const std::exception& e) {
      if (errors != nullptr) errors->push_back(std::string(entry.id) + ": " + e.what());
    } catch (...) {
      if (errors != nullptr) errors->push_back(std::string(entry.id) + ": unknown exception");
    }
  }
  cap_idle_gains(out, summary);
  return out;
}

}  // namespace torchpilot
