#include "torchpilot/hooks/loader/torch_transfer.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#ifdef TORCHPILOT_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>
#endif

namespace torchpilot::detail {

bool cuda_tensors_compiled() {
#ifdef TORCHPILOT_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

bool pin_memory_available() {
  static const bool available = cuda_tensors_compiled() && torch::cuda::is_available();
  return available;
}

bool device_prefetch_available() { return pin_memory_available(); }

void pin_tensors(const std::vector<at::Tensor*>& tensors) {
  for (at::Tensor* t : tensors) {
    if (t->defined() && t->device().is_cpu() && !t->is_pinned()) *t = t->pin_memory();
  }
}

#ifdef TORCHPILOT_TORCH_CUDA

std::shared_ptr<void> copy_to_device_async(const std::vector<at::Tensor*>& tensors, int device) {
  const auto index = static_cast<c10::DeviceIndex>(device);
  c10::cuda::CUDAGuard device_guard(index);
  // One side stream per worker thread, from LibTorch's pool, kept for the thread's life.
  thread_local std::optional<c10::cuda::CUDAStream> stream;
  if (!stream || stream->device_index() != index) {
    stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
  }
  c10::cuda::CUDAStreamGuard stream_guard(*stream);
  const at::Device target(at::kCUDA, index);
  for (at::Tensor* t : tensors) {
    if (t->defined() && t->device().is_cpu()) {
      *t = t->to(target, t->scalar_type(), /*non_blocking=*/true);
    }
  }
  auto event = std::make_shared<at::cuda::CUDAEvent>();
  event->record(*stream);
  return event;
}

void wait_for_copy(const std::shared_ptr<void>& event, const std::vector<at::Tensor*>& tensors,
                   int device) {
  if (!event) return;
  const auto index = static_cast<c10::DeviceIndex>(device);
  c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(index);
  static_cast<at::cuda::CUDAEvent*>(event.get())->block(current);
  for (at::Tensor* t : tensors) {
    if (t->defined() && t->is_cuda()) t->record_stream(current);
  }
}

#else

std::shared_ptr<void> copy_to_device_async(const std::vector<at::Tensor*>&, int) { return nullptr; }

void wait_for_copy(const std::shared_ptr<void>&, const std::vector<at::Tensor*>&, int) {}

#endif

}  // namespace torchpilot::detail
