#include <algorithm>

#include "torchpilot/advisors.h"

namespace torchpilot {
namespace {

constexpr const char* kWorkers = "loader.workers";
constexpr const char* kPrefetch = "loader.prefetch";
constexpr const char* kPin = "loader.pin_memory";
constexpr const char* kDevicePrefetch = "loader.device_prefetch";

// Stages in order; each proposes settings that differ from the incumbent in one knob.
class LoaderPolicy final : public TuningPolicy {
 public:
  explicit LoaderPolicy(AutotuneConfig config) : config_(std::move(config)) {}
  std::string name() const override { return "loader coordinate search"; }

  std::optional<Setting> propose(const std::vector<TrialResult>& trials, size_t incumbent,
                                 const KnobRegistry& knobs) override {
    const Setting& best = trials[incumbent].setting;
    auto tried = [&](const Setting& s) {
      return std::any_of(trials.begin(), trials.end(),
                         [&](const TrialResult& t) { return t.setting == s; });
    };
    auto with = [&](const char* knob, int64_t value) {
      Setting s = best;
      s[knob] = value;
      return s;
    };
    // Each stage returns a candidate or moves on to the next stage.
    while (stage_ < kDone) {
      std::optional<Setting> next;
      switch (stage_) {
        case kStageWorkers: next = propose_workers(trials, incumbent, knobs, tried, with); break;
        case kStagePrefetch: next = propose_prefetch(trials, incumbent, knobs, tried, with); break;
        case kStagePin: next = propose_toggle(kPin, config_.tune_pin_memory, knobs, best, tried, with);
          break;
        case kStageDevicePrefetch:
          next = propose_toggle(kDevicePrefetch, config_.tune_device_prefetch, knobs, best, tried,
                                with);
          break;
        default: break;
      }
      if (next) return next;
      stage_ = static_cast<Stage>(stage_ + 1);
    }
    return std::nullopt;
  }

 private:
  enum Stage { kStageWorkers, kStagePrefetch, kStagePin, kStageDevicePrefetch, kDone };

  // Workers: a doubling sweep (1, 2, 4, ... up to the maximum), which goes on through a trial that
  // does not win (one worker often gains nothing over none when the step has little compute to
  // overlap) and stops only at a clear decline; then bisection below the first loss above the best.
  template <typename Tried, typename With>
  std::optional<Setting> propose_workers(const std::vector<TrialResult>& trials, size_t incumbent,
                                         const KnobRegistry& knobs, Tried tried, With with) {
    const Knob* k = knobs.find(kWorkers);
    if (k == nullptr || k->domain.empty()) return std::nullopt;
    int64_t max = k->domain.back();
    if (config_.max_workers > 0) max = std::min<int64_t>(max, config_.max_workers);
    auto workers_of = [&](const TrialResult& t) {
      auto it = t.setting.find(kWorkers);
      return it != t.setting.end() ? it->second : k->get();
    };
    const int64_t best = workers_of(trials[incumbent]);
    if (!sweep_done_) {
      int64_t largest = 0;
      for (const auto& t : trials) largest = std::max(largest, workers_of(t));
      const TrialResult& last = trials.back();
      const bool declining =
          trials.size() > 1 && (last.failed || last.throughput < kDecline * trials[incumbent].throughput);
      const int64_t candidate = std::min(max, largest == 0 ? int64_t{1} : largest * 2);
      if (!declining && candidate > largest) {
        Setting s = with(kWorkers, candidate);
        if (!tried(s)) return s;
      }
      sweep_done_ = true;
    }
    int64_t upper = max + 1;  // smallest worker count above the best that was tried (and lost)
    for (const auto& t : trials) {
      const int64_t w = workers_of(t);
      if (w > best) upper = std::min(upper, w);
    }
    if (upper == max + 1) return std::nullopt;
    const int64_t candidate = best + (upper - best) / 2;
    if (candidate <= best) return std::nullopt;
    Setting s = with(kWorkers, candidate);
    if (tried(s)) return std::nullopt;
    return s;
  }

  template <typename Tried, typename With>
  std::optional<Setting> propose_prefetch(const std::vector<TrialResult>& trials,
                                          size_t incumbent, const KnobRegistry& knobs, Tried tried,
                                          With with) {
    const Knob* k = knobs.find(kPrefetch);
    if (k == nullptr) return std::nullopt;
    const Setting& best = trials[incumbent].setting;
    // Without workers nothing is produced ahead, so prefetch depth changes nothing.
    if (best.count(kWorkers) && best.at(kWorkers) == 0) return std::nullopt;
    const int64_t current = best.count(kPrefetch) ? best.at(kPrefetch) : k->get();
    // Deeper prefetch, one step of the choices at a time, as the worker sweep: on through a
    // depth that did not win (its gain may sit just under the margin while a deeper one clears
    // it), ending at a depth that failed or clearly declined.
    std::vector<int> choices = config_.prefetch_choices;
    std::sort(choices.begin(), choices.end());
    for (int c : choices) {
      if (c <= current) continue;
      if (std::find(k->domain.begin(), k->domain.end(), c) == k->domain.end()) continue;
      Setting s = with(kPrefetch, c);
      if (!tried(s)) return s;
      for (const auto& t : trials) {
        if (t.setting == s &&
            (t.failed || t.throughput < kDecline * trials[incumbent].throughput)) {
          return std::nullopt;
        }
      }
    }
    return std::nullopt;
  }

  template <typename Tried, typename With>
  std::optional<Setting> propose_toggle(const char* knob, bool enabled, const KnobRegistry& knobs,
                                        const Setting& best, Tried tried, With with) {
    const Knob* k = knobs.find(knob);
    if (!enabled || k == nullptr || k->domain.size() < 2) return std::nullopt;
    const int64_t current = best.count(knob) ? best.at(knob) : k->get();
    Setting s = with(knob, current == 0 ? 1 : 0);
    if (tried(s)) return std::nullopt;
    return s;
  }

  static constexpr double kDecline = 0.85;  // a sweep trial this far below the best ends the sweep

  AutotuneConfig config_;
  Stage stage_ = kStageWorkers;
  bool sweep_done_ = false;
};

}  // namespace

std::unique_ptr<TuningPolicy> make_loader_policy(const AutotuneConfig& config) {
  return std::make_unique<LoaderPolicy>(config);
}

}  // namespace torchpilot
