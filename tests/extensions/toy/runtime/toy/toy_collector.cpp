// The toy's collector and its config sections, registered with the kernel at static
// initialization: nothing outside this folder names them.
#include <memory>
#include <string>

#include "runtime/toy/toy.h"
#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/config_section.h"

namespace toy {

std::string section_json(const ToyStats& s) {
  return "{\"steps\":" + std::to_string(s.steps) +
         ",\"slow_steps\":" + std::to_string(s.slow_steps) + "}";
}

void section_text(const ToyStats& s, const torchpilot::EpochSummary&,
                  std::vector<std::string>& lines) {
  lines.push_back("  toy: " + std::to_string(s.slow_steps) + " of " + std::to_string(s.steps) +
                  " steps slow");
}

namespace {

class ToyCollector final : public torchpilot::Collector {
 public:
  explicit ToyCollector(double slow_ms) : slow_ns_(static_cast<torchpilot::Nanos>(slow_ms * 1e6)) {}
  std::string name() const override { return "toy"; }
  void on_step_end(torchpilot::StepRecord& r) override {
    ++stats_.steps;
    if (r.end_ns - r.begin_ns > slow_ns_) ++stats_.slow_steps;
  }
  void on_epoch_end(torchpilot::EpochSummary& summary) override {
    summary.sections.set(stats_);
    stats_ = {};
  }

 private:
  torchpilot::Nanos slow_ns_;
  ToyStats stats_;
};

using torchpilot::config_key;

const bool registered = [] {
  torchpilot::register_config_section<ToyConfig>(
      {config_key<ToyConfig, &ToyConfig::slow_ms>("slow_ms", 0.0, 1e6),
       config_key<ToyConfig, &ToyConfig::enabled>("enabled")});
  torchpilot::register_config_section<ToyAdvisorConfig>(
      {config_key<ToyAdvisorConfig, &ToyAdvisorConfig::threshold>("threshold", 0.0, 1.0)});
  // `always`: a pure collector, made even when the device collectors are off.
  torchpilot::register_default_collector(
      "toy", 100,
      [](torchpilot::CollectorHost& host) -> std::unique_ptr<torchpilot::Collector> {
        const ToyConfig& c = host.config().section<ToyConfig>();
        if (!c.enabled) return nullptr;
        return std::make_unique<ToyCollector>(c.slow_ms);
      },
      /*always=*/true);
  return true;
}();

}  // namespace
}  // namespace toy
