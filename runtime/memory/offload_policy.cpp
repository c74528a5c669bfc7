#include "torchpilot/runtime/memory/offload_policy.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

namespace torchpilot {
namespace {

int64_t value_or(const Setting& s, const std::string& knob, int64_t fallback) {
  const auto it = s.find(knob);
  return it == s.end() ? fallback : it->second;
}

class OffloadPolicy final : public TuningPolicy {
 public:
  explicit OffloadPolicy(std::string micro) : micro_(std::move(micro)) {}
  std::string name() const override { return "activation offloading"; }

  std::optional<Setting> propose(const std::vector<TrialResult>& trials, size_t incumbent,
                                 const KnobRegistry& knobs) override {
    if (done_ || knobs.find(kOffloadKnob) == nullptr || trials.empty()) return std::nullopt;
    const TrialResult& best = trials[incumbent];
    const Knob* micro = knobs.find(micro_);
    if (proposed_ > 0) return next_after(trials, best, micro);
    if (value_or(best.setting, kOffloadKnob, 0) != 0) return stop();
    Setting s = best.setting;
    s[kOffloadKnob] = 1;
    if (best.failed) return propose_setting(trials, s);
    if (micro == nullptr || best.setting.count(micro_) == 0) return stop();
    // The smallest micro-batch above the incumbent's that failed without offloading.
    const int64_t current = best.setting.at(micro_);
    std::optional<int64_t> failed;
    for (const auto& t : trials) {
      if (!t.failed || value_or(t.setting, kOffloadKnob, 0) != 0) continue;
      const int64_t m = value_or(t.setting, micro_, current);
      if (m > current && (!failed || m < *failed)) failed = m;
    }
    if (!failed) return stop();
    s[micro_] = *failed;
    return propose_setting(trials, s);
  }

 private:
  std::optional<Setting> next_after(const std::vector<TrialResult>& trials, const TrialResult& best,
                                    const Knob* micro) {
    const TrialResult& last = trials.back();
    if (last.failed || micro == nullptr || last.setting.count(micro_) == 0) return stop();
    if (last.throughput < 0.85 * best.throughput) return stop();  // a clear decline
    const int64_t m = last.setting.at(micro_);
    const auto it = std::upper_bound(micro->domain.begin(), micro->domain.end(), m);
    if (it == micro->domain.end()) return stop();
    Setting s = last.setting;
    s[micro_] = *it;
    return propose_setting(trials, s);
  }
  // A setting already tried (in this pass or, with the micro-batch moved, an earlier one of the
  // sequence) ends the stage instead.
  std::optional<Setting> propose_setting(const std::vector<TrialResult>& trials, Setting s) {
    for (const auto& t : trials) {
      if (t.setting == s) return stop();
    }
    ++proposed_;
    return s;
  }
  std::optional<Setting> stop() {
    done_ = true;
    return std::nullopt;
  }

  std::string micro_;
  int proposed_ = 0;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<TuningPolicy> make_offload_policy(std::string micro_batch_knob) {
  return std::make_unique<OffloadPolicy>(std::move(micro_batch_knob));
}

}  // namespace torchpilot
