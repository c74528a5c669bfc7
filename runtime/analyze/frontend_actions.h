// Actions in the language of the trainer a trace came from (docs/analyze.md, "Python or C++"):
// the advisors write their actions for a LibTorch trainer with torchpilot linked in
// (torchpilot::watch, at::autocast, TunableLoader); a trace that Python's torch.profiler made
// (KinetoTrace::frontend) gets the same advice with the Python API's way of doing it. Pure.
#pragma once

#include <string>
#include <vector>

#include "torchpilot/runtime/core/advice.h"

namespace torchpilot {

// The Python action for an advice id, "" when the advisors' own action serves (it names no C++).
std::string python_action(const std::string& advice_id);

// For frontend "python": each advice with a Python action gets it, followed by the advisor's
// estimate (the action's part from its "estimated ..." or "the gain ..." clause, which says what
// the figure rests on). Other frontends: unchanged.
void use_frontend_actions(const std::string& frontend, std::vector<Advice>& advice);

}  // namespace torchpilot
