// The one guard at every boundary where torchpilot calls code it does not control (knob setters,
// loader probes, collectors, sinks, advisors, vendor libraries) or runs optional work inside the
// training loop: it catches everything, std or not, and says what was thrown. The caller disables
// the failing piece with one log line naming it, and the loop goes on.
#pragma once

#include <exception>
#include <optional>
#include <string>

namespace torchpilot {

// What `fn` threw, as text, or nothing when it returned. Never throws (a failure to describe the
// exception gives a fixed text).
template <typename Fn>
std::optional<std::string> failure_of(Fn&& fn) noexcept {
  try {
    fn();
    return std::nullopt;
  } catch (const std::exception& e) {
    try {
      return std::string(e.what());
    } catch (...) {
      return std::optional<std::string>(std::in_place, "(could not describe the exception)");
    }
  } catch (...) {
    try {
      return std::string("an exception that is not a std::exception");
    } catch (...) {
      return std::nullopt;
    }
  }
}

// What `named.name()` says, or "(unnamed)" when it throws: a name is only for log lines and the
// cost breakdown, and the error path that wants it must not throw itself.
template <typename Named>
std::string name_of(const Named& named) {
  try {
    return named.name();
  } catch (...) {
    return "(unnamed)";
  }
}

// ": <what>" for a log line, or nothing for an empty text.
inline std::string reason_suffix(const std::string& reason) {
  return reason.empty() ? std::string() : ": " + reason;
}

}  // namespace torchpilot
