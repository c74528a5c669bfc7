// CUDA helpers the GPT benchmarks share; no-ops where LibTorch has no CUDA.
#pragma once

#include <torch/cuda.h>
#include <torch/torch.h>

#include "cli_flags.h"

#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace bench {

// Caps the CUDA caching allocator of device 0 at `fraction` of the device's memory: a smaller
// device, whose allocations past the cap fail with the real out-of-memory error. False (nothing
// done) without CUDA.
inline bool cap_device_memory(double fraction) {
#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
  if (!torch::cuda::is_available()) return false;
  torch::empty({1}, torch::TensorOptions().device(torch::kCUDA, 0));  // the allocator starts lazily
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, 0);
  return true;
#else
  (void)fraction;
  return false;
#endif
}

// --memory-fraction F: the cap for cap_device_memory (1: none).
inline void add_memory_fraction_flag(CLI::App& app, double& fraction) {
  example_cli::add_number(app, "--memory-fraction", fraction, 0.01, 1,
                          "cap the CUDA caching allocator at this share of the device's memory "
                          "(a smaller device: allocations past it fail with the real "
                          "out-of-memory error)")
      ->capture_default_str();
}

}  // namespace bench
