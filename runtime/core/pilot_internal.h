// The Pilot's fan-out to collectors and sinks, shared by pilot.cpp and pilot_hosting.cpp:
// each call guarded, a collector that throws dropped, a sink that throws disabled.
#pragma once

#include <string>

#include "torchpilot/runtime/core/guard.h"
#include "torchpilot/runtime/core/logging.h"
#include "torchpilot/runtime/core/pilot.h"

namespace torchpilot {

template <typename Fn>
void Pilot::for_each_collector(const char* what, const unsigned& hook, Fn&& fn) {
  for (size_t i = 0; i < collectors_.size();) {
    if (hook != kEveryCollector && (collector_hooks_[i] & hook) == 0) {
      ++i;
      continue;
    }
    Collector* c = collectors_[i];
    if (const auto failed = failure_of([&] { fn(*c); })) {
      log_to(*logger_, LogLevel::kError,
             "collector '" + name_of(*c) + "' failed in " + what + " and is removed" +
                 reason_suffix(*failed));
      drop_collector(i);
    } else {
      ++i;
    }
  }
}

template <typename Fn>
void Pilot::for_each_collector_timed(const char* what, const unsigned& hook, Fn&& fn) {
  // Each collector's share of the step calls (CostStats::step_parts): one clock read each, the
  // previous collector's end being the next one's start. After the run's first kPartExactSteps
  // steps, read at one call in kPartSampleSteps drawn at random (collectors do periodic work: a
  // fixed stride would alias with it) and counted that many times: the split costs its clock
  // reads rarely (the total is timed at every step).
  int64_t weight = 1;
  if (next_step_ > kPartExactSteps) {
    part_sample_rng_ ^= part_sample_rng_ << 13;  // xorshift64
    part_sample_rng_ ^= part_sample_rng_ >> 7;
    part_sample_rng_ ^= part_sample_rng_ << 17;
    weight = kPartSampleSteps;
  }
  if (weight > 1 && part_sample_rng_ % kPartSampleSteps != 0) {
    for_each_collector(what, hook, std::forward<Fn>(fn));
    return;
  }
  Nanos t0 = clock_->now_ns();
  Nanos flushed = flush_ns_;
  for_each_collector(what, hook, [&](Collector& c) {
    fn(c);
    const Nanos t1 = clock_->now_ns();
    // A batch of steps taken from inside its call (a late record it published) is the Pilot's.
    cost_->step_part(&c, (t1 - t0 - (flush_ns_ - flushed)) * weight);
    t0 = t1;
    flushed = flush_ns_;
  });
}

template <typename Fn>
void Pilot::for_each_sink(const char* what, Fn&& fn) {
  for (size_t i = 0; i < sinks_.size(); ++i) {
    if (sink_failed_[i]) continue;
    if (const auto failed = failure_of([&] { fn(*sinks_[i]); })) {
      sink_failed_[i] = true;
      log_to(*logger_, LogLevel::kError,
             "sink '" + name_of(*sinks_[i]) + "' failed in " + what + " and is disabled" +
                 reason_suffix(*failed));
    }
  }
}

}  // namespace torchpilot
