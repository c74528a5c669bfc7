// The CommMonitor of the live torchpilot::Collectives, for hooks that time collectives themselves
// (GradSync on the GPU). Null when none observes. Thread-safety: any thread (an atomic load).
#pragma once

#include <memory>

#include "torchpilot/runtime/comm/comm_monitor.h"

namespace torchpilot {
namespace detail {
std::shared_ptr<CommMonitor> observing_comm_monitor();
}  // namespace detail
}  // namespace torchpilot
