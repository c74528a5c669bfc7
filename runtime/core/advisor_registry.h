// The advisor registry: the rules that turn an epoch's summary into advice. Subsystems register
// theirs at static initialization (the advisors library its catalog: advisors/core/registry.cpp;
// a new subsystem its own rule from its own folder); the Pilot runs every registered rule at each
// epoch's end, knowing none of them.
//
// Thread-safety: registration and reading are thread-safe. Failure behaviour: a rule that throws
// is skipped and reported; the others still run.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/advice.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/records.h"

namespace torchpilot {

// One rule: its advice id (equal to its config section, advisors.<id>.*) and the rule.
using AdvisorRule = std::optional<Advice> (*)(const EpochSummary& summary, const Config& config);
struct RegisteredAdvisor {
  std::string id;
  int order = 0;  // the advice's order in the log: lower first, then registration's
  AdvisorRule rule = nullptr;
};
void register_advisor(std::string id, int order, AdvisorRule rule);
std::vector<RegisteredAdvisor> registered_advisors();  // by order

// A pass over one epoch's advice after every rule ran (the idle-gain cap: advisors.h).
using AdvicePass = void (*)(std::vector<Advice>& advice, const EpochSummary& summary);
void register_advice_pass(AdvicePass pass);

// Runs every registered rule in order, then the passes. A rule that throws is skipped; its id and
// error are appended to `errors` (when given).
std::vector<Advice> run_registered_advisors(const EpochSummary& summary, const Config& config,
                                            std::vector<std::string>* errors = nullptr);

}  // namespace torchpilot
