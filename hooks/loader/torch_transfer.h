// Pinning and asynchronous host-to-device copies for the loaders. Implemented in
// torch_transfer.cpp, which alone includes LibTorch's CUDA headers (and only in CUDA builds).
// Thread-safety: all functions may be called from any thread.
#pragma once

#include <memory>
#include <vector>

namespace at {
class Tensor;
}

namespace torchpilot::detail {

bool cuda_tensors_compiled();  // this build's LibTorch has CUDA
bool pin_memory_available();   // ... and a CUDA device is present at run time
bool device_prefetch_available();

// Replaces each defined CPU tensor by a page-locked copy.
void pin_tensors(const std::vector<at::Tensor*>& tensors);

// Replaces each defined CPU tensor by a copy on GPU `device`, issued on this thread's side stream
// without blocking; returns the copy's completion event (opaque).
std::shared_ptr<void> copy_to_device_async(const std::vector<at::Tensor*>& tensors, int device);

// Makes the current stream of `device` wait for the copy, and records the tensors as used on it
// so the caching allocator does not reuse their memory early.
void wait_for_copy(const std::shared_ptr<void>& event, const std::vector<at::Tensor*>& tensors,
                   int device);

}  // namespace torchpilot::detail
