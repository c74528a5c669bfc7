// The advisor catalog in one place: every rule, in the order its advice is listed.
#include <exception>

#include "torchpilot/advisors/advisors.h"

namespace torchpilot {

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
      {"low_mfu",
       [](const EpochSummary& s, const Config& c) { return advise_low_mfu(s, c.advisors); }},
  };
  return rules;
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
  return out;
}

}  // namespace torchpilot
