// The backend that only says why there is no GPU data.
#include "torchpilot/runtime/gpu/gpu_backend.h"

#include <iterator>

#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/format.h"

namespace torchpilot {

const char* to_string(SyncApi api) {
  static constexpr const char* kNames[] = {"unknown", "cudaStreamSynchronize",
                                           "cudaEventSynchronize", "cudaDeviceSynchronize",
                                           "blocking copy"};
  static_assert(std::size(kNames) == static_cast<size_t>(SyncApi::kBlockingCopy) + 1);
  return detail::enum_name(api, kNames, "unknown");
}

const char* to_string(SyncThread thread) {
  static constexpr const char* kNames[] = {"unknown", "trainer", "other", "torchpilot", "internal"};
  static_assert(std::size(kNames) == static_cast<size_t>(SyncThread::kInternal) + 1);
  return detail::enum_name(thread, kNames, "unknown");
}

namespace {

// No GPU collectors: device() has no SMs, status() gives the reason.
class UnavailableBackend : public GpuBackend {
 public:
  explicit UnavailableBackend(std::string reason) : reason_(std::move(reason)) {}
  GpuDeviceInfo device() const override { return {}; }
  std::vector<CollectorStatus> status() const override {
    return {{kPmSamplingCollector, false, reason_},
            {kActivityCollector, false, reason_},
            {kNvmlCollector, false, reason_},
            {kNvtxCollector, false, reason_}};
  }
  void start() override {}
  bool start_trace() override { return false; }
  void stop_trace() override {}
  void release_trace() override {}
  void flush() override {}
  void drain(GpuEventBatch&) override {}
  void stop() override {}
  void range_push(const char*) override {}
  void range_pop() override {}

 private:
  std::string reason_;
};

}  // namespace

std::unique_ptr<GpuBackend> make_unavailable_gpu_backend(std::string reason) {
  return std::make_unique<UnavailableBackend>(std::move(reason));
}

}  // namespace torchpilot
