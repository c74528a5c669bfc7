// CUPTI PM sampling's metrics and setup: the metric names and fallback tiers, sample conversion,
// and the sampler's configuration (device enable, metric fallbacks, release).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "cupti_pm_sampling.h"
#include "torchpilot/runtime/core/guard.h"

namespace torchpilot {
namespace detail {

// --- Metrics and pure conversion ---------------------------------------------------------------

namespace {

// Each metric's CUPTI name and the PmSample field its values go to: one table for both.
struct PmMetricInfo {
  PmMetric metric;
  const char* name;
  double PmSample::*field;
};
constexpr PmMetricInfo kPmMetrics[] = {
    {PmMetric::kCounterUtilization, "gr__cycles_active.avg.pct_of_peak_sustained_elapsed",
     &PmSample::counter_utilization},
    {PmMetric::kSmEfficiency, "sm__cycles_active.avg.pct_of_peak_sustained_elapsed",
     &PmSample::sm_efficiency},
    {PmMetric::kTensorActivity, "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
     &PmSample::tensor_activity},
    {PmMetric::kDramThroughput, "dram__throughput.avg.pct_of_peak_sustained_elapsed",
     &PmSample::dram_throughput},
    {PmMetric::kAchievedOccupancy, "sm__warps_active.avg.pct_of_peak_sustained_elapsed",
     &PmSample::achieved_occupancy},
    {PmMetric::kPcieReadBytes, "pcie__read_bytes.sum", &PmSample::pcie_read_bytes},
    {PmMetric::kPcieWriteBytes, "pcie__write_bytes.sum", &PmSample::pcie_write_bytes},
};

const PmMetricInfo* pm_metric_info(PmMetric m) {
  for (const PmMetricInfo& info : kPmMetrics) {
    if (info.metric == m) return &info;
  }
  return nullptr;
}

}  // namespace

const char* pm_metric_name(PmMetric m) {
  const PmMetricInfo* info = pm_metric_info(m);
  return info != nullptr ? info->name : "?";
}

bool pm_metric_is_percent(PmMetric m) {
  return m != PmMetric::kPcieReadBytes && m != PmMetric::kPcieWriteBytes;
}

std::vector<std::vector<PmMetric>> pm_metric_tiers() {
  using M = PmMetric;
  return {
      {M::kCounterUtilization, M::kSmEfficiency, M::kTensorActivity, M::kDramThroughput,
       M::kAchievedOccupancy, M::kPcieReadBytes, M::kPcieWriteBytes},
      {M::kCounterUtilization, M::kSmEfficiency, M::kTensorActivity, M::kDramThroughput,
       M::kAchievedOccupancy},
      {M::kCounterUtilization, M::kSmEfficiency},
  };
}

std::vector<PmMetric> pm_metric_set(const std::string& name) {
  const auto tiers = pm_metric_tiers();
  if (name == "no_pcie") return tiers[1];
  if (name == "sm") return tiers[2];
  return {};
}

PmSample to_pm_sample(const std::vector<PmMetric>& metrics, const double* values, uint64_t start_ns,
                      uint64_t end_ns, const TimeBase& tb) {
  PmSample s;
  s.begin = tb.to_steady(start_ns);
  s.end = tb.to_steady(end_ns);
  for (size_t i = 0; i < metrics.size(); ++i) {
    double v = values[i];
    if (!std::isnan(v)) {
      v = pm_metric_is_percent(metrics[i]) ? std::clamp(v / 100.0, 0.0, 1.0) : std::max(v, 0.0);
    }
    if (const PmMetricInfo* info = pm_metric_info(metrics[i])) s.*(info->field) = v;
  }
  return s;
}

std::string pm_sampling_error_reason(CuptiApi& api, const std::string& call, CUptiResult r) {
  switch (r) {
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
      return "no permission for GPU performance counters (needs root, CAP_SYS_ADMIN or "
             "NVreg_RestrictProfilingToAdminUsers=0)";
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES:
      return "no permission for GPU performance counters on this virtual GPU (the hypervisor "
             "must allow profiling)";
    case CUPTI_ERROR_HARDWARE_BUSY:
      return "counters held by another client (DCGM or Nsight)";
    case CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED:
      return "PM sampling is not supported on a MIG instance "
             "(CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED)";
    case CUPTI_ERROR_NOT_SUPPORTED:
      return "PM sampling is not supported on this GPU or partition (" + call +
             ": CUPTI_ERROR_NOT_SUPPORTED; a MIG instance or a GPU older than Turing)";
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED:
      return "PM sampling is not supported on this virtual GPU";
    case CUPTI_ERROR_CMP_DEVICE_NOT_SUPPORTED:
      return "PM sampling is not supported on a CMP (crypto-mining) GPU";
    case CUPTI_ERROR_API_NOT_IMPLEMENTED:
      return "the loaded libcupti lacks " + call + " (PM sampling needs CUPTI from CUDA 12.6+)";
    default:
      return call + " failed: " + cupti_error_name(api, r);
  }
}

namespace {

// Errors that no other metric set can cure.
bool fatal(CUptiResult r) {
  switch (r) {
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES:
    case CUPTI_ERROR_HARDWARE_BUSY:
    case CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_NOT_SUPPORTED:
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_CMP_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_API_NOT_IMPLEMENTED:
    case CUPTI_ERROR_NOT_INITIALIZED:
      return true;
    default:
      return false;
  }
}

std::string names_of(const std::vector<PmMetric>& metrics) {
  std::string s;
  for (const auto m : metrics) {
    if (!s.empty()) s += ", ";
    s += pm_metric_name(m);
  }
  return s;
}

}  // namespace

std::string PmSampler::configure() {
  // Timed in parts: after a trace window the whole restart takes about 0.3 s on an H200, which
  // delays the next window; which part would be worth keeping across restarts.
  const Nanos t0 = steady_now_ns();
  // Counter availability (twice: size, then fill).
  CUpti_PmSampling_GetCounterAvailability_Params avail{};
  avail.structSize = CUpti_PmSampling_GetCounterAvailability_Params_STRUCT_SIZE;
  avail.deviceIndex = static_cast<size_t>(options_.device);
  CUptiResult r = api_.pm_sampling_get_counter_availability(&avail);
  if (r != CUPTI_SUCCESS) {
    return pm_sampling_error_reason(api_, "cuptiPmSamplingGetCounterAvailability", r);
  }
  std::vector<uint8_t> availability(avail.counterAvailabilityImageSize);
  avail.pCounterAvailabilityImage = availability.data();
  r = api_.pm_sampling_get_counter_availability(&avail);
  if (r != CUPTI_SUCCESS) {
    return pm_sampling_error_reason(api_, "cuptiPmSamplingGetCounterAvailability", r);
  }

  const Nanos t1 = steady_now_ns();
  std::string why = configure_metrics(availability);
  if (!why.empty()) return why;
  const Nanos t2 = steady_now_ns();
  why = enable_device();
  if (!why.empty()) {
    release();
    return why;
  }
  const Nanos t3 = steady_now_ns();
  logger_.debug(
      "PM sampling configured on device {} ({}): {} metrics every {} ms{}; took: availability "
      "{:.1f} ms, host config image {:.1f} ms, enable and counter data {:.1f} ms",
      options_.device, options_.chip, metrics_.size(), options_.interval_ms,
      options_.duty < 1 ? fmt::format(", enabled {:.0f}% of every {} ms", options_.duty * 100,
                                      options_.duty_period_ms)
                        : std::string(),
      (t1 - t0) / 1e6, (t2 - t1) / 1e6, (t3 - t2) / 1e6);
  return {};
}

std::string PmSampler::enable_device() {
  CUpti_PmSampling_Enable_Params enable{};
  enable.structSize = CUpti_PmSampling_Enable_Params_STRUCT_SIZE;
  enable.deviceIndex = static_cast<size_t>(options_.device);
  CUptiResult r = api_.pm_sampling_enable(&enable);
  if (r != CUPTI_SUCCESS) return pm_sampling_error_reason(api_, "cuptiPmSamplingEnable", r);
  sampler_ = enable.pPmSamplingObject;

  CUpti_PmSampling_SetConfig_Params set{};
  set.structSize = CUpti_PmSampling_SetConfig_Params_STRUCT_SIZE;
  set.pPmSamplingObject = sampler_;
  set.configSize = config_image_.size();
  set.pConfig = config_image_.data();
  set.hardwareBufferSize = options_.hardware_buffer_bytes;
  const double interval_ms = options_.interval_ms > 0 ? options_.interval_ms : 2.0;
  set.samplingInterval = static_cast<uint64_t>(std::llround(interval_ms * 1e6));  // ns
  set.triggerMode = CUPTI_PM_SAMPLING_TRIGGER_MODE_GPU_TIME_INTERVAL;
  set.hwBufferAppendMode = CUPTI_PM_SAMPLING_HARDWARE_BUFFER_APPEND_MODE_KEEP_LATEST;
  r = api_.pm_sampling_set_config(&set);
  if (r != CUPTI_SUCCESS) {
    disable_device();
    return pm_sampling_error_reason(api_, "cuptiPmSamplingSetConfig", r);
  }

  CUpti_PmSampling_GetCounterDataSize_Params size{};
  size.structSize = CUpti_PmSampling_GetCounterDataSize_Params_STRUCT_SIZE;
  size.pPmSamplingObject = sampler_;
  size.pMetricNames = metric_names_.data();
  size.numMetrics = metric_names_.size();
  size.maxSamples = options_.max_samples;
  r = api_.pm_sampling_get_counter_data_size(&size);
  if (r != CUPTI_SUCCESS) {
    disable_device();
    return pm_sampling_error_reason(api_, "cuptiPmSamplingGetCounterDataSize", r);
  }
  counter_data_.assign(size.counterDataSize, 0);
  if (!reinit_image()) {
    disable_device();
    return reason();
  }
  return {};
}

void PmSampler::disable_device() {
  if (sampler_ == nullptr) return;
  CUpti_PmSampling_Disable_Params p{};
  p.structSize = CUpti_PmSampling_Disable_Params_STRUCT_SIZE;
  p.pPmSamplingObject = sampler_;
  const CUptiResult r = api_.pm_sampling_disable(&p);
  if (r != CUPTI_SUCCESS) logger_.debug("cuptiPmSamplingDisable: {}", cupti_error_name(api_, r));
  sampler_ = nullptr;
}

std::string PmSampler::configure_metrics(const std::vector<uint8_t>& availability) {
  std::string last_refusal;
  const std::vector<std::vector<PmMetric>> tiers =
      options_.metrics.empty() ? pm_metric_tiers()
                               : std::vector<std::vector<PmMetric>>{options_.metrics};
  const std::vector<PmMetric>& full = tiers.front();
  for (const auto& tier : tiers) {
    CUpti_Profiler_Host_Initialize_Params init{};
    init.structSize = CUpti_Profiler_Host_Initialize_Params_STRUCT_SIZE;
    init.profilerType = CUPTI_PROFILER_TYPE_PM_SAMPLING;
    init.pChipName = options_.chip.c_str();
    init.pCounterAvailabilityImage = availability.data();
    CUptiResult r = api_.profiler_host_initialize(&init);
    if (r != CUPTI_SUCCESS) {
      return pm_sampling_error_reason(api_, "cuptiProfilerHostInitialize", r);
    }
    host_ = init.pHostObject;

    std::vector<const char*> names;
    for (const auto m : tier) names.push_back(pm_metric_name(m));
    std::string refusal;
    CUpti_Profiler_Host_ConfigAddMetrics_Params add{};
    add.structSize = CUpti_Profiler_Host_ConfigAddMetrics_Params_STRUCT_SIZE;
    add.pHostObject = host_;
    add.ppMetricNames = names.data();
    add.numMetrics = names.size();
    r = api_.profiler_host_config_add_metrics(&add);
    if (r != CUPTI_SUCCESS) {
      if (fatal(r)) {
        release();
        return pm_sampling_error_reason(api_, "cuptiProfilerHostConfigAddMetrics", r);
      }
      refusal = "cuptiProfilerHostConfigAddMetrics refused the set: " + cupti_error_name(api_, r);
    }
    std::vector<uint8_t> image;
    if (refusal.empty()) {
      CUpti_Profiler_Host_GetConfigImageSize_Params isize{};
      isize.structSize = CUpti_Profiler_Host_GetConfigImageSize_Params_STRUCT_SIZE;
      isize.pHostObject = host_;
      r = api_.profiler_host_get_config_image_size(&isize);
      if (r == CUPTI_SUCCESS) {
        image.assign(isize.configImageSize, 0);
        CUpti_Profiler_Host_GetConfigImage_Params get{};
        get.structSize = CUpti_Profiler_Host_GetConfigImage_Params_STRUCT_SIZE;
        get.pHostObject = host_;
        get.configImageSize = image.size();
        get.pConfigImage = image.data();
        r = api_.profiler_host_get_config_image(&get);
      }
      if (r != CUPTI_SUCCESS) {
        if (fatal(r)) {
          release();
          return pm_sampling_error_reason(api_, "cuptiProfilerHostGetConfigImage", r);
        }
        refusal = "no config image for the set: " + cupti_error_name(api_, r);
      }
    }
    if (refusal.empty()) {
      CUpti_Profiler_Host_GetNumOfPasses_Params passes{};
      passes.structSize = CUpti_Profiler_Host_GetNumOfPasses_Params_STRUCT_SIZE;
      passes.configImageSize = image.size();
      passes.pConfigImage = image.data();
      r = api_.profiler_host_get_num_of_passes(&passes);
      if (r != CUPTI_SUCCESS) {
        refusal = "cuptiProfilerHostGetNumOfPasses failed: " + cupti_error_name(api_, r);
      } else if (passes.numOfPasses != 1) {
        refusal = "the set needs " + std::to_string(passes.numOfPasses) + " passes";
      }
    }
    if (refusal.empty()) {
      metrics_ = tier;
      metric_names_ = names;
      config_image_ = std::move(image);
      if (tier.size() < full.size()) {
        std::vector<PmMetric> dropped;
        for (const auto m : full) {
          if (std::find(tier.begin(), tier.end(), m) == tier.end()) dropped.push_back(m);
        }
        logger_.warn("PM sampling without {} ({})", names_of(dropped), last_refusal);
      }
      return {};
    }
    logger_.debug("PM sampling: {} [{}]", refusal, names_of(tier));
    last_refusal = refusal;
    release();  // a fresh host object for the next set
  }
  return "PM sampling has no single-pass metric set on this GPU (" + last_refusal + ")";
}

void PmSampler::release() {
  disable_device();
  if (host_ != nullptr) {
    CUpti_Profiler_Host_Deinitialize_Params p{};
    p.structSize = CUpti_Profiler_Host_Deinitialize_Params_STRUCT_SIZE;
    p.pHostObject = host_;
    const CUptiResult r = api_.profiler_host_deinitialize(&p);
    if (r != CUPTI_SUCCESS) {
      logger_.debug("cuptiProfilerHostDeinitialize: {}", cupti_error_name(api_, r));
    }
    host_ = nullptr;
  }
}

bool PmSampler::reinit_image() {
  CUpti_PmSampling_CounterDataImage_Initialize_Params p{};
  p.structSize = CUpti_PmSampling_CounterDataImage_Initialize_Params_STRUCT_SIZE;
  p.pPmSamplingObject = sampler_;
  p.counterDataSize = counter_data_.size();
  p.pCounterData = counter_data_.data();
  const CUptiResult r = api_.pm_sampling_counter_data_image_initialize(&p);
  if (r == CUPTI_SUCCESS) return true;
  std::lock_guard<std::mutex> lock(state_mutex_);
  reason_ = pm_sampling_error_reason(api_, "cuptiPmSamplingCounterDataImageInitialize", r);
  return false;
}

}  // namespace detail
}  // namespace torchpilot
