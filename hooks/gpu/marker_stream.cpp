// The provider of the trainer's current stream (marker_stream.h). Always built (no CUDA header),
// so that LibTorch's side can register one whether or not this build has the GPU collectors.
#include "marker_stream.h"

#include <atomic>

namespace torchpilot {
namespace detail {
namespace {
// Constant-initialized: safe whichever static initializer sets it first.
std::atomic<MarkerStreamProvider> provider{nullptr};
}  // namespace

void set_marker_stream_provider(MarkerStreamProvider p) {
  provider.store(p, std::memory_order_release);
}

MarkerStreamProvider marker_stream_provider() { return provider.load(std::memory_order_acquire); }

}  // namespace detail
}  // namespace torchpilot
