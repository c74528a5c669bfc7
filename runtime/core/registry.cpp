// The kernel's registries (collector.h, sink.h, tuning.h, cost_meter.h, advisor_registry.h): what
// subsystems register at static initialization, read by every Pilot at construction. Thread-safe.
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
// Everything registered, behind one mutex. Made on first use: registrations run during other
// objects' static initialization, in no set order.
struct Registries {
  std::mutex mu;
  std::vector<DefaultCollector> collectors;
  std::vector<DefaultSink> sinks;
  std::vector<ConfigResolver> resolvers;
  std::vector<RegisteredAdvisor> advisors;
  std::vector<AdvicePass> advice_passes;
  TunerFactory tuner = nullptr;
  CostMeterFactory cost_meter = nullptr;
};
Registries& registries() {
  static Registries* r = new Registries();  // never destroyed: read until the process ends
  return *r;
}
// Runs `fn` on the registries under their mutex and returns what it returns.
template <typename Fn>
auto locked(Fn&& fn) {
  Registries& r = registries();
  std::lock_guard<std::mutex> lock(r.mu);
  return fn(r);
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
  locked([&](Registries& r) { r.collectors.push_back({std::move(name), factory, order, always}); });
}

std::vector<DefaultCollector> default_collectors() {
  return by_order(locked([](Registries& r) { return r.collectors; }));
}

void register_config_resolver(ConfigResolver resolver) {
  locked([&](Registries& r) { r.resolvers.push_back(resolver); });
}

std::vector<ConfigResolver> config_resolvers() {
  return locked([](Registries& r) { return r.resolvers; });
}

void register_default_sink(std::string name, int order, SinkFactory factory) {
  locked([&](Registries& r) { r.sinks.push_back({std::move(name), order, factory}); });
}

std::vector<DefaultSink> default_sinks() {
  return by_order(locked([](Registries& r) { return r.sinks; }));
}

bool default_sink_registered(const std::string& name) {
  return locked([&](Registries& r) {
    return std::any_of(r.sinks.begin(), r.sinks.end(),
                       [&](const auto& d) { return d.name == name; });
  });
}

void register_tuner(TunerFactory factory) {
  locked([&](Registries& r) { r.tuner = factory; });
}

TunerFactory tuner_factory() {
  return locked([](Registries& r) { return r.tuner; });
}

void register_cost_meter(CostMeterFactory factory) {
  locked([&](Registries& r) { r.cost_meter = factory; });
}

CostMeterFactory cost_meter_factory() {
  return locked([](Registries& r) { return r.cost_meter; });
}

void register_advisor(std::string id, int order, AdvisorRule rule) {
  locked([&](Registries& r) { r.advisors.push_back({std::move(id), order, rule}); });
}

std::vector<RegisteredAdvisor> registered_advisors() {
  return by_order(locked([](Registries& r) { return r.advisors; }));
}

void register_advice_pass(AdvicePass pass) {
  locked([&](Registries& r) { r.advice_passes.push_back(pass); });
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
  for (AdvicePass pass : locked([](Registries& r) { return r.advice_passes; })) pass(out, summary);
  return out;
}

}  // namespace torchpilot
