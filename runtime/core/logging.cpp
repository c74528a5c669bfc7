#include "torchpilot/runtime/core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <mutex>

namespace torchpilot {

std::shared_ptr<spdlog::logger> torchpilot_logger() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto logger = spdlog::get("torchpilot");
  if (!logger) {
    logger = std::make_shared<spdlog::logger>(
        "torchpilot", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    logger->set_pattern("[%H:%M:%S.%e] [torchpilot] [%^%l%$] %v");
    spdlog::register_logger(logger);
  }
  return logger;
}

void log_to(spdlog::logger& logger, LogLevel level, const std::string& message) {
  switch (level) {
    case LogLevel::kDebug:
      logger.debug("{}", message);
      break;
    case LogLevel::kInfo:
      logger.info("{}", message);
      break;
    case LogLevel::kWarn:
      logger.warn("{}", message);
      break;
    case LogLevel::kError:
      logger.error("{}", message);
      break;
  }
}

}  // namespace torchpilot
