#include "torchpilot/runtime/core/metrics.h"

#include <algorithm>
#include <cmath>

namespace torchpilot {

double fraction(Nanos part, Nanos whole) {
  if (whole <= 0) return 0.0;
  return std::clamp(static_cast<double>(part) / static_cast<double>(whole), 0.0, 1.0);
}

Nanos median(std::vector<Nanos> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  Nanos upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  Nanos lower = *std::max_element(values.begin(), values.begin() + mid);
  return lower + (upper - lower) / 2;
}

double relative_standard_error(const std::vector<Nanos>& values) {
  const size_t n = values.size();
  if (n < 2) return 0.0;
  double mean = 0;
  for (Nanos v : values) mean += static_cast<double>(v);
  mean /= static_cast<double>(n);
  if (mean <= 0) return 0.0;
  double var = 0;
  for (Nanos v : values) var += (static_cast<double>(v) - mean) * (static_cast<double>(v) - mean);
  var /= static_cast<double>(n - 1);
  return std::sqrt(var / static_cast<double>(n)) / mean;
}

namespace {
constexpr double kMinNs = 1000.0;  // bucket 0 holds everything up to 1 µs
constexpr double kGrowth = 1.04;
const double kLogGrowth = std::log(kGrowth);
}  // namespace

void DurationHistogram::add(Nanos value) {
  int bucket = 0;
  if (value > kMinNs) {
    bucket = 1 + static_cast<int>(std::log(static_cast<double>(value) / kMinNs) / kLogGrowth);
    bucket = std::min(bucket, kBuckets - 1);
  }
  ++buckets_[bucket];
  ++count_;
}

Nanos DurationHistogram::quantile(double q) const {
  if (count_ == 0) return 0;
  const int64_t rank = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(q * count_)));
  int64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += buckets_[b];
    if (seen >= rank) return static_cast<Nanos>(kMinNs * std::pow(kGrowth, b));
  }
  return static_cast<Nanos>(kMinNs * std::pow(kGrowth, kBuckets - 1));
}

void DurationHistogram::clear() {
  buckets_.fill(0);
  count_ = 0;
}

void EpochAccumulator::add(const StepRecord& r) {
  if (steps_ == 0) first_step_ = r.step;
  ++steps_;
  samples_ += r.samples;
  wall_ns_ += r.step_ns();
  data_wait_ns_ += r.data_wait_ns;
  own_ns_ += r.own_ns;
  for (int i = 0; i < kMaxPhases; ++i) {
    if (r.phase_ns[i] <= 0) continue;
    phase_ns_[i] += r.phase_ns[i];
    phase_times_[i].add(r.phase_ns[i]);
  }
  step_times_.add(r.step_ns());
  const Nanos compute = std::max<Nanos>(0, r.step_ns() - r.data_wait_ns);
  compute_times_.add(compute);
  compute_min_ns_ = steps_ == 1 ? compute : std::min(compute_min_ns_, compute);
}

EpochSummary EpochAccumulator::summarize(int64_t epoch,
                                         const std::vector<std::string>& phase_names) const {
  EpochSummary s;
  s.epoch = epoch;
  s.steps = steps_;
  s.first_step = first_step_;
  s.samples = samples_;
  s.wall_ns = wall_ns_;
  s.data_wait_ns = data_wait_ns_;
  s.data_wait_fraction = fraction(data_wait_ns_, wall_ns_);
  s.step_p50_ns = step_times_.quantile(0.5);
  s.step_p90_ns = step_times_.quantile(0.9);
  s.compute_p50_ns = compute_times_.quantile(0.5);
  s.compute_min_ns = compute_min_ns_;
  s.own_ns = own_ns_;
  s.cpu_ns = cpu_ns_;
  if (wall_ns_ > 0) {
    s.steps_per_s = steps_ * 1e9 / static_cast<double>(wall_ns_);
    s.samples_per_s = samples_ * 1e9 / static_cast<double>(wall_ns_);
  }
  for (size_t i = 0; i < phase_names.size() && i < kMaxPhases; ++i) {
    s.phases.push_back(
        {phase_names[i], phase_ns_[i], phase_times_[i].count(), phase_times_[i].quantile(0.5)});
  }
  return s;
}

void EpochAccumulator::clear() { *this = EpochAccumulator(); }

}  // namespace torchpilot
