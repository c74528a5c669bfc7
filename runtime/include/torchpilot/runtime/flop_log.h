// A log shim for hooks/flop_counter.cpp: LibTorch 2.x bundles a newer fmt than the system
// spdlog's, so that file cannot include spdlog next to ATen; it logs through flop_log instead.
// Internal: used by hooks/flop_counter.cpp; not part of the user API.
//
// Thread-safety: as the spdlog logger passed in (spdlog's loggers are thread-safe).
// Failure behaviour: as spdlog's (logging errors go to spdlog's error handler).
#pragma once

#include <string>

namespace spdlog {
class logger;
}

namespace torchpilot {

// One line to the log, for hooks/flop_counter.cpp: LibTorch 2.x bundles a newer fmt than the
// system spdlog's, so that file cannot include spdlog next to ATen.
enum class FlopLogLevel { kDebug, kInfo, kWarn, kError };
void flop_log(spdlog::logger& logger, FlopLogLevel level, const std::string& message);

}  // namespace torchpilot
