// CUPTI PM sampling: the sampler's start and stop, its duty cycle, the decode thread.
#include "cupti_pm_sampling.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "own_thread.h"
#include "torchpilot/runtime/core/guard.h"

namespace torchpilot {
namespace detail {
// --- PmSampler ---------------------------------------------------------------------------------

PmSampler::PmSampler(CuptiApi& api, CuptiClock& clock, spdlog::logger& logger, PmOptions options,
                     Sink sink)
    : api_(api),
      clock_(clock),
      logger_(logger),
      options_(std::move(options)),
      sink_(std::move(sink)) {}

// A destructor must not throw: stop() calls CUPTI, joins a thread and logs.
PmSampler::~PmSampler() {
  (void)failure_of([&] { stop(); });
}
std::string PmSampler::start() {
  if (started_) return {};
  if (sampler_ == nullptr) return "PM sampling is not configured";
  {
    std::lock_guard<std::mutex> lock(decode_mutex_);
    if (!start_device()) {
      release();
      return reason();
    }
  }
  started_ = true;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    stop_requested_ = false;
    reason_.clear();
  }
  thread_ = std::thread([this] {
    mark_own_thread("tp-pm-decode");
    run();
  });
  return {};
}

bool PmSampler::start_device() {
  CUpti_PmSampling_Start_Params p{};
  p.structSize = CUpti_PmSampling_Start_Params_STRUCT_SIZE;
  p.pPmSamplingObject = sampler_;
  const CUptiResult r = api_.pm_sampling_start(&p);
  if (r != CUPTI_SUCCESS) {
    std::lock_guard<std::mutex> lock(state_mutex_);
    reason_ = pm_sampling_error_reason(api_, "cuptiPmSamplingStart", r);
    return false;
  }
  running_ = true;
  ++bursts_;
  phase_since_ns_ = steady_now_ns();
  discard_next_ = true;  // the first sample after a start is garbage
  failed_ = false;
  consumed_ = 0;
  return true;
}

void PmSampler::stop_device_locked() {
  if (!running_) return;
  CUpti_PmSampling_Stop_Params p{};
  p.structSize = CUpti_PmSampling_Stop_Params_STRUCT_SIZE;
  p.pPmSamplingObject = sampler_;
  const CUptiResult r = api_.pm_sampling_stop(&p);
  if (r != CUPTI_SUCCESS) logger_.debug("cuptiPmSamplingStop: {}", cupti_error_name(api_, r));
  if (!failed_) decode_locked();  // what is left, to the end of the records
  running_ = false;
  phase_since_ns_ = steady_now_ns();
}

PmSampler::Duty PmSampler::duty() const {
  // The decode thread's tick moves the cycle: a burst or a pause lasts two ticks at least (a
  // burst's first sample is discarded), whatever gpu.pm_duty and its period ask.
  const Nanos tick = static_cast<Nanos>(std::max(1, options_.decode_period_ms)) * 1'000'000;
  const Nanos period = static_cast<Nanos>(std::max(1, options_.duty_period_ms)) * 1'000'000;
  const Nanos on = std::max(2 * tick, static_cast<Nanos>(options_.duty * period));
  return {on, std::max(2 * tick, period - on)};
}

bool PmSampler::burst_over_locked() const {
  return options_.duty < 1 && running_ && steady_now_ns() - phase_since_ns_ >= duty().on;
}

void PmSampler::duty_step_locked() {
  if (options_.duty >= 1) return;
  if (burst_over_locked()) {
    stop_device_locked();
    disable_device();    // enabled, even stopped, the sampler costs the GPU's work
    paused_ = !failed_;  // the burst's samples are with the sink
    return;
  }
  const Duty d = duty();
  if (!running_ && steady_now_ns() - phase_since_ns_ >= d.off) {
    paused_ = false;
    std::string why = enable_device();
    const bool resumed = why.empty() && start_device();
    if (why.empty() && !resumed) disable_device();
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (resumed) {
      if (resume_failing_) logger_.info("PM sampling resumed");
      resume_failing_ = false;
      reason_.clear();
      return;
    }
    if (why.empty()) why = reason_;  // start_device's
    // Another client (a profiler) may hold the counters for a while: not the end of sampling.
    if (!resume_failing_) {
      resume_failing_ = true;
      logger_.warn(
          "PM sampling could not resume after a pause ({}); trying again every {} ms, PM figures "
          "missing meanwhile",
          why, (d.on + d.off) / 1'000'000);
    }
    reason_ = "PM sampling could not resume after a pause: " + why;
    phase_since_ns_ = steady_now_ns() + d.on;  // the next try a period from now
    paused_ = true;                            // nothing is coming: steps need not wait
  }
}

void PmSampler::run() {
  const auto period = std::chrono::milliseconds(std::max(1, options_.decode_period_ms));
  std::unique_lock<std::mutex> state(state_mutex_);
  for (;;) {
    wake_.wait_for(state, period, [this] { return stop_requested_ || decode_requested_; });
    if (stop_requested_) return;
    decode_requested_ = false;
    state.unlock();
    bool ok = false;
    try {  // nothing may escape a collector thread (std::terminate would end the training)
      // The CUPTI clock's line, kept fresh here, off the training thread and outside the decode
      // lock (its wait, on a changed clock, holds no one up): another client may change what
      // CUPTI's clock is at any time. stop() joins this thread before CUPTI goes.
      clock_.measure(api_, nullptr, kClockWaitNs);
      note_tick_clock(clock_, logger_);
      std::lock_guard<std::mutex> lock(decode_mutex_);
      // A burst that is over decodes to its end as it stops: not twice in one tick.
      ok = !failed_ && (!running_ || burst_over_locked() || decode_locked());
      if (ok) duty_step_locked();
    } catch (const std::exception& e) {
      fail_on_exception(e.what());
    } catch (...) {
      fail_on_exception("unknown exception");
    }
    state.lock();
    if (!ok) return;  // reason_ says why; stop() still releases CUPTI's objects
  }
}

void PmSampler::decode_now() {
  if (!started_) return;
  std::lock_guard<std::mutex> lock(decode_mutex_);
  try {
    if (!failed_ && running_) decode_locked();
  } catch (const std::exception& e) {
    failed_ = true;
    std::lock_guard<std::mutex> state(state_mutex_);  // decode_mutex_ -> state_mutex_, as elsewhere
    reason_ = std::string("PM sampling stopped: ") + e.what();
  } catch (...) {
    failed_ = true;
    std::lock_guard<std::mutex> state(state_mutex_);
    reason_ = "PM sampling stopped: unknown exception";
  }
}

Nanos PmSampler::paused_final_until() const {
  // The time first: a burst resuming after the flag was read starts sampling after it.
  const Nanos now = steady_now_ns();
  return paused_.load() ? now : 0;
}

void PmSampler::request_decode() {
  {
    std::lock_guard<std::mutex> state(state_mutex_);
    decode_requested_ = true;
  }
  wake_.notify_all();
}

void PmSampler::fail_on_exception(const char* what) {
  std::lock_guard<std::mutex> lock(decode_mutex_);
  failed_ = true;
  std::lock_guard<std::mutex> state(state_mutex_);
  reason_ = std::string("PM sampling stopped: ") + what;
}

bool PmSampler::decode_locked() {
  std::vector<PmSample> out;
  std::vector<double> values(metrics_.size());
  bool ok = true;
  for (size_t round = 0; round < options_.max_decode_rounds; ++round) {
    CUpti_PmSampling_DecodeData_Params d{};
    d.structSize = CUpti_PmSampling_DecodeData_Params_STRUCT_SIZE;
    d.pPmSamplingObject = sampler_;
    d.pCounterDataImage = counter_data_.data();
    d.counterDataImageSize = counter_data_.size();
    const Nanos t0 = steady_now_ns();
    CUptiResult r = api_.pm_sampling_decode_data(&d);
    const Nanos t1 = steady_now_ns();
    stats_.decode_ns += t1 - t0;
    ++stats_.decodes;
    if (r != CUPTI_SUCCESS) {
      std::lock_guard<std::mutex> lock(state_mutex_);
      reason_ = pm_sampling_error_reason(api_, "cuptiPmSamplingDecodeData", r);
      ok = false;
      break;
    }
    if (d.overflow != 0 && !overflow_logged_) {
      overflow_logged_ = true;
      logger_.warn("PM sampling: the hardware buffer overflowed; the oldest samples were lost");
    }
    CUpti_PmSampling_GetCounterDataInfo_Params info{};
    info.structSize = CUpti_PmSampling_GetCounterDataInfo_Params_STRUCT_SIZE;
    info.pCounterDataImage = counter_data_.data();
    info.counterDataImageSize = counter_data_.size();
    r = api_.pm_sampling_get_counter_data_info(&info);
    if (r != CUPTI_SUCCESS) {
      std::lock_guard<std::mutex> lock(state_mutex_);
      reason_ = pm_sampling_error_reason(api_, "cuptiPmSamplingGetCounterDataInfo", r);
      ok = false;
      break;
    }
    // Samples accumulate in the image across decodes; only those not seen yet are evaluated, and
    // the image is re-initialized only when full (initializing it costs about 14 us per sample
    // slot on an H200: doing it after every decode took 75% of a core at 2048 slots).
    const Nanos t2 = steady_now_ns();
    const size_t completed = info.numCompletedSamples;
    for (size_t i = consumed_; i < completed; ++i) {
      CUpti_PmSampling_CounterData_GetSampleInfo_Params si{};
      si.structSize = CUpti_PmSampling_CounterData_GetSampleInfo_Params_STRUCT_SIZE;
      si.pPmSamplingObject = sampler_;
      si.pCounterDataImage = counter_data_.data();
      si.counterDataImageSize = counter_data_.size();
      si.sampleIndex = i;
      r = api_.pm_sampling_counter_data_get_sample_info(&si);
      CUpti_Profiler_Host_EvaluateToGpuValues_Params ev{};
      if (r == CUPTI_SUCCESS) {
        std::fill(values.begin(), values.end(), kNotMeasured);
        ev.structSize = CUpti_Profiler_Host_EvaluateToGpuValues_Params_STRUCT_SIZE;
        ev.pHostObject = host_;
        ev.pCounterDataImage = counter_data_.data();
        ev.counterDataImageSize = counter_data_.size();
        ev.rangeIndex = i;
        ev.ppMetricNames = metric_names_.data();
        ev.numMetrics = metric_names_.size();
        ev.pMetricValues = values.data();
        r = api_.profiler_host_evaluate_to_gpu_values(&ev);
      }
      if (r != CUPTI_SUCCESS) {
        if (!evaluate_error_logged_) {
          evaluate_error_logged_ = true;
          logger_.warn(
              "PM sampling: a sample could not be evaluated ({}); such samples are skipped",
              cupti_error_name(api_, r));
        }
        continue;
      }
      const TimeBase tb = clock_.get();
      if (!clock_checked_ || discard_next_) {
        // Whether PM sample times share CUPTI's activity clock (cuptiGetTimestamp) is not
        // documented: a sample that ended just now should be a few ms (the decode period) old.
        uint64_t now = 0;
        api_.get_timestamp(&now);
        const double age_ms =
            (static_cast<double>(now) - static_cast<double>(si.endTimestamp)) / 1e6;
        logger_.debug(
            "PM sampling clock check{}: sample [{}, {}], cuptiGetTimestamp() {}, age {:.3f} "
            "units/1e6, offset to steady {} ns, {} steady ns a unit",
            discard_next_ ? " (first sample, discarded)" : "", si.startTimestamp, si.endTimestamp,
            now, age_ms, tb.offset_ns, tb.scale);
        // Samples whose times do not line up with the steps are dropped by lines_up().
        if (!discard_next_) clock_checked_ = true;
      }
      if (discard_next_) {
        discard_next_ = false;  // the first sample after start is garbage (seen on the H200)
        continue;
      }
      PmSample sample =
          to_pm_sample(metrics_, values.data(), si.startTimestamp, si.endTimestamp, tb);
      if (!lines_up(sample)) continue;
      out.push_back(sample);
    }
    const Nanos t3 = steady_now_ns();
    stats_.evaluate_ns += t3 - t2;
    if (completed > consumed_) {
      stats_.samples += static_cast<int64_t>(completed - consumed_);
      consumed_ = completed;
    }
    const bool full =
        d.decodeStopReason == CUPTI_PM_SAMPLING_DECODE_STOP_REASON_COUNTER_DATA_FULL ||
        (info.numTotalSamples > 0 && info.numPopulatedSamples >= info.numTotalSamples);
    if (!full) break;
    const bool reinit_ok = reinit_image();
    stats_.init_ns += steady_now_ns() - t3;
    ++stats_.inits;
    consumed_ = 0;
    if (!reinit_ok) {
      ok = false;
      break;
    }
  }
  if (!out.empty()) sink_(std::move(out));
  if (!ok) {
    failed_ = true;
    logger_.warn("PM sampling stopped: {}", reason());
  }
  return ok;
}

void PmSampler::stop() {
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    stop_requested_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  paused_ = false;
  if (started_) {
    std::lock_guard<std::mutex> lock(decode_mutex_);
    stop_device_locked();
    started_ = false;
    if (stats_.decodes > 0) {
      const double n = static_cast<double>(stats_.decodes);
      logger_.debug(
          "PM sampling: {} decodes of {} samples in {} bursts; per decode: DecodeData {:.3f} ms, "
          "evaluation {:.3f} ms; {} image initializations of {:.3f} ms",
          stats_.decodes, stats_.samples, bursts_, stats_.decode_ns / n / 1e6,
          stats_.evaluate_ns / n / 1e6, stats_.inits,
          stats_.inits > 0 ? stats_.init_ns / static_cast<double>(stats_.inits) / 1e6 : 0.0);
    }
  }
  release();
}

bool PmSampler::lines_up(const PmSample& sample) {
  // A sample decoded now ended in the last moments (decoding runs every 50 ms). Far outside that,
  // its times are on another clock: another CUPTI client (PyTorch's profiler registers its own
  // timestamps) changed what CUPTI reports, and the sample would land on the wrong steps.
  constexpr Nanos kFuture = 1'000'000'000, kPast = 10'000'000'000;
  const Nanos now = steady_now_ns();
  const Nanos age = now - sample.end;
  const bool ok = age > -kFuture && age < kPast;
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (ok) {
    if (misaligned_) {
      misaligned_ = false;
      logger_.info("PM sampling: sample times line up with the steps again ({} samples dropped)",
                   dropped_misaligned_);
    }
    return true;
  }
  ++dropped_misaligned_;
  if (!misaligned_) {
    misaligned_ = true;
    logger_.warn(
        "PM sampling: sample times are {:.1f} s away from the steady clock (another CUPTI client, "
        "such as PyTorch's profiler, changed CUPTI's clock?); samples are dropped, and PM figures "
        "are missing, until they line up again",
        static_cast<double>(age) / 1e9);
  }
  // The line may have been measured while the other client held the clock: measure again, at
  // most once a second, without waiting (this may be the training thread's flush); the decode
  // thread's next measure gives a new clock's rate.
  if (now - last_remeasure_ns_ > 1'000'000'000) {
    last_remeasure_ns_ = now;
    clock_.measure(api_);
  }
  return false;
}

std::string PmSampler::reason() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (reason_.empty() && misaligned_) {
    return "sample times are off the steady clock (another CUPTI client?): figures missing until "
           "they line up again";
  }
  return reason_;
}

}  // namespace detail
}  // namespace torchpilot