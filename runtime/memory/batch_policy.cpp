#include "torchpilot/runtime/memory/batch_policy.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "torchpilot/runtime/loader/loader_policy.h"
#include "torchpilot/runtime/memory/offload_policy.h"

namespace torchpilot {
namespace {

class MicroBatchPolicy final : public TuningPolicy {
 public:
  // `own`: the indexes of the trials proposed by this search, shared by its passes (a failure
  // is the micro-batch's only in those trials and the baseline).
  // `rescue_only`: proposes only while no micro-batch has run (the start does not fit), so that it
  // can go before other searches, whose trials would all fail at the start's micro-batch.
  explicit MicroBatchPolicy(std::shared_ptr<std::set<size_t>> own, bool rescue_only = false)
      : own_(std::move(own)), rescue_only_(rescue_only) {}
  std::string name() const override {
    return rescue_only_ ? "micro-batch rescue" : "micro-batch search";
  }

  std::optional<Setting> propose(const std::vector<TrialResult>& trials, size_t incumbent,
                                 const KnobRegistry& knobs) override {
    const Knob* k = knobs.find(kMicroBatchKnob);
    if (k == nullptr || k->domain.empty()) return std::nullopt;
    auto micro_of = [&](const TrialResult& t) {
      const auto it = t.setting.find(kMicroBatchKnob);
      return it != t.setting.end() ? it->second : k->get();
    };
    const TrialResult& best = trials[incumbent];
    // The smallest micro-batch that failed (larger ones would not fit either), and whether any
    // micro-batch ran at all. Only the baseline's and this policy's own trials count: an earlier
    // stage's trial failed for its own knob.
    int64_t failed_min = std::numeric_limits<int64_t>::max();
    bool any_ran = false;
    for (size_t i = 0; i < trials.size(); ++i) {
      const TrialResult& t = trials[i];
      if (i != 0 && !own_->count(i)) continue;
      if (t.failed) {
        failed_min = std::min(failed_min, micro_of(t));
      } else {
        any_ran = true;
      }
    }
    auto with_only = [&](int64_t micro) {
      Setting s = best.setting;
      s[kMicroBatchKnob] = micro;
      return s;
    };
    // Tried with the best's other knobs (after the loader's settings changed, a micro-batch is
    // worth measuring again: a data-bound step hid its effect).
    auto tried = [&](int64_t micro) {
      const Setting s = with_only(micro);
      return std::any_of(trials.begin(), trials.end(),
                         [&](const TrialResult& t) { return t.setting == s; });
    };
    auto with = [&](int64_t micro) {
      Setting s = best.setting;
      s[kMicroBatchKnob] = micro;
      own_->insert(trials.size());  // the index the proposed trial will have
      return s;
    };
    if (!any_ran || best.failed) {
      // The start does not fit: smaller ones, largest first.
      for (auto it = k->domain.rbegin(); it != k->domain.rend(); ++it) {
        if (*it < failed_min && !tried(*it)) return with(*it);
      }
      return std::nullopt;
    }
    if (rescue_only_) return std::nullopt;
    const int64_t current = micro_of(best);
    for (int64_t micro : k->domain) {
      if (micro <= current) continue;
      if (micro >= failed_min) return std::nullopt;
      if (!tried(micro)) return with(micro);
      // Tried already: a clear decline ends the sweep; a trial that merely did not win does not.
      const Setting s = with_only(micro);
      for (const auto& t : trials) {
        if (t.setting == s && (t.failed || t.throughput < kDecline * best.throughput)) {
          return std::nullopt;
        }
      }
    }
    return std::nullopt;
  }

 private:
  static constexpr double kDecline = 0.85;  // as the loader's sweep
  std::shared_ptr<std::set<size_t>> own_;
  bool rescue_only_;
};

class SequencePolicy final : public TuningPolicy {
 public:
  SequencePolicy(std::vector<PolicyStage> factories, int max_passes, std::string repeat_knob)
      : factories_(std::move(factories)),
        used_(factories_.size(), false),
        max_passes_(std::max(1, max_passes)),
        repeat_knob_(std::move(repeat_knob)) {
    start_pass();
  }
  // The stages that proposed a trial ("loader coordinate search, then micro-batch search"); every
  // stage's when none did.
  std::string name() const override {
    std::string used, all;
    for (size_t i = 0; i < stages_.size(); ++i) {
      if (used_[i]) used += (used.empty() ? "" : ", then ") + stages_[i]->name();
      all += (all.empty() ? "" : ", then ") + stages_[i]->name();
    }
    if (!used.empty()) return used;
    return all.empty() ? "none" : all;
  }
  std::optional<Setting> propose(const std::vector<TrialResult>& trials, size_t incumbent,
                                 const KnobRegistry& knobs) override {
    if (!pass_started_) {
      pass_start_ = trials[incumbent].setting;
      pass_best_ = incumbent;
      pass_first_ = trials.size();
      pass_started_ = true;
    }
    for (;;) {
      for (; current_ < stages_.size(); ++current_) {
        std::optional<Setting> next;
        if (pass_ == 0 || factories_[current_].whole_history) {
          next = stages_[current_]->propose(trials, incumbent, knobs);
        } else {
          // The pass's view: the best at its start, then its own trials (the incumbent is one of
          // them, or still that best).
          std::vector<TrialResult> view;
          view.reserve(1 + trials.size() - std::min(trials.size(), pass_first_));
          view.push_back(trials[pass_best_]);
          for (size_t i = pass_first_; i < trials.size(); ++i) view.push_back(trials[i]);
          const size_t at = incumbent >= pass_first_ ? incumbent - pass_first_ + 1 : 0;
          next = stages_[current_]->propose(view, at, knobs);
        }
        if (next) {
          used_[current_] = true;
          return next;
        }
      }
      // The knobs interact (a loader sized for slow steps starves faster ones): while the best
      // moved during a pass, the stages run again from it.
      if (++pass_ >= max_passes_ || !moved(trials[incumbent].setting)) return std::nullopt;
      pass_start_ = trials[incumbent].setting;
      pass_best_ = incumbent;
      pass_first_ = trials.size();
      start_pass();
    }
  }
  int extra_settle_steps(const Setting& from, const Setting& to) const override {
    int extra = 0;
    for (const auto& s : stages_) extra = std::max(extra, s->extra_settle_steps(from, to));
    return extra;
  }

 private:
  bool moved(const Setting& best) const {
    if (repeat_knob_.empty()) return best != pass_start_;
    const auto a = best.find(repeat_knob_), b = pass_start_.find(repeat_knob_);
    if (a == best.end() || b == pass_start_.end()) return false;
    return a->second != b->second;
  }
  void start_pass() {
    stages_.clear();
    for (const auto& stage : factories_) stages_.push_back(stage.make());
    current_ = 0;
  }
  std::vector<PolicyStage> factories_;
  std::vector<std::unique_ptr<TuningPolicy>> stages_;
  std::vector<bool> used_;
  size_t current_ = 0;
  int pass_ = 0;
  const int max_passes_;
  const std::string repeat_knob_;
  Setting pass_start_;
  size_t pass_best_ = 0;   // the incumbent when the pass began
  size_t pass_first_ = 0;  // the pass's first trial
  bool pass_started_ = false;
};

}  // namespace

std::unique_ptr<TuningPolicy> make_micro_batch_policy(const AutotuneConfig&) {
  return std::make_unique<MicroBatchPolicy>(std::make_shared<std::set<size_t>>());
}

std::unique_ptr<TuningPolicy> make_sequence_policy(std::vector<PolicyStage> stages, int max_passes,
                                                   std::string repeat_knob) {
  return std::make_unique<SequencePolicy>(std::move(stages), max_passes, std::move(repeat_knob));
}

std::unique_ptr<TuningPolicy> make_autotune_policy(const AutotuneConfig& config) {
  std::vector<PolicyStage> stages;
  // The micro-batch's keeps every pass's failures (a micro-batch that ran out of memory is not
  // tried again); a start that does not fit is rescued first (smaller micro-batches), before
  // the loader's trials, which would all fail at it.
  auto own = std::make_shared<std::set<size_t>>();
  if (config.tune_micro_batch) {
    stages.push_back({[own] { return std::make_unique<MicroBatchPolicy>(own, true); }, true});
  }
  // The loader's search reads worker counts tried under any setting as tried: afresh each pass.
  stages.push_back({[config] { return make_loader_policy(config); }, false});
  if (config.tune_micro_batch) {
    stages.push_back({[own] { return std::make_unique<MicroBatchPolicy>(own); }, true});
  }
  // Activation offloading, after the micro-batch: worth a trial only where memory ended that
  // search (offload_policy.h); inert without the offload.enabled knob.
  if (config.tune_micro_batch) {
    stages.push_back({[] { return make_offload_policy(kMicroBatchKnob); }, true});
  }
  const int passes = stages.size() > 1 ? kAutotunePasses : 1;
  return make_sequence_policy(std::move(stages), passes, kMicroBatchKnob);
}

}  // namespace torchpilot
