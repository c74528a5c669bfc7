// The log shim for hooks/flop_counter.cpp (flop_log.h).
#include "torchpilot/runtime/flop_log.h"

#include <spdlog/spdlog.h>

namespace torchpilot {

void flop_log(spdlog::logger& logger, FlopLogLevel level, const std::string& message) {
  switch (level) {
    case FlopLogLevel::kDebug:
      logger.debug("{}", message);
      break;
    case FlopLogLevel::kInfo:
      logger.info("{}", message);
      break;
    case FlopLogLevel::kWarn:
      logger.warn("{}", message);
      break;
    case FlopLogLevel::kError:
      logger.error("{}", message);
      break;
  }
}

}  // namespace torchpilot
