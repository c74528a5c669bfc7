// The one place where LibTorch versions differ (1.13 on the CPU build, 2.x on the GPU build).
#pragma once

#include <torch/version.h>

#define TORCHPILOT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||             \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#include <optional>
#if !TORCHPILOT_TORCH_AT_LEAST(2, 0)
#include <c10/util/Optional.h>
#endif

namespace torchpilot::compat {

// What DataLoader iteration and dataset size() return: c10::optional in 1.x, std::optional in 2.x.
#if TORCHPILOT_TORCH_AT_LEAST(2, 0)
template <typename T>
using optional = std::optional<T>;
#else
template <typename T>
using optional = c10::optional<T>;
#endif

template <typename T>
std::optional<T> to_std(const optional<T>& value) {
  if (value.has_value()) return *value;
  return std::nullopt;
}

}  // namespace torchpilot::compat
