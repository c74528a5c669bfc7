#include "torchpilot/runtime/gpu_window_planner.h"

#include "torchpilot/runtime/metrics.h"

namespace torchpilot {

GpuWindowPlanner::GpuWindowPlanner(const GpuConfig& config) : config_(config) {
  if (!config_.activity) trace_failed_ = true;
  recent_step_ns_.reserve(kAnomalyHistory);
}

int GpuWindowPlanner::begin_step(Nanos now) {
  window_first_step_ = false;
  starting_steps_ = 0;
  if (armed_steps_ > 0 && window_left_ == 0 && !stopping_ && tail_ == 0) {
    // Started when a step actually begins: a window armed at an epoch's last step opens in the
    // next epoch instead of tracing nothing.
    const int steps = armed_steps_;
    armed_steps_ = 0;
    if (!trace_failed_) {  // one window's records at a time: the tail is over (checked above)
      starting_steps_ = steps;
      starting_at_ = now;
    }
  }
  return starting_steps_;
}

void GpuWindowPlanner::trace_started(bool ok, bool retry_later) {
  if (starting_steps_ == 0) return;  // nothing was asked for
  const int steps = starting_steps_;
  starting_steps_ = 0;
  if (!ok) {
    // Held by another client for now (PyTorch's profiler): this window is skipped, the next
    // trigger tries again. Otherwise the backend's status() says why, and windows stop.
    if (!retry_later) trace_failed_ = true;
    return;
  }
  window_left_ = steps;
  epochs_since_window_ = 0;
  window_first_step_ = true;
  trace_from_ = starting_at_;
}

void GpuWindowPlanner::request_window(int steps) {
  if (steps > 0 && window_left_ == 0) requested_window_ = steps;
}

void GpuWindowPlanner::arm(int steps) {
  armed_steps_ = steps;
  epochs_since_window_ = 0;
}

void GpuWindowPlanner::close_window(Nanos cutoff) {
  window_left_ = 0;
  cutoff_ = cutoff;
  stopping_ = true;  // the tail starts when the trace stops (trace_stopped())
}

void GpuWindowPlanner::trace_stopped() {
  if (!stopping_) return;
  stopping_ = false;
  tail_ = kTailSteps - 1;  // the monitor flushes once right after the stop
}

void GpuWindowPlanner::note_step_time(Nanos ns) {
  if (recent_step_ns_.size() < kAnomalyHistory) {
    recent_step_ns_.push_back(ns);
  } else {
    recent_step_ns_[recent_next_] = ns;
    recent_next_ = (recent_next_ + 1) % kAnomalyHistory;
  }
  // The median moves slowly: sorting the history every step would only cost the step.
  if (recent_step_ns_.size() == kAnomalyHistory && recent_next_ % kMedianRefreshSteps == 0) {
    recent_median_ns_ = median(recent_step_ns_);
  }
}

GpuWindowPlanner::StepEndActions GpuWindowPlanner::end_step(int64_t step, int64_t step_in_epoch,
                                                            Nanos begin, Nanos end,
                                                            bool warmup_done) {
  StepEndActions a;
  a.traced = window_left_ > 0;
  a.trace_from = window_first_step_ ? trace_from_ : begin;
  window_first_step_ = false;
  last_end_ = end;

  if (window_left_ > 0 && --window_left_ == 0) {
    close_window(end);
    a.stop_trace = true;
  }

  // Anomaly trigger: a step much slower than the recent median (not while tracing: the trace
  // itself slows steps).
  const Nanos step_ns = end - begin;
  const bool tracing_now = a.traced || stopping_ || tail_ > 0 || anomaly_quiet_steps_ > 0;
  if (anomaly_quiet_steps_ > 0) --anomaly_quiet_steps_;
  if (!tracing_now && warmup_done && config_.trace_anomaly_factor > 0 &&
      recent_step_ns_.size() == kAnomalyHistory && !anomaly_window_used_) {
    const double med = static_cast<double>(recent_median_ns_);
    if (med > 0 && static_cast<double>(step_ns) > config_.trace_anomaly_factor * med) {
      anomaly_window_used_ = true;
      if (requested_window_ == 0) requested_window_ = config_.trace_steps;
    }
  }
  if (!tracing_now) note_step_time(step_ns);

  // Does the next step open a window? Armed here, started when that step begins. None inside
  // auto-tune's trials.
  if (window_left_ == 0 && armed_steps_ == 0 && !trace_failed_ && !stopping_ && tail_ == 0 &&
      warmup_done) {
    if (requested_window_ > 0) {
      arm(requested_window_);
      requested_window_ = 0;
    } else if (!first_window_done_ && step + 1 >= config_.trace_first_step) {
      first_window_done_ = true;
      window_step_in_epoch_ = step_in_epoch + 1;
      arm(config_.trace_steps);
    } else if (first_window_done_ && config_.trace_every_epochs > 0 &&
               epochs_since_window_ >= config_.trace_every_epochs &&
               step_in_epoch + 1 >= window_step_in_epoch_) {
      arm(config_.trace_steps);
    }
  }

  if (tail_ > 0) {
    a.flush = true;  // the closed window's last kernels
    if (--tail_ == 0) {
      a.release = true;
      anomaly_quiet_steps_ = kTailSteps + 1;  // the release itself makes a slow step
    }
  }
  return a;
}

GpuWindowPlanner::EpochEndActions GpuWindowPlanner::end_epoch() {
  EpochEndActions a;
  if (window_left_ > 0) close_window(last_end_);  // a window does not run across epochs
  if (stopping_) {
    // The monitor waits (bounded) for the GPU to run the window's last step, then stops.
    a.stop_trace = true;
    trace_stopped();
  }
  if (tail_ > 0) {
    // The epoch end flushes: the closed window's records are all in.
    a.release = true;
    tail_ = 0;
  }
  ++epochs_since_window_;
  anomaly_window_used_ = false;
  return a;
}

}  // namespace torchpilot
