// A logger that writes into a string stream, for tests that read what was logged.
#pragma once

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>
#include <string>

namespace torchpilot {
namespace test {

inline std::shared_ptr<spdlog::logger> string_logger(const std::string& name,
                                                     std::ostringstream& out) {
  return std::make_shared<spdlog::logger>(name,
                                          std::make_shared<spdlog::sinks::ostream_sink_st>(out));
}

}  // namespace test
}  // namespace torchpilot
