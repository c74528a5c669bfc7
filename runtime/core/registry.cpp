// The kernel's registries (collector.h, sink.h): what subsystems register at static
// initialization, read by every Pilot at construction. Thread-safe.
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/collector.h"
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
}  // namespace

void register_default_collector(CollectorFactory factory, int order, bool always) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  collector_registry().push_back({factory, order, always});
}

std::vector<DefaultCollector> default_collectors() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<DefaultCollector> out = collector_registry();
  // Registration order (static initialization) breaks ties.
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.order < b.order; });
  return out;
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
  std::vector<DefaultSink> out = sink_registry();
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.order < b.order; });
  return out;
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

}  // namespace torchpilot
