// The toy's advisor: too many slow steps. Registered with the kernel's advisor registry; its
// threshold is its own config section, advisors.toy.*.
#include <optional>

#include "runtime/toy/toy.h"
#include "torchpilot/runtime/core/advisor_registry.h"
#include "torchpilot/runtime/core/config_section.h"

namespace toy {
namespace {

std::optional<torchpilot::Advice> advise_toy(const torchpilot::EpochSummary& summary,
                                             const torchpilot::Config& config) {
  const ToyStats* s = summary.sections.get<ToyStats>();
  if (s == nullptr || s->steps == 0) return std::nullopt;
  const double share = static_cast<double>(s->slow_steps) / static_cast<double>(s->steps);
  if (share <= config.section<ToyAdvisorConfig>().threshold) return std::nullopt;
  torchpilot::Advice a;
  a.id = "toy";
  a.severity = torchpilot::Severity::kWarning;
  a.finding = "slow steps";
  a.cause = "the toy says so";
  a.action = "make steps faster";
  a.evidence.push_back({"slow_step_share", share, "fraction"});
  return a;
}

const bool registered = (torchpilot::register_advisor("toy", 1000, &advise_toy), true);

}  // namespace
}  // namespace toy
