// Counting what a test's captured log or record text holds.
#pragma once

#include <cstddef>
#include <string>

namespace torchpilot {
namespace test {

// How many times `part` occurs in `text` (overlapping occurrences included).
inline size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t pos = text.find(part); pos != std::string::npos; pos = text.find(part, pos + 1)) ++n;
  return n;
}

}  // namespace test
}  // namespace torchpilot
