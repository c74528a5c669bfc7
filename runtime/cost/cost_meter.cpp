// The cost subsystem's meter (core/cost_meter.h): the budget over the run and the epoch's "cost"
// section, from the time the kernel reports for its own calls.
#include "torchpilot/runtime/core/cost_meter.h"

#include <algorithm>
#include <cstdio>

#include "torchpilot/runtime/core/anchor.h"
#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/guard.h"
#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/cost/cost.h"

namespace torchpilot {
namespace {

class BudgetMeter final : public CostMeter {
 public:
  explicit BudgetMeter(const CostConfig& config)
      : budget_(config), own_threads_mark_(own_threads_cpu_ns()) {}

  void step_begins(Nanos now) override { budget_.start(now); }
  void spend_step_calls(Nanos now, Nanos ns) override {
    step_calls_ns_ += ns;
    budget_.spend(now, ns);
  }
  void step_part(const Collector* who, Nanos ns) override {
    for (auto& [c, sum] : step_parts_) {
      if (c == who) {
        sum += ns;
        return;
      }
    }
    step_parts_.emplace_back(who, ns);
  }
  void charge_window(Nanos now, Nanos ns) override {
    if (ns <= 0) return;
    window_ns_ += ns;
    budget_.spend(now, ns);
  }
  bool allows(Nanos now, Nanos estimate_ns) const override {
    return budget_.allows(now, estimate_ns);
  }
  std::string deferred(Nanos now, const std::string& what, Nanos estimate_ns) override;
  Nanos epoch_cost_ns() const override { return step_calls_ns_ + window_ns_ + end_carry_ns_; }
  void summarize(EpochSummary& summary, Nanos began, Nanos now,
                 std::vector<std::pair<std::string, Nanos>> parts,
                 const std::vector<Collector*>& live) override;
  void epoch_end_finished(Nanos began, Nanos cut, Nanos done) override {
    budget_.spend(done, done - began);
    const Nanos after_cut = done - (cut >= 0 ? cut : began);
    end_carry_ns_ += after_cut;
  }

 private:
  CostBudget budget_;
  Nanos step_calls_ns_ = 0, window_ns_ = 0;
  Nanos end_carry_ns_ = 0;  // the previous epoch end's sinks and flush (its "log" part)
  int64_t deferred_ = 0;
  bool warned_ = false;
  Nanos own_threads_mark_ = 0;
  std::vector<std::pair<const Collector*, Nanos>> step_parts_;  // this epoch's
};

std::string BudgetMeter::deferred(Nanos now, const std::string& what, Nanos estimate_ns) {
  ++deferred_;
  if (warned_) return {};
  warned_ = true;
  char buf[320];
  std::snprintf(
      buf, sizeof buf,
      "cost budget: %s deferred (about %.1f ms): torchpilot took %.1f ms of the %.1f ms "
      "its budget (%.2g%% of run time, cost.budget) allows over the last %.0f s; optional "
      "work waits until it fits (each epoch's 'torchpilot:' line counts what waited)",
      what.c_str(), static_cast<double>(estimate_ns) / 1e6,
      static_cast<double>(budget_.spent(now)) / 1e6,
      static_cast<double>(budget_.allowance(now)) / 1e6, 100 * budget_.budget(),
      budget_.horizon_s());
  return buf;
}

void BudgetMeter::summarize(EpochSummary& summary, Nanos began, Nanos now,
                            std::vector<std::pair<std::string, Nanos>> parts,
                            const std::vector<Collector*>& live) {
  auto largest_first = [](auto& v) {
    std::stable_sort(v.begin(), v.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
  };
  CostStats c;
  c.step_calls_ns = step_calls_ns_;
  c.epoch_end_ns = end_carry_ns_ + std::max<Nanos>(0, now - began);
  c.window_ns = window_ns_;
  c.training_thread_ns = c.step_calls_ns + c.epoch_end_ns + c.window_ns;
  c.epoch_ns = summary.wall_ns + std::max<Nanos>(0, now - began);
  c.fraction = fraction(c.training_thread_ns, c.epoch_ns);
  // The budget's view includes this epoch end so far (spent at its end).
  c.horizon_fraction = budget_.horizon_fraction(now);
  c.budget = budget_.budget();
  c.horizon_s = budget_.span_s(now);
  c.deferred = deferred_;
  const Nanos threads = own_threads_cpu_ns();
  c.own_threads_cpu_ns = std::max<Nanos>(0, threads - own_threads_mark_);
  own_threads_mark_ = threads;
  Nanos collectors_ns = 0;
  for (const auto& [who, ns] : step_parts_) {
    // A collector dropped since is no longer live: its name is not to be asked.
    const bool alive = std::find(live.begin(), live.end(), who) != live.end();
    c.step_parts.emplace_back(alive ? name_of(*who) : std::string("removed"), ns);
    collectors_ns += ns;
  }
  c.step_parts.emplace_back("pilot", std::max<Nanos>(0, c.step_calls_ns - collectors_ns));
  largest_first(c.step_parts);
  c.epoch_end_parts = std::move(parts);
  c.epoch_end_parts.emplace_back("log", end_carry_ns_);
  largest_first(c.epoch_end_parts);
  summary.sections.set(std::move(c));
  step_parts_.clear();
  step_calls_ns_ = window_ns_ = end_carry_ns_ = 0;
  deferred_ = 0;
}

}  // namespace

TORCHPILOT_REGISTRATION(cost) {
  register_cost_meter([](const Config& config) -> std::unique_ptr<CostMeter> {
    return std::make_unique<BudgetMeter>(config.cost);
  });
}

}  // namespace torchpilot
