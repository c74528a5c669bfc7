// The "torchpilot" spdlog logger: created on first use (stderr) unless the program registered its
// own logger under that name first. Thread-safe (spdlog's _mt sinks).
#pragma once

#include <memory>
#include <string>

namespace spdlog {
class logger;
}

namespace torchpilot {

std::shared_ptr<spdlog::logger> torchpilot_logger();

// Levels of the advisory log for code that must not include spdlog (LibTorch translation units:
// the PyTorch wheel's fmt shadows the one spdlog was built with).
enum class LogLevel { kDebug, kInfo, kWarn, kError };
void log_to(spdlog::logger& logger, LogLevel level, const std::string& message);

}  // namespace torchpilot
