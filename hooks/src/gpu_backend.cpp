// make_gpu_backend(): the CUPTI/NVML/NVTX backend when this build has the CUDA toolkit's headers,
// otherwise a backend that only says why there is no GPU data.
#include "torchpilot/gpu_backend.h"

#include "torchpilot/config.h"

#if TORCHPILOT_HAVE_CUPTI
#include "cupti_backend.h"
#endif

namespace torchpilot {

namespace {

// No GPU collectors: device() has no SMs, status() gives the reason.
class UnavailableBackend : public GpuBackend {
 public:
  explicit UnavailableBackend(std::string reason) : reason_(std::move(reason)) {}
  GpuDeviceInfo device() const override { return {}; }
  std::vector<CollectorStatus> status() const override {
    return {{"pm_sampling", false, reason_},
            {"activity", false, reason_},
            {"nvml", false, reason_},
            {"nvtx", false, reason_}};
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

std::unique_ptr<GpuBackend> make_gpu_backend(const GpuConfig& config, spdlog::logger& logger) {
#if TORCHPILOT_HAVE_CUPTI
  return make_cupti_backend(config, logger);
#else
  (void)config;
  (void)logger;
  return make_unavailable_gpu_backend(
      "this build has no GPU collectors (the CUDA toolkit's CUPTI headers were not found at "
      "configure time)");
#endif
}

}  // namespace torchpilot
