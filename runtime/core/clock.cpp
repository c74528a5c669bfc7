#include "torchpilot/runtime/core/clock.h"

#include <time.h>

#include <chrono>

namespace torchpilot {

Nanos SteadyClock::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Nanos ThreadCpuClock::now_ns() const {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return -1;
  return static_cast<Nanos>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::shared_ptr<Clock> default_clock() {
  static const std::shared_ptr<Clock> clock = std::make_shared<SteadyClock>();
  return clock;
}

}  // namespace torchpilot
