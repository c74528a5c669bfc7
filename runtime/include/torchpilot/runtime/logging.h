// The "torchpilot" spdlog logger: created on first use (stderr) unless the program registered its
// own logger under that name first. Thread-safe (spdlog's _mt sinks).
#pragma once

#include <memory>

namespace spdlog {
class logger;
}

namespace torchpilot {

std::shared_ptr<spdlog::logger> torchpilot_logger();

}  // namespace torchpilot
