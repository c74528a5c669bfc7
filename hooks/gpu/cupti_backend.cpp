// CuptiBackend: device probe, the collectors' lifecycles and their degrade paths, NVTX ranges.
#include "cupti_backend.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_driver.h"
#include "cuda_markers.h"
#include "cupti_activity_trace.h"
#include "cupti_api.h"
#include "cupti_pm_sampling.h"
#include "nvml_sampler.h"
#include "own_thread.h"
#include "torchpilot/runtime/core/config.h"

#if TORCHPILOT_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace torchpilot {
namespace detail {

namespace {

constexpr size_t kMaxPendingSamples = 1u << 18;   // per kind, when nobody drains
constexpr uint32_t kMinCuptiApiVersion = 130000;  // CUDA 13's records (Kernel10, Memcpy6, ...)
constexpr size_t kStepMarkerReserve = 128;        // of the 256 marker events: never for phases
// How long a release waits for a CUDA API call to finalize CUPTI in (then it finalizes itself).
constexpr auto kFinalizeCallbackWait = std::chrono::seconds(1);

std::string off_in_config(const char* key) {
  return std::string("off in the configuration (") + key + ": false)";
}

class CuptiBackend final : public GpuBackend {
 public:
  CuptiBackend(const GpuConfig& config, spdlog::logger& logger, GpuVendorLoaders loaders)
      : config_(config), logger_(logger) {
    pm_status_ = {"pm_sampling", false, ""};
    activity_status_ = {"activity", false, ""};
    nvml_status_ = {"nvml", false, ""};
    nvtx_status_ = {"nvtx", false, ""};
    guard("initialization", [&] { probe(loaders); });
  }

  ~CuptiBackend() override {
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

  GpuDeviceInfo device() const override { return device_; }
  bool trace_busy() const override { return trace_busy_; }

  std::vector<CollectorStatus> status() const override {
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

  void start() override {
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

  bool start_trace() override {
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

  void stop_trace() override {
    guard("stop_trace", [&] {
      if (activity_ == nullptr || release_running()) return;
      activity_->disable();
      // A second reading of the clock since the window's start: should another client have
      // changed CUPTI's clock, its rate is known before the release converts the records.
      measure_clock(false);
    });
  }

  // Returns at once: the forced flush, cuptiFinalize and PM sampling's restart take 0.1-0.4 s
  // (measured on the H100 and H200), which the training thread must not wait for. They run on a
  // release thread; the window's last records reach drain() when it is done (trace_releasing()).
  void release_trace() override {
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

  bool trace_releasing() const override { return release_running(); }

  void finish_release() override {
    if (!release_thread_.joinable()) return;
    {
      // The training thread waits here without calling CUDA: the release may finalize itself.
      std::lock_guard<std::mutex> lock(finalize_mutex_);
      finalize_now_ = true;
    }
    finalize_cv_.notify_all();
    release_thread_.join();
  }

  void flush() override {
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

  void request_flush() override {
    guard("request_flush", [&] {
      if (!release_running() && pm_ != nullptr) pm_->request_decode();
    });
  }

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

  void drain(GpuEventBatch& out) override {
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

  void stop() override {
    guard("stop", [&] {
      finish_release();
      stop_all();
    });
  }

  void range_push(const char* name) override {
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

  void range_pop() override {
#if TORCHPILOT_HAVE_NVTX
    if (domain_ != nullptr) nvtxDomainRangePop(domain_);
#endif
  }

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

  void probe(GpuVendorLoaders& loaders) {
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
    logger_.debug("GPU {}: {}, {} SMs, compute capability {}.{}, PCI {}", device_.index,
                  device_.name, device_.sm_count, probed.cc_major, probed.cc_minor,
                  probed.pci_bus_id.empty() ? "?" : probed.pci_bus_id);

    probe_nvtx();
    probe_nvml(loaders, probed);
    probe_cupti(loaders, probed);
  }

  void probe_nvtx() {
    if (!config_.nvtx) {
      set_off(nvtx_status_, off_in_config("gpu.nvtx"));
      return;
    }
#if TORCHPILOT_HAVE_NVTX
    // NVTX is always callable (header-only; without a tool such as Nsight Systems the calls do
    // nothing). Whether a tool listens cannot be known from here, so "active" means "emitting".
    domain_ = nvtxDomainCreateA("torchpilot");
    nvtx_status_.active = true;
#else
    set_off(nvtx_status_, "this build has no NVTX headers (nvtx3/nvToolsExt.h)");
#endif
  }

  void probe_nvml(GpuVendorLoaders& loaders, const ProbedDevice& probed) {
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

  void probe_cupti(GpuVendorLoaders& loaders, const ProbedDevice& probed) {
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

  // Creates, configures and starts (once start() ran) the PM sampler. Returns the reason on
  // failure.
  std::string make_pm() {
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

  // cuptiFinalize, as kineto does after a trace: CUPTI's launch instrumentation goes away with
  // it. PM sampling goes down with CUPTI and, with `resume_pm`, comes back (a gap of a few ms).
  void detach_cupti(bool resume_pm, bool finalize_at_api_exit = false) {
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
  void finalize_cupti(bool at_api_exit) {
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

  static void CUPTIAPI finalize_callback(void* userdata, CUpti_CallbackDomain domain,
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

  // A release thread started and has not finished (joins it once it has).
  bool release_running() const {
    if (releasing_.load(std::memory_order_acquire)) return true;
    if (release_thread_.joinable()) release_thread_.join();
    return false;
  }

  // `wait`: off the training thread, a clock not seen before gets its rate at once.
  void measure_clock(bool wait) {
    Nanos latency = 0;
    if (cupti_ == nullptr || !clock_.measure(*cupti_, &latency, wait ? kClockWaitNs : 0)) return;
    const TimeBase tb = clock_.get();
    logger_.debug(
        "CUPTI clock: offset to the steady clock {} (CUPTI reading {} at steady {} ns), {} steady "
        "ns a unit (paired-read latency {} ns)",
        tb.offset_ns, tb.anchor, static_cast<int64_t>(tb.anchor) - tb.offset_ns, tb.scale, latency);
    note_tick_clock(clock_, logger_);
  }

  void on_pm(std::vector<PmSample>& samples) {
    std::lock_guard<std::mutex> lock(events_mutex_);
    for (auto& s : samples) {
      if (pending_pm_.size() >= kMaxPendingSamples) {
        ++pending_dropped_;
      } else {
        pending_pm_.push_back(s);
      }
    }
  }

  void on_nvml(const UtilSample& u) {
    std::lock_guard<std::mutex> lock(events_mutex_);
    if (pending_nvml_.size() >= kMaxPendingSamples) {
      ++pending_dropped_;
    } else {
      pending_nvml_.push_back(u);
    }
  }

  void stop_all() {
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

}  // namespace

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
  return std::make_unique<CuptiBackend>(config, logger, std::move(loaders));
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
