// Advice the run's own tuning has answered: advice about knobs that auto-tune then decided by
// measuring them (docs/reports.md, "What to fix first"). One rule for the HTML report's findings
// (runtime/reports/findings.cpp), the log and the JSON lines (runtime/reports/sinks.cpp): the JPEG
// example's epoch 0 advised prefetch 8, the tuner measured 8 worse and kept 4, and the log kept
// the advice as if it stood.
// Thread-safety: AnsweredAdvice as the sink that holds it (one thread). Nothing here throws
// except std::bad_alloc.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/advice.h"
#include "torchpilot/runtime/core/tuning.h"

namespace torchpilot {

// The auto-tune knobs an advice's action is about (empty: none).
std::vector<std::string> advice_knobs(const std::string& advice_id);

// The decision's setting of the advice's knobs ("loader.prefetch=4 loader.workers=4"), "" when
// there is no decision or it set none of them.
std::string answered_setting(const std::string& advice_id, const TuningDecision* decision);

// The advice given before a decision, the latest of each id, until a decision answers it.
class AnsweredAdvice {
 public:
  struct Answer {
    std::string id;
    int64_t epoch = 0;   // the latest epoch that gave it
    std::string action;  // what it said to do
    std::string kept;    // what the tuner measured and kept (answered_setting)
  };
  // An epoch's advice.
  void note(const std::vector<Advice>& advice);
  // The noted advice this decision answers, in id order; forgotten once answered.
  std::vector<Answer> answer(const TuningDecision& decision);

 private:
  std::map<std::string, Advice> given_;  // by id: at most one per advisor
};

}  // namespace torchpilot
