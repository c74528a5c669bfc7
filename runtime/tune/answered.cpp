#include "torchpilot/runtime/tune/answered.h"

namespace torchpilot {

std::vector<std::string> advice_knobs(const std::string& id) {
  if (id == "data_starvation") return {"loader.workers", "loader.prefetch"};
  if (id == "pageable_copies") return {"loader.pin_memory"};
  if (id == "small_micro_batch") return {"batch.micro"};
  return {};
}

std::string answered_setting(const std::string& id, const TuningDecision* decision) {
  if (decision == nullptr) return {};
  Setting decided;
  for (const std::string& knob : advice_knobs(id)) {
    const auto it = decision->chosen.find(knob);
    if (it != decision->chosen.end()) decided.insert(*it);
  }
  return decided.empty() ? std::string() : to_string(decided);
}

void AnsweredAdvice::note(const std::vector<Advice>& advice) {
  for (const Advice& a : advice) {
    if (!advice_knobs(a.id).empty()) given_[a.id] = a;
  }
}

std::vector<AnsweredAdvice::Answer> AnsweredAdvice::answer(const TuningDecision& decision) {
  std::vector<Answer> out;
  for (auto it = given_.begin(); it != given_.end();) {
    std::string kept = answered_setting(it->first, &decision);
    if (kept.empty()) {
      ++it;
      continue;
    }
    out.push_back({it->first, it->second.epoch, it->second.action, std::move(kept)});
    it = given_.erase(it);
  }
  return out;
}

}  // namespace torchpilot
