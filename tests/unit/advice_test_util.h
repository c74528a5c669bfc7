// Small lookups the advisor tests share.
#pragma once

#include <optional>
#include <string>

#include "torchpilot/runtime/core/advice.h"

namespace torchpilot {
namespace test {

// The value of the evidence called `name`, if the advice has it.
inline std::optional<double> evidence(const Advice& a, const std::string& name) {
  for (const auto& e : a.evidence) {
    if (e.name == name) return e.value;
  }
  return std::nullopt;
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace test
}  // namespace torchpilot
