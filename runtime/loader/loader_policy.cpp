#include "torchpilot/runtime/loader/loader_policy.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "torchpilot/runtime/loader/loader_model.h"

namespace torchpilot {
namespace {

constexpr const char* kWorkers = "loader.workers";
constexpr const char* kPrefetch = "loader.prefetch";
constexpr const char* kPin = "loader.pin_memory";
constexpr const char* kDevicePrefetch = "loader.device_prefetch";
constexpr const char* kBucket = "grad_sync.bucket_mb";  // torchpilot::GradSync::knob()

// Stages in order; each proposes settings that differ from the incumbent in one knob:
//   sweep    workers 1, 2, 4, ... up to the maximum, on through a trial that merely fails to win
//            (one worker often gains nothing over none when there is little compute to overlap),
//            ending at a clear decline;
//   pin, device prefetch   each toggled (they change how much the training thread pays per batch,
//            so they come before the finer worker search); a toggle that lost because the
//            workers could not keep up (they do the pinning) is tried once more with the workers
//            its measured consumer rate and worker capacity call for;
//   prefetch deeper depths, on through a depth that did not win, ending at a clear decline;
//   bisect   worker counts between the best and its nearest tried neighbours, above first;
//   bucket   the gradient all-reduce's bucket size (data parallel): the next larger choices, on
//            through one that did not win, ending at a clear decline; then the smaller ones.
// If the best changed during pin..bisect, those stages run again from the new best (at most three
// passes): the knobs interact, e.g. pinning pays off only once there are enough workers.
class LoaderPolicy final : public TuningPolicy {
 public:
  explicit LoaderPolicy(AutotuneConfig config) : config_(std::move(config)) {}
  std::string name() const override { return "loader coordinate search"; }

  std::optional<Setting> propose(const std::vector<TrialResult>& trials, size_t incumbent,
                                 const KnobRegistry& knobs) override {
    const Setting& best = trials[incumbent].setting;
    // A knob value whose setter threw (out of memory, refused) is not tried again elsewhere.
    for (const auto& [i, changed] : changes_) {
      // Only a one-knob change pins the failure on a value.
      if (i < trials.size() && trials[i].failed && changed.size() == 1)
        failed_values_.insert(changed[0]);
    }
    auto tried = [&](const Setting& s) {
      for (const auto& [knob, value] : s) {
        if (failed_values_.count({knob, value})) return true;
      }
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
        case kStageSweep:
          next = propose_sweep(trials, incumbent, knobs, tried, with);
          break;
        case kStagePin:
          next = propose_toggle(kPin, config_.tune_pin_memory, trials, knobs, best, tried, with);
          break;
        case kStageDevicePrefetch:
          next = propose_toggle(kDevicePrefetch, config_.tune_device_prefetch, trials, knobs, best,
                                tried, with);
          break;
        case kStagePrefetch:
          next = propose_prefetch(trials, incumbent, knobs, tried, with);
          break;
        case kStageBisect:
          next = propose_bisect(trials, incumbent, knobs, tried, with);
          break;
        case kStageBucket:
          next = propose_bucket(trials, incumbent, knobs, with);
          break;
        default:
          break;
      }
      if (next) {
        // Keyed by the index the proposed trial will have: another policy's trials may come
        // before (batch_policy.h runs the loader's search again after the micro-batch's).
        auto& changed = changes_[trials.size()];
        for (const auto& [knob, value] : *next) {
          auto it = best.find(knob);
          if (it == best.end() || it->second != value) changed.emplace_back(knob, value);
        }
        return next;
      }
      stage_ = static_cast<Stage>(stage_ + 1);
      if (stage_ == kStagePin && passes_ == 0) pass_start_ = best;
      if (stage_ == kDone && best != pass_start_ && ++passes_ < kMaxPasses) {
        // The best moved during this pass (knobs interact: pinning pays off only with enough
        // workers): go round the other knobs again from the new best.
        pass_start_ = best;
        stage_ = kStagePin;
      }
    }
    return std::nullopt;
  }

 private:
  enum Stage {
    kStageSweep,
    kStagePin,
    kStageDevicePrefetch,
    kStagePrefetch,
    kStageBisect,
    kStageBucket,
    kDone
  };

  int64_t max_workers(const Knob& k) const {
    int64_t max = k.domain.empty() ? 0 : k.domain.back();
    if (config_.max_workers > 0) max = std::min<int64_t>(max, config_.max_workers);
    return max;
  }
  static int64_t workers_of(const TrialResult& t, const Knob& k) {
    auto it = t.setting.find(kWorkers);
    return it != t.setting.end() ? it->second : k.get();
  }
  // A trial's consumer rate (its own, without waiting) over one worker's capacity: the ratio
  // estimate_workers() sizes workers from, as the advice's batch time over compute time.
  static double workers_ratio(const TrialResult& t, int64_t workers) {
    const double consumer = t.throughput / std::max(0.05, 1.0 - t.data_wait_fraction);
    return std::max(t.demand, consumer) * static_cast<double>(workers) / t.supply_capacity;
  }
  bool declined(const TrialResult& t, const TrialResult& best) const {
    return t.failed || t.throughput < kDecline * best.throughput;
  }

  template <typename Tried, typename With>
  std::optional<Setting> propose_sweep(const std::vector<TrialResult>& trials, size_t incumbent,
                                       const KnobRegistry& knobs, Tried tried, With with) {
    const Knob* k = knobs.find(kWorkers);
    if (k == nullptr || k->domain.empty()) return std::nullopt;
    int64_t largest = 0;
    for (const auto& t : trials) largest = std::max(largest, workers_of(t, *k));
    // The first trial after the baseline: the count the data_starvation advice names, from the
    // baseline's figures and the same model (loader_model.h); the doubling goes on from there.
    if (!seeded_) {
      seeded_ = true;
      const TrialResult& base = trials[incumbent];
      const int64_t workers = workers_of(base, *k);
      if (!base.failed && workers > 0 && base.supply_capacity > 0 &&
          base.data_wait_fraction >= kProducerBoundWait) {
        const int64_t seed = std::min<int64_t>(
            max_workers(*k), estimate_workers(workers_ratio(base, workers), kNotMeasured,
                                              static_cast<int>(max_workers(*k)))
                                 .needed);
        Setting s = with(kWorkers, seed);
        if (seed > largest && !tried(s)) return s;
      }
    }
    // One worker can be slower than none (a hand-off with nothing to overlap): parallelism starts
    // at two, so a decline ends the sweep only from there on.
    if (largest >= 2 && declined(trials.back(), trials[incumbent])) return std::nullopt;
    const int64_t candidate = std::min(max_workers(*k), largest == 0 ? int64_t{1} : largest * 2);
    if (candidate <= largest) return std::nullopt;
    Setting s = with(kWorkers, candidate);
    if (tried(s)) return std::nullopt;
    return s;
  }

  template <typename Tried, typename With>
  std::optional<Setting> propose_bisect(const std::vector<TrialResult>& trials, size_t incumbent,
                                        const KnobRegistry& knobs, Tried tried, With with) {
    const Knob* k = knobs.find(kWorkers);
    if (k == nullptr || k->domain.empty()) return std::nullopt;
    const int64_t best = workers_of(trials[incumbent], *k);
    // Nearest worker counts tried on either side of the best (under any other setting).
    int64_t upper = -1, lower = -1;
    for (const auto& t : trials) {
      const int64_t w = workers_of(t, *k);
      if (w > best && (upper < 0 || w < upper)) upper = w;
      if (w < best && w > lower) lower = w;
    }
    for (int64_t candidate : {upper >= 0 ? best + (upper - best) / 2 : best,
                              lower >= 0 ? best - (best - lower) / 2 : best}) {
      if (candidate == best || candidate > max_workers(*k)) continue;
      Setting s = with(kWorkers, candidate);
      if (!tried(s)) return s;
    }
    return std::nullopt;
  }

  // Bucket sizes walk away from the best one choice at a time, up first (fewer, larger messages
  // reach more of the link), on through a size that merely did not win, ending at a decline or a
  // failure; then down. Every rank tries the same sizes at the same steps (the trial agreement):
  // a bucket layout must match across ranks.
  template <typename With>
  std::optional<Setting> propose_bucket(const std::vector<TrialResult>& trials, size_t incumbent,
                                        const KnobRegistry& knobs, With with) {
    const Knob* k = knobs.find(kBucket);
    if (k == nullptr || k->domain.size() < 2) return std::nullopt;
    const Setting& best = trials[incumbent].setting;
    const int64_t current = best.count(kBucket) ? best.at(kBucket) : k->get();
    const auto& d = k->domain;
    const auto at = std::lower_bound(d.begin(), d.end(), current);
    const auto pos = static_cast<int64_t>(at - d.begin());
    for (int64_t dir : {int64_t{1}, int64_t{-1}}) {
      // Upwards from the first choice above the best; downwards from the first below it.
      int64_t j = dir > 0 ? (at != d.end() && *at == current ? pos + 1 : pos) : pos - 1;
      for (; j >= 0 && j < static_cast<int64_t>(d.size()); j += dir) {
        const int64_t value = d[static_cast<size_t>(j)];
        if (failed_values_.count({kBucket, value})) break;
        const Setting s = with(kBucket, value);
        const auto t = std::find_if(trials.begin(), trials.end(),
                                    [&](const TrialResult& r) { return r.setting == s; });
        if (t == trials.end()) return s;
        if (declined(*t, trials[incumbent])) break;
      }
    }
    return std::nullopt;
  }

  template <typename Tried, typename With>
  std::optional<Setting> propose_prefetch(const std::vector<TrialResult>& trials, size_t incumbent,
                                          const KnobRegistry& knobs, Tried tried, With with) {
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
      // A depth that failed to apply ends the stage: deeper ones need more memory still.
      if (failed_values_.count({kPrefetch, c})) return std::nullopt;
      Setting s = with(kPrefetch, c);
      if (!tried(s)) return s;
      for (const auto& t : trials) {
        if (t.setting == s && declined(t, trials[incumbent])) return std::nullopt;
      }
    }
    return std::nullopt;
  }

  template <typename Tried, typename With>
  std::optional<Setting> propose_toggle(const char* knob, bool enabled,
                                        const std::vector<TrialResult>& trials,
                                        const KnobRegistry& knobs, const Setting& best, Tried tried,
                                        With with) {
    const Knob* k = knobs.find(knob);
    if (!enabled || k == nullptr || k->domain.size() < 2) return std::nullopt;
    const int64_t current = best.count(knob) ? best.at(knob) : k->get();
    Setting s = with(knob, current == 0 ? 1 : 0);
    if (!tried(s)) return s;
    // Pinning and GPU prefetch move work from the training thread to the workers. If the toggle
    // lost because the workers could not keep up, try it once more with the workers it needs.
    const Knob* w = knobs.find(kWorkers);
    for (const auto& t : trials) {
      if (t.setting != s || t.failed || w == nullptr) continue;
      if (!t.supply_limited && t.data_wait_fraction < kProducerBoundWait) return std::nullopt;
      const int64_t workers = workers_of(t, *w);
      const double ratio = t.supply_capacity > 0 ? workers_ratio(t, workers) : 1.5 * workers;
      const int64_t needed =
          estimate_workers(ratio * kWorkerHeadroom, kNotMeasured, static_cast<int>(max_workers(*w)))
              .needed;
      Setting rescue = s;
      rescue[kWorkers] = std::min(max_workers(*w), std::max(workers + 1, needed));
      if (rescue[kWorkers] > workers && !tried(rescue)) return rescue;
    }
    return std::nullopt;
  }

  // Pinned batches come from LibTorch's caching host allocator: each batch in flight gets a new
  // pinned block the first time (cudaHostAlloc, milliseconds for a large batch), cached after.
  // Measured at once, a pinning trial pays those allocations (on the H100 the jpeg example's
  // first pinning trial read 6,089 samples/s where the same workers unpinned read 11,246): it
  // settles until every batch in flight has had its block.
  int extra_settle_steps(const Setting& from, const Setting& to) const override {
    auto value = [](const Setting& s, const char* knob, int64_t fallback) {
      const auto it = s.find(knob);
      return it != s.end() ? it->second : fallback;
    };
    const int64_t pin = value(to, kPin, 0);
    if (pin == 0) return 0;
    const int64_t workers = value(to, kWorkers, 0), prefetch = value(to, kPrefetch, 2);
    const bool more_in_flight = value(from, kPin, 0) == 0 || workers > value(from, kWorkers, 0) ||
                                prefetch > value(from, kPrefetch, 2);
    if (!more_in_flight) return 0;
    return static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(1, workers) * prefetch + 2));
  }

  static constexpr double kDecline = 0.85;  // a trial this far below the best ends a sweep
  static constexpr double kProducerBoundWait = 0.02;  // data wait share that marks starved steps
  static constexpr double kWorkerHeadroom = 1.25;     // workers beyond the bare estimate

  static constexpr int kMaxPasses = 3;

  AutotuneConfig config_;
  Stage stage_ = kStageSweep;
  bool seeded_ = false;  // the model's worker count was considered
  Setting pass_start_;   // the best when the current pass over pin..bisect began
  int passes_ = 0;
  // Per proposal, by its trial's index: the knob values it changed from the best of its time.
  std::map<size_t, std::vector<std::pair<std::string, int64_t>>> changes_;
  std::set<std::pair<std::string, int64_t>> failed_values_;
};

}  // namespace

std::unique_ptr<TuningPolicy> make_loader_policy(const AutotuneConfig& config) {
  return std::make_unique<LoaderPolicy>(config);
}

}  // namespace torchpilot
