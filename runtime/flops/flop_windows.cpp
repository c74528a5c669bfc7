// When to count FLOPs (flop_windows.h).
#include "torchpilot/runtime/flops/flop_windows.h"

#include <algorithm>
#include <atomic>
#include <utility>

namespace torchpilot {

FlopWindowPlanner::FlopWindowPlanner(const FlopConfig& config)
    : config_(config), state_(config.skip_steps > 0 ? State::kSkipping : State::kCounting) {
  if (config_.count_steps < 1) config_.count_steps = 1;
}

bool FlopWindowPlanner::begin_step() { return state_ == State::kCounting; }

const StepFlops* FlopWindowPlanner::count_for(int64_t samples) const {
  for (const auto& [s, count] : cache_) {
    if (s == samples) return &count;
  }
  return nullptr;
}

void FlopWindowPlanner::store(int64_t samples, StepFlops count) {
  static std::atomic<uint64_t> next_id{1};  // unique across planners: sums key on it
  count.id = next_id.fetch_add(1, std::memory_order_relaxed);
  cache_.erase(std::remove_if(cache_.begin(), cache_.end(),
                              [&](const auto& e) { return e.first == samples; }),
               cache_.end());
  cache_.insert(cache_.begin(), {samples, std::move(count)});
  if (cache_.size() > kMaxCached) cache_.resize(kMaxCached);
}

const StepFlops* FlopWindowPlanner::end_step(int64_t samples, const StepFlops* counted) {
  ++steps_;
  ++since_window_;
  if (counted != nullptr && state_ == State::kCounting) {
    last_counted_ = *counted;
    // A window opened for a new sample count that meets an already counted one: nothing to do.
    if (window_target_ && samples != *window_target_ && window_.steps() == 0 &&
        count_for(samples) != nullptr) {
      window_target_.reset();
      state_ = State::kIdle;
      return &last_counted_;
    }
    if (window_.steps() > 0 && samples != window_samples_) window_.clear();  // shapes changed
    if (window_.steps() == 0) window_samples_ = samples;
    window_.add(*counted);
    if (window_.steps() >= config_.count_steps) {
      store(window_samples_, window_.mean());
      window_.clear();
      window_target_.reset();
      ++windows_;
      since_window_ = 0;
      state_ = State::kIdle;
    }
    return &last_counted_;
  }
  if (state_ == State::kSkipping) {
    if (steps_ >= config_.skip_steps) state_ = State::kCounting;
    return count_for(samples);
  }
  const StepFlops* known = count_for(samples);
  if (state_ == State::kIdle) {
    if (known == nullptr) {
      state_ = State::kCounting;  // a sample count without a count: count the next step
      window_target_ = samples;
    } else if (config_.recount_every_steps > 0 && since_window_ >= config_.recount_every_steps) {
      state_ = State::kCounting;
    }
  }
  return known;
}

void FlopWindowPlanner::start_counting() {
  window_.clear();
  window_target_.reset();
  state_ = State::kCounting;
}

void FlopWindowPlanner::recount() {
  cache_.clear();
  window_.clear();
  window_target_.reset();
  state_ = State::kCounting;
}

}  // namespace torchpilot
