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
#include <ATen/autocast_mode.h>

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

// CUDA autocast for the calling thread (as `with torch.autocast("cuda", dtype)` without the
// nesting count): 2.4+ takes the device type, 1.x-2.3 have CUDA-only calls.
inline void set_cuda_autocast(bool enabled, at::ScalarType dtype = at::kBFloat16) {
#if TORCHPILOT_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(at::kCUDA, dtype);
  at::autocast::set_autocast_enabled(at::kCUDA, enabled);
#else
  at::autocast::set_autocast_gpu_dtype(dtype);
  at::autocast::set_enabled(enabled);
#endif
}
// Drops autocast's cached low-precision copies of the weights (PyTorch does it when the
// outermost autocast region exits; a trainer that keeps autocast on calls it after each step).
inline void clear_autocast_cache() { at::autocast::clear_cache(); }

}  // namespace torchpilot::compat
