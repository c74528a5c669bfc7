// CuptiBackend's class, shared by cupti_backend.cpp (the collectors' lifecycles: start, trace
// windows and their release, drain, stop, NVTX ranges) and cupti_backend_attach.cpp (the probe of
// the device and the vendor libraries at construction, and CUPTI's detach after a trace window).
// Private to hooks/gpu.
#pragma once

#include <cupti.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_driver.h"
#include "cuda_markers.h"
#include "cupti_activity_trace.h"
#include "cupti_api.h"
#include "cupti_backend.h"
#include "cupti_pm_sampling.h"
#include "nvml_sampler.h"
#include "torchpilot/runtime/core/config.h"

#if TORCHPILOT_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace torchpilot::detail::backend_internal {

inline constexpr size_t kMaxPendingSamples = 1u << 18;   // per kind, when nobody drains
inline constexpr uint32_t kMinCuptiApiVersion = 130000;  // CUDA 13's records (Kernel10, ...)
inline constexpr size_t kStepMarkerReserve = 128;  // of the 256 marker events: never for phases
// How long a release waits for a CUDA API call to finalize CUPTI in (then it finalizes itself).
inline constexpr auto kFinalizeCallbackWait = std::chrono::seconds(1);

class CuptiBackend final : public GpuBackend {
 public:
  CuptiBackend(const GpuConfig& config, spdlog::logger& logger, GpuVendorLoaders loaders);
  ~CuptiBackend() override;

  GpuDeviceInfo device() const override { return device_; }
  bool trace_busy() const override { return trace_busy_; }
  std::vector<CollectorStatus> status() const override;
  void start() override;
  bool start_trace() override;
  void stop_trace() override;
  // Returns at once: the forced flush, cuptiFinalize and PM sampling's restart take 0.1-0.4 s
  // (measured on the H100 and H200), which the training thread must not wait for. They run on a
  // release thread; the window's last records reach drain() when it is done (trace_releasing()).
  void release_trace() override;
  bool trace_releasing() const override { return release_running(); }
  void finish_release() override;
  void flush() override;
  void request_flush() override;
  bool record_marker(uint64_t id) override {
    return markers_ != nullptr && markers_->record(id);  // noexcept in practice; no guard cost
  }
  bool record_optional_marker(uint64_t id) override {
    // Half the pool stays for step markers: a host running steps ahead still gets its spans.
    return markers_ != nullptr && markers_->record(id, kStepMarkerReserve);
  }
  void await_marker(uint64_t id, Nanos timeout_ns) override {
    if (markers_ != nullptr) markers_->await(id, timeout_ns);
  }
  void drain(GpuEventBatch& out) override;
  void stop() override;
  void range_push(const char* name) override;
  void range_pop() override;

 private:
  // Runs `fn`; an exception is logged (once per call site) and swallowed.
  template <class F>
  void guard(const char* what, F&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      logger_.error("GPU backend {}: {}", what, e.what());
    } catch (...) {
      logger_.error("GPU backend {}: unknown exception", what);
    }
  }

  // Another CUPTI subscriber (ActivityCollector::init's reason): a state that passes.
  static bool is_busy(const std::string& why) { return why.rfind(kAnotherCuptiClient, 0) == 0; }
  static const char* busy_suffix() { return "; windows are tried again once it detaches"; }
  static void set_off(CollectorStatus& s, std::string reason) {
    s.active = false;
    s.reason = std::move(reason);
  }
  void set_all_off(const std::string& reason) {
    for (auto* s : {&pm_status_, &activity_status_, &nvml_status_, &nvtx_status_}) {
      set_off(*s, reason);
    }
  }

  // cupti_backend_attach.cpp: the probe at construction, PM sampling's (re)start, the detach.
  void probe(GpuVendorLoaders& loaders);
  void probe_nvtx();
  void probe_nvml(GpuVendorLoaders& loaders, const ProbedDevice& probed);
  void probe_cupti(GpuVendorLoaders& loaders, const ProbedDevice& probed);
  // Creates, configures and starts (once start() ran) the PM sampler. Returns the reason on
  // failure.
  std::string make_pm();
  // cuptiFinalize, as kineto does after a trace: CUPTI's launch instrumentation goes away with
  // it. PM sampling goes down with CUPTI and, with `resume_pm`, comes back (a gap of a few ms).
  void detach_cupti(bool resume_pm, bool finalize_at_api_exit = false);
  void finalize_cupti(bool at_api_exit);
  static void CUPTIAPI finalize_callback(void* userdata, CUpti_CallbackDomain domain,
                                         CUpti_CallbackId, const void* cbdata);

  // A release thread started and has not finished (joins it once it has).
  bool release_running() const;
  // `wait`: off the training thread, a clock not seen before gets its rate at once.
  void measure_clock(bool wait);
  void on_pm(std::vector<PmSample>& samples);
  void on_nvml(const UtilSample& u);
  void stop_all();

  GpuConfig config_;
  spdlog::logger& logger_;
  GpuDeviceInfo device_;
  CollectorStatus pm_status_, activity_status_, nvml_status_, nvtx_status_;
  bool trace_busy_ = false;  // another CUPTI client holds the subscription for now
  bool started_ = false;
  bool stopped_ = false;
  bool profiler_initialized_ = false;
  bool activity_attached_ = false;  // subscribed with callbacks routed (inside a window)
  bool reattach_logged_ = false;
  static void CUPTIAPI reattach_callback(void*, CUpti_CallbackDomain, CUpti_CallbackId,
                                         const void*) {}

  // The release thread (release_trace()) and its hand-over of cuptiFinalize to a CUDA API exit.
  mutable std::thread release_thread_;
  std::atomic<bool> releasing_{false};
  std::vector<CollectorStatus> release_snapshot_;
  std::mutex finalize_mutex_;  // guards the four flags below
  std::condition_variable finalize_cv_;
  bool finalize_armed_ = false;  // the callback may finalize
  bool finalized_ = false;       // ... and did
  bool finalize_now_ = false;    // finish_release(): finalize without waiting for a callback
  CUptiResult finalize_result_ = CUPTI_SUCCESS;

  // Vendor interfaces first: the collectors below refer to them.
  std::unique_ptr<CudaDriverApi> driver_;
  std::unique_ptr<CudaMarkers> markers_;  // step markers (cuda_markers.h)
  std::unique_ptr<CuptiApi> cupti_;
  std::unique_ptr<NvmlApi> nvml_;
  CuptiClock clock_;
  std::unique_ptr<ActivityCollector> activity_;
  std::unique_ptr<PmSampler> pm_;
  std::unique_ptr<NvmlSampler> nvml_sampler_;
#if TORCHPILOT_HAVE_NVTX
  nvtxDomainHandle_t domain_ = nullptr;
#endif

  std::mutex events_mutex_;
  std::vector<PmSample> pending_pm_;
  std::vector<UtilSample> pending_nvml_;
  int64_t pending_dropped_ = 0;
};

}  // namespace torchpilot::detail::backend_internal
