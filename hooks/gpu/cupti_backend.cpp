// CuptiBackend (cupti_backend_internal.h): the collectors' lifecycles and their degrade paths, the
// trace windows and their release off the training thread, the hand-over of events to drain(),
// NVTX ranges, and the factories. The probe at construction and CUPTI's detach after a window are
// in cupti_backend_attach.cpp.
#include "cupti_backend_internal.h"
#include "own_thread.h"

namespace torchpilot {
namespace detail {
namespace backend_internal {

CuptiBackend::CuptiBackend(const GpuConfig& config, spdlog::logger& logger,
                           GpuVendorLoaders loaders)
    : config_(config), logger_(logger) {
  pm_status_ = {"pm_sampling", false, ""};
  activity_status_ = {"activity", false, ""};
  nvml_status_ = {"nvml", false, ""};
  nvtx_status_ = {"nvtx", false, ""};
  guard("initialization", [&] { probe(loaders); });
}

CuptiBackend::~CuptiBackend() {
  guard("stop", [&] {
    finish_release();
    stop_all();
  });
  // Destroy the collectors (joined and unrouted in stop_all) before the vendor interfaces.
  activity_.reset();
  pm_.reset();
  nvml_sampler_.reset();
#if TORCHPILOT_HAVE_NVTX
  if (domain_ != nullptr) nvtxDomainDestroy(domain_);
#endif
}

std::vector<CollectorStatus> CuptiBackend::status() const {
  // While a release runs on its thread, the statuses as they were when it began.
  if (release_running()) return release_snapshot_;
  std::vector<CollectorStatus> s{pm_status_, activity_status_, nvml_status_, nvtx_status_};
  if (s[0].active && pm_ != nullptr) {
    std::string why = pm_->reason();
    if (!why.empty()) s[0] = {"pm_sampling", false, std::move(why)};
  }
  if (s[2].active && nvml_sampler_ != nullptr) {
    std::string why = nvml_sampler_->reason();
    if (!why.empty()) s[2] = {"nvml", false, std::move(why)};
  }
  return s;
}

void CuptiBackend::start() {
  guard("start", [&] {
    if (started_ || device_.sm_count <= 0) return;
    started_ = true;
    if (pm_ != nullptr && pm_status_.active) {
      const std::string why = pm_->start();
      if (!why.empty()) set_off(pm_status_, why);
    }
    if (nvml_sampler_ != nullptr && nvml_status_.active) {
      const std::string why = nvml_sampler_->start(config_.nvml_interval_ms,
                                                   [this](const UtilSample& u) { on_nvml(u); });
      if (!why.empty()) set_off(nvml_status_, why);
    }
  });
}

bool CuptiBackend::start_trace() {
  bool ok = false;
  const Nanos t0 = steady_now_ns();
  guard("start_trace", [&] {
    finish_release();  // windows rarely follow each other this closely
    if (activity_ == nullptr || (!activity_status_.active && !trace_busy_) || stopped_) return;
    if (!activity_attached_) {
      const std::string why = activity_->init();
      if (!why.empty() && is_busy(why)) {
        // Stepped aside, one line per busy period; the next window tries again.
        if (!trace_busy_) logger_.warn("GPU trace window skipped: {}{}", why, busy_suffix());
        set_off(activity_status_, why + busy_suffix());
        trace_busy_ = true;
        return;
      }
      if (!why.empty()) {
        set_off(activity_status_, why);
        trace_busy_ = false;
        logger_.warn("GPU collector activity off: {}", why);
        return;
      }
      activity_attached_ = true;
      if (trace_busy_) {
        trace_busy_ = false;
        activity_status_ = {kActivityCollector, true, ""};
        logger_.info("GPU trace windows resume: no other CUPTI client is attached any more");
      }
    }
    // CUPTI's clock is CLOCK_REALTIME: re-measure the offset at each window (NTP steps). Only
    // once CUPTI is ours: another client may have replaced its timestamps.
    measure_clock(false);
    const std::string why = activity_->enable();
    if (!why.empty()) {
      set_off(activity_status_, why);
      logger_.warn("GPU collector activity off: {}", why);
      // Attached for nothing: detach, or launches stay slower and other clients locked out.
      activity_->shutdown();
      activity_attached_ = false;
      detach_cupti(/*resume_pm=*/true);
      return;
    }
    ok = true;
  });
  logger_.debug("GPU trace start took {:.2f} ms ({})", (steady_now_ns() - t0) / 1e6,
                ok ? "tracing" : "not tracing");
  return ok;
}

void CuptiBackend::stop_trace() {
  guard("stop_trace", [&] {
    if (activity_ == nullptr || release_running()) return;
    activity_->disable();
    // A second reading of the clock since the window's start: should another client have
    // changed CUPTI's clock, its rate is known before the release converts the records.
    measure_clock(false);
  });
}

void CuptiBackend::release_trace() {
  guard("release_trace", [&] {
    if (activity_ == nullptr || !activity_attached_ || stopped_ || release_running()) return;
    release_snapshot_ = status();
    activity_attached_ = false;
    finalize_now_ = false;
    finalized_ = false;
    releasing_.store(true, std::memory_order_release);
    release_thread_ = std::thread([this] {
      mark_own_thread("tp-trace-rel");
      guard("release_trace", [&] {
        const Nanos t0 = steady_now_ns();
        activity_->shutdown();  // disable, forced flush, unsubscribe
        const Nanos t1 = steady_now_ns();
        detach_cupti(/*resume_pm=*/true, /*finalize_at_api_exit=*/true);
        logger_.debug(
            "GPU trace released off the training thread: flush {:.1f} ms, detach {:.1f} ms",
            (t1 - t0) / 1e6, (steady_now_ns() - t1) / 1e6);
      });
      releasing_.store(false, std::memory_order_release);
    });
  });
}

void CuptiBackend::finish_release() {
  if (!release_thread_.joinable()) return;
  {
    // The training thread waits here without calling CUDA: the release may finalize itself.
    std::lock_guard<std::mutex> lock(finalize_mutex_);
    finalize_now_ = true;
  }
  finalize_cv_.notify_all();
  release_thread_.join();
}

void CuptiBackend::flush() {
  guard("flush", [&] {
    if (release_running()) return;  // the release flushes; CUPTI is not to be called meanwhile
    const Nanos t0 = steady_now_ns();
    if (activity_ != nullptr && activity_status_.active) activity_->flush(false);
    const Nanos t1 = steady_now_ns();
    if (pm_ != nullptr) pm_->decode_now();
    const Nanos t2 = steady_now_ns();
    logger_.debug("GPU flush: activity {:.3f} ms, PM decode {:.3f} ms", (t1 - t0) / 1e6,
                  (t2 - t1) / 1e6);
  });
}

void CuptiBackend::request_flush() {
  guard("request_flush", [&] {
    if (!release_running() && pm_ != nullptr) pm_->request_decode();
  });
}

void CuptiBackend::drain(GpuEventBatch& out) {
  guard("drain", [&] {
    if (markers_ != nullptr) markers_->drain(out.markers);
    if (activity_ != nullptr) activity_->drain(out);
    // Read before the pending samples are taken: a burst's last samples reach them first.
    if (!release_running() && pm_ != nullptr) out.pm_final_until = pm_->paused_final_until();
    std::lock_guard<std::mutex> lock(events_mutex_);
    out.pm.insert(out.pm.end(), pending_pm_.begin(), pending_pm_.end());
    out.nvml.insert(out.nvml.end(), pending_nvml_.begin(), pending_nvml_.end());
    out.dropped += pending_dropped_;
    pending_pm_.clear();
    pending_nvml_.clear();
    pending_dropped_ = 0;
  });
}

void CuptiBackend::stop() {
  guard("stop", [&] {
    finish_release();
    stop_all();
  });
}

void CuptiBackend::range_push(const char* name) {
#if TORCHPILOT_HAVE_NVTX
  if (domain_ == nullptr || name == nullptr) return;
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = name;
  nvtxDomainRangePushEx(domain_, &a);
#else
  (void)name;
#endif
}

void CuptiBackend::range_pop() {
#if TORCHPILOT_HAVE_NVTX
  if (domain_ != nullptr) nvtxDomainRangePop(domain_);
#endif
}

bool CuptiBackend::release_running() const {
  if (releasing_.load(std::memory_order_acquire)) return true;
  if (release_thread_.joinable()) release_thread_.join();
  return false;
}

void CuptiBackend::measure_clock(bool wait) {
  Nanos latency = 0;
  if (cupti_ == nullptr || !clock_.measure(*cupti_, &latency, wait ? kClockWaitNs : 0)) return;
  const TimeBase tb = clock_.get();
  logger_.debug(
      "CUPTI clock: offset to the steady clock {} (CUPTI reading {} at steady {} ns), {} steady "
      "ns a unit (paired-read latency {} ns)",
      tb.offset_ns, tb.anchor, static_cast<int64_t>(tb.anchor) - tb.offset_ns, tb.scale, latency);
  note_tick_clock(clock_, logger_);
}

void CuptiBackend::on_pm(std::vector<PmSample>& samples) {
  std::lock_guard<std::mutex> lock(events_mutex_);
  for (auto& s : samples) {
    if (pending_pm_.size() >= kMaxPendingSamples) {
      ++pending_dropped_;
    } else {
      pending_pm_.push_back(s);
    }
  }
}

void CuptiBackend::on_nvml(const UtilSample& u) {
  std::lock_guard<std::mutex> lock(events_mutex_);
  if (pending_nvml_.size() >= kMaxPendingSamples) {
    ++pending_dropped_;
  } else {
    pending_nvml_.push_back(u);
  }
}

void CuptiBackend::stop_all() {
  if (stopped_) return;
  stopped_ = true;
  if (markers_ != nullptr) markers_->stop();
  if (activity_ != nullptr) activity_->shutdown();  // disable, forced flush, unsubscribe
  if (pm_ != nullptr) pm_->stop();
  if (nvml_sampler_ != nullptr) nvml_sampler_->stop();
  if (profiler_initialized_ && cupti_ != nullptr) {
    CUpti_Profiler_DeInitialize_Params p{};
    p.structSize = CUpti_Profiler_DeInitialize_Params_STRUCT_SIZE;
    cupti_->profiler_deinitialize(&p);
    profiler_initialized_ = false;
  }
  if (activity_attached_ && cupti_ != nullptr) {
    activity_attached_ = false;
    detach_cupti(/*resume_pm=*/false);  // the process goes on without CUPTI's overhead
  }
}

}  // namespace backend_internal

GpuVendorLoaders dlopen_vendor_loaders(const GpuConfig& config) {
  GpuVendorLoaders l;
  l.driver = [](std::string* error) { return load_cuda_driver(error); };
  const std::string path = config.cupti_path;
  l.cupti = [path](std::string* error) { return load_cupti(path, error); };
  l.nvml = [](std::string* error) { return load_nvml(error); };
  return l;
}

std::unique_ptr<GpuBackend> make_cupti_backend(const GpuConfig& config, spdlog::logger& logger,
                                               GpuVendorLoaders loaders) {
  return std::make_unique<backend_internal::CuptiBackend>(config, logger, std::move(loaders));
}

}  // namespace detail

std::unique_ptr<GpuBackend> make_cupti_backend(const GpuConfig& config, spdlog::logger& logger) {
  try {
    return detail::make_cupti_backend(config, logger, detail::dlopen_vendor_loaders(config));
  } catch (const std::exception& e) {
    return make_unavailable_gpu_backend(std::string("GPU backend failed to start: ") + e.what());
  }
}

}  // namespace torchpilot
