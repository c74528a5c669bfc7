#include "torchpilot/runtime/gpu/gpu_window_planner.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "torchpilot/runtime/core/metrics.h"

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

const char* GpuWindowPlanner::next_window(int64_t* step) const {
  *step = -1;
  if (trace_failed_) return "off";
  if (first_deferred_ || repeat_deferred_) return "deferred";
  if (!first_window_done_) {
    *step = config_.trace_first_step;
    return "planned";
  }
  if (armed_steps_ > 0 || window_left_ > 0 || requested_window_ > 0) return "planned";
  return config_.trace_every_epochs > 0 ? "planned" : "done";
}

void GpuWindowPlanner::request_window(int steps) {
  if (steps > 0 && window_left_ == 0) requested_window_ = steps;
}

int GpuWindowPlanner::allowed_steps(const char* kind) const {
  if (!allow_optional) return config_.trace_steps;
  return std::clamp(allow_optional(kind, config_.trace_steps), 0, config_.trace_steps);
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
  // The median moves slowly: sorting the history every step would only cost the step (until
  // the history is full it is short, and a window's cost needs a median early).
  const size_t n = recent_step_ns_.size();
  if ((n >= kMinMedianSteps && n < kAnomalyHistory) ||
      (n == kAnomalyHistory && recent_next_ % kMedianRefreshSteps == 0)) {
    recent_median_ns_ = median(recent_step_ns_);
  }
}

void GpuWindowPlanner::arm_steps(int64_t* step, int64_t* step_in_epoch) const {
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  *step = *step_in_epoch = kNever;
  if (window_left_ > 0 || armed_steps_ > 0 || trace_failed_ || stopping_ || tail_ > 0) return;
  if (requested_window_ > 0) {
    *step = 0;
  } else if (!first_window_done_) {
    if (!first_deferred_) *step = config_.trace_first_step - 1;
  } else if (config_.trace_every_epochs > 0 && !repeat_deferred_ &&
             epochs_since_window_ >= config_.trace_every_epochs) {
    *step_in_epoch = window_step_in_epoch_ - 1;
  }
}

GpuWindowPlanner::StepEndActions GpuWindowPlanner::end_step(int64_t step, int64_t step_in_epoch,
                                                            Nanos begin, Nanos end,
                                                            bool warmup_done,
                                                            const StepFacts& facts) {
  StepEndActions a;
  a.traced = window_left_ > 0;
  a.trace_from = window_first_step_ ? trace_from_ : begin;
  window_first_step_ = false;
  last_end_ = end;

  if (window_left_ > 0 && --window_left_ == 0) {
    close_window(end);
    a.stop_trace = true;
  }

  // Anomaly trigger: the step's own work (less its data wait and torchpilot's time) much slower
  // than the recent median, two steps in a row (a window traces what comes after its trigger).
  // Not while tracing (the trace itself slows steps), not at an epoch's first steps (a loader
  // restarting), not at a known recurring stall.
  const Nanos work = std::max<Nanos>(0, end - begin - facts.data_wait_ns - facts.own_ns);
  // Nor while a release runs (it slows the steps it overlaps: they would trigger a window of
  // their own and raise the median), nor while a window waits to open (it traces them anyway).
  const bool tracing_now = a.traced || stopping_ || tail_ > 0 || anomaly_quiet_steps_ > 0 ||
                           facts.releasing || armed_steps_ > 0;
  if (anomaly_quiet_steps_ > 0) --anomaly_quiet_steps_;
  const double med = static_cast<double>(recent_median_ns_);
  const bool judged = !tracing_now && warmup_done && config_.trace_anomaly_factor > 0 &&
                      recent_step_ns_.size() == kAnomalyHistory && med > 0;
  const bool slow = judged && static_cast<double>(work) > config_.trace_anomaly_factor * med;
  if (slow && step_in_epoch >= kEdgeSteps && !facts.at_period) {
    if (slow_run_++ == 0) slow_first_ns_ = work;
    if (slow_run_ >= kAnomalySteps && !anomaly_window_used_) {
      const int allowed = allowed_steps("anomaly");
      if (allowed == 0) {
        a.deferred = true;
      } else {
        anomaly_window_used_ = true;
        a.anomaly = true;
        if (requested_window_ == 0) requested_window_ = allowed;
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      "steps %lld-%lld did %.2f and %.2f ms of their own work (less data wait "
                      "%.2f ms and torchpilot's %.2f ms in the last), %.1fx the median %.2f ms of "
                      "recent untraced steps (factor %.3g); not an epoch's start, not a known "
                      "periodic stall",
                      static_cast<long long>(step - 1), static_cast<long long>(step),
                      static_cast<double>(slow_first_ns_) / 1e6, static_cast<double>(work) / 1e6,
                      static_cast<double>(facts.data_wait_ns) / 1e6,
                      static_cast<double>(facts.own_ns) / 1e6, static_cast<double>(work) / med,
                      med / 1e6, config_.trace_anomaly_factor);
        anomaly_reason_ = buf;
      }
    }
  } else if (!tracing_now) {
    slow_run_ = 0;
  }
  if (!tracing_now) note_step_time(work);

  // Does the next step open a window? Armed here, started when that step begins. None inside
  // auto-tune's trials.
  if (window_left_ == 0 && armed_steps_ == 0 && !trace_failed_ && !stopping_ && tail_ == 0 &&
      warmup_done) {
    if (requested_window_ > 0) {
      arm(requested_window_);
      requested_window_ = 0;
    } else if (!first_window_done_ && step + 1 >= config_.trace_first_step) {
      // Like a repeat, the first window waits (checked at each step end) for room in the budget.
      if (const int steps = allowed_steps("first"); steps > 0) {
        first_window_done_ = true;
        first_deferred_ = false;
        window_step_in_epoch_ = step_in_epoch + 1;
        arm(steps);
      } else if (!first_deferred_) {
        first_deferred_ = true;
        a.deferred = true;
      }
    } else if (first_window_done_ && config_.trace_every_epochs > 0 &&
               epochs_since_window_ >= config_.trace_every_epochs &&
               step_in_epoch + 1 >= window_step_in_epoch_) {
      // A repeat waits (checked at each step end) until the budget has room for it.
      if (const int steps = allowed_steps("repeat"); steps > 0) {
        repeat_deferred_ = false;
        arm(steps);
      } else if (!repeat_deferred_) {
        repeat_deferred_ = true;
        a.deferred = true;
      }
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
  slow_run_ = 0;
  return a;
}

}  // namespace torchpilot
