// The kernel's registries (collector.h, sink.h, tuning.h, cost_meter.h, advisor_registry.h): what subsystems register at static
// initialization, read by every Pilot at construction. Thread-safe.
#include <algorithm>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/advisor_registry.h"
#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/cost_meter.h"
#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/core/tuning.h"

namespace torchpilot {
namespace {
std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<DefaultCollector>& collector_registry() {
  static std::vector<DefaultCollector> entries;
  return entries;
}
std::vector<DefaultSink>& sink_registry() {
  static std::vector<DefaultSink> entries;
  return entries;
}
TunerFactory& tuner_registry() {
  static TunerFactory factory = nullptr;
  return factory;
}
std::vector<ConfigResolver>& resolver_registry() {
  static std::vector<ConfigResolver> entries;
  return entries;
}
CostMeterFactory& cost_meter_registry() {
  static CostMeterFactory factory = nullptr;
  return factory;
}
std::vector<RegisteredAdvisor>& advisor_entries() {
  static std::vector<RegisteredAdvisor> entries;
  return entries;
}
std::vector<AdvicePass>& advice_passes() {
  static std::vector<AdvicePass> entries;
  return entries;
}
template <typename T>
std::vector<T> by_order(std::vector<T> out) {
  // Registration order (static initialization) breaks ties.
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.order < b.order; });
  return out;
}
}  // namespace

void register_default_collector(std::string name, int order, CollectorFactory factory,
                                bool always) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  collector_registry().push_back({std::move(name), factory, order, always});
}

std::vector<DefaultCollector> default_collectors() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return by_order(collector_registry());
}

void register_config_resolver(ConfigResolver resolver) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  resolver_registry().push_back(resolver);
}

std::vector<ConfigResolver> config_resolvers() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return resolver_registry();
}

void register_default_sink(std::string name, int order, SinkFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  sink_registry().push_back({std::move(name), order, factory});
}

std::vector<DefaultSink> default_sinks() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return by_order(sink_registry());
}

bool default_sink_registered(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const auto& all = sink_registry();
  return std::any_of(all.begin(), all.end(), [&](const auto& d) { return d.name == name; });
}

void register_tuner(TunerFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  tuner_registry() = factory;
}

TunerFactory tuner_factory() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return tuner_registry();
}

void register_cost_meter(CostMeterFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  cost_meter_registry() = factory;
}

CostMeterFactory cost_meter_factory() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return cost_meter_registry();
}

void register_advisor(std::string id, int order, AdvisorRule rule) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  advisor_entries().push_back({std::move(id), order, rule});
}

std::vector<RegisteredAdvisor> registered_advisors() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return by_order(advisor_entries());
}

void register_advice_pass(AdvicePass pass) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  advice_passes().push_back(pass);
}

std::vector<Advice> run_registered_advisors(const EpochSummary& summary, const Config& config,
                                            std::vector<std::string>* errors) {
  std::vector<Advice> out;
  for (const RegisteredAdvisor& entry : registered_advisors()) {
    try {
      if (auto a = entry.rule(summary, config)) out.push_back(std::move(*a));
    } catch (const std::exception& e) {
      if (errors != nullptr) errors->push_back(entry.id + ": " + e.what());
    } catch (...) {
      if (errors != nullptr) errors->push_back(entry.id + ": unknown exception");
    }
  }
  std::vector<AdvicePass> passes;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    passes = advice_passes();
  }
  for (AdvicePass pass : passes) pass(out, summary);
  return out;
}

}  // namespace torchpilot
