// The advisor catalog: every rule of the advisors library, registered with the kernel's advisor
// registry (runtime/core/advisor_registry.h) in the order its advice is listed.
#include <exception>
#include <string>

#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/core/advisor_registry.h"
#include "torchpilot/runtime/core/anchor.h"

namespace torchpilot {

bool is_idle_cause(const std::string& id) {
  return id == "data_starvation" || id == "host_sync" || id == "pageable_copies" ||
         id == "launch_bound";
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
  return run_registered_advisors(summary, config, errors);
}

namespace {
// The catalog, in the order its advice is listed (docs/advice.md). Each rule reads its own
// section, advisors.<id>.*, of the config.
template <std::optional<Advice> (*Rule)(const EpochSummary&, const AdvisorsConfig&)>
std::optional<Advice> rule(const EpochSummary& summary, const Config& config) {
  return Rule(summary, config.advisors);
}

}  // namespace

TORCHPILOT_REGISTRATION(advisors) {
  struct Row {
    const char* id;
    AdvisorRule rule;
  };
  const Row catalog[] = {
      {"data_starvation", rule<advise_data_starvation>},
      {"busy_inefficient", rule<advise_busy_inefficient>},
      {"host_sync", rule<advise_host_sync>},
      {"pageable_copies", rule<advise_pageable_copies>},
      {"launch_bound", rule<advise_launch_bound>},
      {"fp32_matmul", rule<advise_fp32_matmul>},
      {"unfused_attention", rule<advise_unfused_attention>},
      {"unfused_linear_bias", rule<advise_unfused_linear_bias>},
      {"per_parameter_optimizer", rule<advise_per_parameter_optimizer>},
      {"host_bound", rule<advise_host_bound>},
      {"periodic_stall", rule<advise_periodic_stall>},
      {"low_mfu", rule<advise_low_mfu>},
      {"memory_pressure", rule<advise_memory_pressure>},
      {"small_micro_batch", rule<advise_small_micro_batch>},
      {"checkpoint", rule<advise_checkpoint>},
      {"exposed_communication", rule<advise_exposed_communication>},
      {"low_bus_bandwidth", rule<advise_low_bus_bandwidth>},
      {"straggler_rank", rule<advise_straggler_rank>},
  };
  int order = 0;
  for (const Row& row : catalog) register_advisor(row.id, order += 10, row.rule);
  register_advice_pass(&cap_idle_gains);
}

}  // namespace torchpilot
