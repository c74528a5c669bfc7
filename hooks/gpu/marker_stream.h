// Which CUDA stream the GPU step markers (cuda_markers.h) are recorded on: the stream the trainer
// launches its work on. LibTorch knows it (torch_stream.cpp registers a provider in builds whose
// LibTorch has CUDA); the GPU collectors do not link LibTorch, hence a plain function pointer.
// No CUDA header here: the stream travels as void* (a CUstream / cudaStream_t).
// Thread-safety: set at static initialization, read on the training thread (atomic).
#pragma once

namespace torchpilot {
namespace detail {

// Returns the calling thread's current stream for CUDA device `device` (the observed one, which
// need not be the thread's current device); null is the legacy default stream. Must not throw.
using MarkerStreamProvider = void* (*)(int device);

// Null (the default): markers go on the legacy default stream.
void set_marker_stream_provider(MarkerStreamProvider provider);
MarkerStreamProvider marker_stream_provider();

}  // namespace detail
}  // namespace torchpilot
