// What a test's Pilot is made of: a manual clock, a recording sink and a log the test reads; the
// rigs derive from it and make the Pilot from options().
#pragma once

#include <memory>
#include <sstream>
#include <string>

#include "fakes/string_logger.h"
#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/core/sink.h"

namespace torchpilot {
namespace test {

struct PilotParts {
  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>();
  std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
  std::ostringstream log;
  std::unique_ptr<Pilot> pilot;

  PilotParts() = default;
  PilotParts(const PilotParts&) = delete;
  PilotParts& operator=(const PilotParts&) = delete;
  ~PilotParts() { pilot.reset(); }

  // Options with a logger `logger_name` writing into `log`, the clock and the sink.
  PilotOptions options(const std::string& logger_name) {
    PilotOptions o;
    o.logger = string_logger(logger_name, log);
    o.clock = clock;
    o.sinks = {sink};
    return o;
  }
};

}  // namespace test
}  // namespace torchpilot
