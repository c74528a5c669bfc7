#include "torchpilot/runtime/core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstddef>
#include <iterator>
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
  static constexpr spdlog::level::level_enum kLevels[] = {spdlog::level::debug, spdlog::level::info,
                                                          spdlog::level::warn, spdlog::level::err};
  const auto i = static_cast<size_t>(level);
  if (i < std::size(kLevels)) logger.log(kLevels[i], "{}", message);
}

}  // namespace torchpilot
