#include "torchpilot/runtime/reports/findings.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "torchpilot/runtime/tune/answered.h"

namespace torchpilot {
namespace {

// The one advice that names its subject: straggler_rank's "rank" evidence.
std::string subject_of(const Advice& a) {
  for (const Evidence& e : a.evidence) {
    if (e.unit == "rank" && std::isfinite(e.value)) {
      return "rank " + std::to_string(static_cast<int64_t>(e.value));
    }
  }
  return {};
}

}  // namespace

Findings rank_findings(const std::vector<EpochSummary>& epochs,
                       const std::vector<std::vector<Advice>>& advice,
                       const TuningDecision* decision) {
  const size_t n = std::min(epochs.size(), advice.size());
  std::vector<Finding> all;
  std::vector<size_t> last_index;    // per finding: the index of the last epoch that gave it
  std::vector<bool> after_decision;  // per finding: an epoch begun after the decision gave it
  for (size_t i = 0; i < n; ++i) {
    const bool after = decision != nullptr && epochs[i].first_step > decision->decided_at_step;
    for (const Advice& a : advice[i]) {
      const std::string subject = subject_of(a);
      auto it = std::find_if(all.begin(), all.end(), [&](const Finding& f) {
        return f.id == a.id && f.subject == subject;
      });
      if (it == all.end()) {
        all.push_back({a.id, subject, a, {}, answered_setting(a.id, decision)});
        last_index.push_back(i);
        after_decision.push_back(false);
        it = all.end() - 1;
      }
      const size_t k = static_cast<size_t>(it - all.begin());
      const double figure = a.evidence.empty() ? 0 : a.evidence.front().value;
      // One point per epoch: an advisor that spoke twice in an epoch keeps its last word.
      if (!it->trend.empty() && it->trend.back().epoch == epochs[i].epoch) {
        it->trend.back() = {epochs[i].epoch, a.expected_gain, figure};
      } else {
        it->trend.push_back({epochs[i].epoch, a.expected_gain, figure});
      }
      it->latest = a;
      last_index[k] = i;
      after_decision[k] = after_decision[k] || after;
    }
  }
  Findings out;
  for (size_t k = 0; k < all.size(); ++k) {
    if (!all[k].tuned_setting.empty() && !after_decision[k]) {
      out.answered.push_back(std::move(all[k]));
    } else if (last_index[k] + 1 == n) {
      out.ranked.push_back(std::move(all[k]));
    } else {
      out.earlier.push_back(std::move(all[k]));
    }
  }
  std::stable_sort(out.ranked.begin(), out.ranked.end(), [](const Finding& a, const Finding& b) {
    return std::make_tuple(-a.latest.expected_gain, -static_cast<int>(a.latest.severity), a.id,
                           a.subject) < std::make_tuple(-b.latest.expected_gain,
                                                        -static_cast<int>(b.latest.severity), b.id,
                                                        b.subject);
  });
  std::stable_sort(out.earlier.begin(), out.earlier.end(), [](const Finding& a, const Finding& b) {
    return a.trend.back().epoch > b.trend.back().epoch;
  });
  return out;
}

}  // namespace torchpilot
