// CuptiBackend (cupti_backend_internal.h) taking and giving back the vendor libraries: the probe
// of the device, NVTX, NVML and CUPTI at construction (each collector that cannot run gets its
// reason), PM sampling's (re)start, and CUPTI's detach (cuptiFinalize) after a trace window. Apart
// from cupti_backend.cpp because this is setup and teardown, the other the running lifecycle.
#include <cstdlib>

#include "cupti_backend_internal.h"

namespace torchpilot::detail::backend_internal {

namespace {

std::string off_in_config(const char* key) {
  return std::string("off in the configuration (") + key + ": false)";
}

}  // namespace

void CuptiBackend::probe(GpuVendorLoaders& loaders) {
  device_.index = config_.device;
  if (!config_.enabled) {
    set_all_off(off_in_config("gpu.enabled"));
    return;
  }
  std::string error;
  driver_ = loaders.driver ? loaders.driver(&error) : nullptr;
  if (driver_ == nullptr) {
    set_all_off(error.empty() ? "no GPU driver (libcuda.so.1 not found)" : error);
    return;
  }
  if (config_.device < 0) {
    // Auto outside a Pilot (which resolves it first): the same rule.
    int visible = -1, current = -1;
    probe_visible_and_current(*driver_, &visible, &current);
    config_.device = choose_gpu_device(-1, std::getenv("LOCAL_RANK"), visible, current).index;
    device_.index = config_.device;
  }
  ProbedDevice probed = probe_device(*driver_, config_.device);
  if (!probed.error.empty()) {
    set_all_off(probed.error);
    return;
  }
  device_ = probed.info;
  if (config_.step_markers) {
    MarkerOptions mo;
    mo.poll_ns = static_cast<Nanos>(config_.marker_poll_ms * 1e6);
    markers_ = std::make_unique<CudaMarkers>(*driver_, device_.index, logger_, mo);
  }
  logger_.debug("GPU {}: {}, {} SMs, compute capability {}.{}, PCI {}", device_.index, device_.name,
                device_.sm_count, probed.cc_major, probed.cc_minor,
                probed.pci_bus_id.empty() ? "?" : probed.pci_bus_id);

  probe_nvtx();
  probe_nvml(loaders, probed);
  probe_cupti(loaders, probed);
}

void CuptiBackend::probe_nvtx() {
  if (!config_.nvtx) {
    set_off(nvtx_status_, off_in_config("gpu.nvtx"));
    return;
  }
  // NVTX is header-only and always callable, but with libcupti in the process it finds CUPTI's
  // injection and each range costs about 1 us (2 a step on an H200) for no reader. Nsight Systems
  // and Nsight Compute name their injection in NVTX_INJECTION64_PATH: ranges only then.
  const char* tool = std::getenv("NVTX_INJECTION64_PATH");
  if (tool == nullptr || *tool == '\0') {
    set_off(nvtx_status_,
            "no NVTX tool attached (Nsight Systems and Nsight Compute set "
            "NVTX_INJECTION64_PATH); step and phase ranges are emitted under one");
    return;
  }
#if TORCHPILOT_HAVE_NVTX
  domain_ = nvtxDomainCreateA("torchpilot");
  nvtx_status_.active = true;
#else
  set_off(nvtx_status_, "this build has no NVTX headers (nvtx3/nvToolsExt.h)");
#endif
}

void CuptiBackend::probe_nvml(GpuVendorLoaders& loaders, const ProbedDevice& probed) {
  if (!config_.nvml) {
    set_off(nvml_status_, off_in_config("gpu.nvml"));
    return;
  }
  std::string error;
  nvml_ = loaders.nvml ? loaders.nvml(&error) : nullptr;
  if (nvml_ == nullptr) {
    set_off(nvml_status_, error.empty() ? "NVML not found (libnvidia-ml.so.1)" : error);
    return;
  }
  nvml_sampler_ = std::make_unique<NvmlSampler>(*nvml_);
  const std::string why = nvml_sampler_->open(device_.index, probed.pci_bus_id);
  if (!why.empty()) {
    set_off(nvml_status_, why);
    nvml_sampler_->stop();
    nvml_sampler_.reset();
    return;
  }
  nvml_status_.active = true;
}

void CuptiBackend::probe_cupti(GpuVendorLoaders& loaders, const ProbedDevice& probed) {
  if (!config_.pm_sampling) set_off(pm_status_, off_in_config("gpu.pm_sampling"));
  if (!config_.activity) set_off(activity_status_, off_in_config("gpu.activity"));
  std::string error;
  cupti_ = loaders.cupti ? loaders.cupti(&error) : nullptr;
  if (cupti_ == nullptr) {
    const std::string why = error.empty() ? "libcupti not found" : error;
    if (config_.pm_sampling) set_off(pm_status_, why);
    if (config_.activity) set_off(activity_status_, why);
    return;
  }
  uint32_t version = 0;
  cupti_->get_version(&version);
  logger_.debug("CUPTI: {} (API version {}, built against {})", cupti_->origin(), version,
                CUPTI_API_VERSION);
  if (version < kMinCuptiApiVersion) {
    const std::string why = "libcupti " + cupti_->origin() + " has CUPTI API version " +
                            std::to_string(version) +
                            "; this build reads CUDA 13's records (API version 130000 or newer)";
    if (config_.pm_sampling) set_off(pm_status_, why);
    if (config_.activity) set_off(activity_status_, why);
    return;
  }
  if (version / 10000 > CUPTI_API_VERSION / 10000) {
    logger_.warn(
        "CUPTI {} is newer than the headers this build used ({}); records are read "
        "with the older layouts",
        version, CUPTI_API_VERSION);
  }
  measure_clock(true);

  // The profiler API: the chip name, and PM sampling.
  CUpti_Profiler_Initialize_Params init{};
  init.structSize = CUpti_Profiler_Initialize_Params_STRUCT_SIZE;
  CUptiResult r = cupti_->profiler_initialize(&init);
  std::string profiler_error;
  if (r == CUPTI_SUCCESS) {
    profiler_initialized_ = true;
    CUpti_Device_GetChipName_Params chip{};
    chip.structSize = CUpti_Device_GetChipName_Params_STRUCT_SIZE;
    chip.deviceIndex = static_cast<size_t>(device_.index);
    r = cupti_->device_get_chip_name(&chip);
    if (r == CUPTI_SUCCESS && chip.pChipName != nullptr) {
      device_.chip = chip.pChipName;
    } else {
      profiler_error = pm_sampling_error_reason(*cupti_, "cuptiDeviceGetChipName", r);
    }
  } else {
    profiler_error = pm_sampling_error_reason(*cupti_, "cuptiProfilerInitialize", r);
  }

  if (config_.activity) {
    activity_ = std::make_unique<ActivityCollector>(
        *cupti_, clock_, logger_,
        activity_options(config_.trace_buffer_mb, config_.trace_device_buffer_mb));
    // Subscribing tells whether another client holds CUPTI; the subscription is released
    // at once and taken again only for detailed windows (release_trace() says why).
    const std::string why = activity_->init();
    if (why.empty()) {
      activity_->shutdown();
      activity_status_.active = true;
    } else if (is_busy(why)) {
      // Another client holds CUPTI for now: windows are tried again and work once it detaches.
      set_off(activity_status_, why + busy_suffix());
      trace_busy_ = true;
    } else {
      set_off(activity_status_, why);
      activity_.reset();
    }
  }

  if (config_.pm_sampling) {
    if (!profiler_error.empty()) {
      set_off(pm_status_, profiler_error);
    } else if (probed.cc_major > 0 && probed.cc_major * 10 + probed.cc_minor < 86) {
      set_off(pm_status_,
              "PM sampling needs compute capability 8.6 or newer (its GPU-time "
              "trigger); this GPU is " +
                  std::to_string(probed.cc_major) + "." + std::to_string(probed.cc_minor));
    } else {
      const std::string why = make_pm();
      if (why.empty()) {
        pm_status_.active = true;
      } else {
        set_off(pm_status_, why);
      }
    }
  }
}

std::string CuptiBackend::make_pm() {
  PmOptions o;
  o.device = device_.index;
  o.chip = device_.chip;
  o.interval_ms = config_.pm_interval_ms;
  o.metrics = pm_metric_set(config_.pm_metrics);
  o.duty = config_.pm_duty;
  o.duty_period_ms = config_.pm_duty_period_ms;
  pm_ = std::make_unique<PmSampler>(*cupti_, clock_, logger_, o,
                                    [this](std::vector<PmSample>&& s) { on_pm(s); });
  std::string why = pm_->configure();
  if (why.empty() && started_) why = pm_->start();
  if (!why.empty()) pm_.reset();
  return why;
}

void CuptiBackend::detach_cupti(bool resume_pm, bool finalize_at_api_exit) {
  const bool pm_running = pm_ != nullptr && pm_status_.active;
  const Nanos t0 = steady_now_ns();
  if (pm_ != nullptr) pm_->stop();
  pm_.reset();
  if (profiler_initialized_) {
    CUpti_Profiler_DeInitialize_Params p{};
    p.structSize = CUpti_Profiler_DeInitialize_Params_STRUCT_SIZE;
    cupti_->profiler_deinitialize(&p);
    profiler_initialized_ = false;
  }
  const Nanos t1 = steady_now_ns();
  finalize_cupti(finalize_at_api_exit);
  const Nanos t2 = steady_now_ns();
  if (!resume_pm || !pm_running) return;
  CUpti_Profiler_Initialize_Params init{};
  init.structSize = CUpti_Profiler_Initialize_Params_STRUCT_SIZE;
  CUptiResult ri = cupti_->profiler_initialize(&init);
  if (ri == CUPTI_ERROR_NOT_INITIALIZED) {
    // Measured on the H200: after cuptiFinalize the profiler API answers NOT_INITIALIZED until
    // CUPTI is attached again; a subscription (no callbacks enabled) attaches it.
    CUpti_SubscriberHandle handle = nullptr;
    CUpti_SubscriberParams params{};
    params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
    params.subscriberName = "torchpilot";
    if (cupti_->subscribe(&handle, reattach_callback, nullptr, &params) == CUPTI_SUCCESS) {
      cupti_->unsubscribe(handle);
    }
    ri = cupti_->profiler_initialize(&init);
    if (!reattach_logged_) {
      reattach_logged_ = true;
      logger_.info("CUPTI re-attached for PM sampling after a trace window: {}",
                   ri == CUPTI_SUCCESS ? "ok" : cupti_error_name(*cupti_, ri));
    }
  }
  std::string why;
  if (ri == CUPTI_SUCCESS) {
    profiler_initialized_ = true;
    why = make_pm();
  } else {
    why = pm_sampling_error_reason(*cupti_, "cuptiProfilerInitialize", ri);
  }
  if (!why.empty()) {
    set_off(pm_status_, "after releasing the trace: " + why);
    logger_.warn("GPU collector pm_sampling off after releasing the trace: {}", why);
  }
  logger_.debug(
      "CUPTI detached after a trace window: PM stop {:.1f} ms, finalize {:.1f} ms, PM restart "
      "{:.1f} ms",
      (t1 - t0) / 1e6, (t2 - t1) / 1e6, (steady_now_ns() - t2) / 1e6);
}

// cuptiFinalize is safe at the exit of a CUDA API call (CUPTI's documentation; kineto crashed
// calling it beside other threads' CUPTI calls). On the release thread: a subscription to the
// driver and runtime APIs lets the training program's next CUDA call finalize CUPTI in its
// exit callback (costing that call the finalize alone). When no call comes (or the training
// thread waits in finish_release(), calling nothing), the release finalizes itself. Elsewhere
// (on the training thread, between its CUDA calls) it finalizes directly.
void CuptiBackend::finalize_cupti(bool at_api_exit) {
  if (at_api_exit) {
    CUpti_SubscriberHandle handle = nullptr;
    CUpti_SubscriberParams params{};
    params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
    params.subscriberName = "torchpilot";
    if (cupti_->subscribe(&handle, finalize_callback, this, &params) == CUPTI_SUCCESS) {
      {
        std::lock_guard<std::mutex> lock(finalize_mutex_);
        finalize_armed_ = true;
      }
      cupti_->enable_domain(1, handle, CUPTI_CB_DOMAIN_DRIVER_API);
      cupti_->enable_domain(1, handle, CUPTI_CB_DOMAIN_RUNTIME_API);
      std::unique_lock<std::mutex> lock(finalize_mutex_);
      finalize_cv_.wait_for(lock, kFinalizeCallbackWait,
                            [this] { return finalized_ || finalize_now_; });
      finalize_armed_ = false;  // a callback from now on does nothing
      if (finalized_) {         // in the callback: the subscription went with it
        if (finalize_result_ != CUPTI_SUCCESS)
          logger_.debug("cuptiFinalize: {}", cupti_error_name(*cupti_, finalize_result_));
        return;
      }
      lock.unlock();
      cupti_->unsubscribe(handle);
    }
  }
  const CUptiResult r = cupti_->finalize();
  if (r != CUPTI_SUCCESS) logger_.debug("cuptiFinalize: {}", cupti_error_name(*cupti_, r));
}

void CUPTIAPI CuptiBackend::finalize_callback(void* userdata, CUpti_CallbackDomain domain,
                                              CUpti_CallbackId, const void* cbdata) {
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API && domain != CUPTI_CB_DOMAIN_RUNTIME_API) return;
  const auto* info = static_cast<const CUpti_CallbackData*>(cbdata);
  if (info == nullptr || info->callbackSite != CUPTI_API_EXIT) return;
  auto* self = static_cast<CuptiBackend*>(userdata);
  std::lock_guard<std::mutex> lock(self->finalize_mutex_);
  if (!self->finalize_armed_ || self->finalized_) return;
  const CUptiResult r = self->cupti_->finalize();
  self->finalized_ = true;
  self->finalize_result_ = r;
  self->finalize_cv_.notify_all();
}

}  // namespace torchpilot::detail::backend_internal
