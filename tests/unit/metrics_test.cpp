// Metrics: fraction, median, relative standard error, the duration histogram, epoch summaries,
// loader deltas.
#include "torchpilot/runtime/core/metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "epoch_checks.h"
#include "torchpilot/runtime/loader/loader_records.h"

namespace torchpilot {
namespace {

constexpr Nanos kUs = 1000;
constexpr Nanos kMs = 1000 * 1000;

TEST(FractionTest, PartOfWhole) {
  EXPECT_DOUBLE_EQ(fraction(25, 100), 0.25);
  EXPECT_DOUBLE_EQ(fraction(0, 100), 0.0);
  EXPECT_DOUBLE_EQ(fraction(100, 100), 1.0);
  EXPECT_DOUBLE_EQ(fraction(1, 3), 1.0 / 3.0);
}

TEST(FractionTest, ClampsAndZeroWhole) {
  EXPECT_DOUBLE_EQ(fraction(150, 100), 1.0);
  EXPECT_DOUBLE_EQ(fraction(-5, 100), 0.0);
  EXPECT_DOUBLE_EQ(fraction(5, 0), 0.0);
  EXPECT_DOUBLE_EQ(fraction(5, -10), 0.0);
  EXPECT_DOUBLE_EQ(fraction(0, 0), 0.0);
}

TEST(MedianTest, OddEvenEmpty) {
  EXPECT_EQ(median({}), 0);
  EXPECT_EQ(median({7}), 7);
  EXPECT_EQ(median({5, 1, 3}), 3);
  EXPECT_EQ(median({9, 1, 8, 2, 7}), 7);
  EXPECT_EQ(median({40, 10, 30, 20}), 25);  // mean of the two middle values
  EXPECT_EQ(median({1, 2}), 1);             // integer nanoseconds: rounds down
  EXPECT_EQ(median({3, 3, 3, 100}), 3);
}

TEST(MedianTest, NoOverflowNearInt64Max) {
  const Nanos big = std::numeric_limits<Nanos>::max();
  EXPECT_EQ(median({big - 3, big - 1}), big - 2);
}

TEST(MedianTest, MatchesSortedReference) {
  std::mt19937_64 rng(7);
  for (int n = 1; n < 40; ++n) {
    std::vector<Nanos> v(n);
    for (auto& x : v) x = static_cast<Nanos>(rng() % 1000000);
    std::vector<Nanos> s = v;
    std::sort(s.begin(), s.end());
    const Nanos expected = n % 2 ? s[n / 2] : s[n / 2 - 1] + (s[n / 2] - s[n / 2 - 1]) / 2;
    EXPECT_EQ(median(v), expected) << "n=" << n;
  }
}

TEST(RelativeStandardErrorTest, KnownValues) {
  // {10, 14}: mean 12, sample variance 8, standard error sqrt(8 / 2) = 2, relative 1/6.
  EXPECT_NEAR(relative_standard_error({10, 14}), 2.0 / 12.0, 1e-12);
  // {1..5}: mean 3, sample variance 2.5, standard error sqrt(2.5 / 5).
  EXPECT_NEAR(relative_standard_error({5, 1, 3, 2, 4}), std::sqrt(0.5) / 3.0, 1e-12);
  EXPECT_DOUBLE_EQ(relative_standard_error({10, 10, 10, 10, 10}), 0.0);
}

TEST(RelativeStandardErrorTest, FewerThanTwoOrZeroMean) {
  EXPECT_DOUBLE_EQ(relative_standard_error({}), 0.0);
  EXPECT_DOUBLE_EQ(relative_standard_error({1000}), 0.0);
  EXPECT_DOUBLE_EQ(relative_standard_error({0, 0, 0}), 0.0);
}

TEST(RelativeStandardErrorTest, ScaleInvariantAndShrinksWithN) {
  const std::vector<Nanos> v = {13, 17, 19, 23, 29, 31, 37};
  std::vector<Nanos> scaled;
  for (Nanos x : v) scaled.push_back(x * 1000);
  EXPECT_NEAR(relative_standard_error(v), relative_standard_error(scaled), 1e-12);
  EXPECT_GT(relative_standard_error(v), 0.0);
  // The same alternating pattern over 4x the steps: half the relative error (nearly: n - 1).
  std::vector<Nanos> few, many;
  for (int i = 0; i < 10; ++i) few.push_back(i % 2 ? 14 : 10);
  for (int i = 0; i < 40; ++i) many.push_back(i % 2 ? 14 : 10);
  const double ratio = relative_standard_error(many) / relative_standard_error(few);
  EXPECT_NEAR(ratio, 0.5 * std::sqrt(9.0 / 10.0) / std::sqrt(39.0 / 40.0), 1e-12);
}

// The q-quantile as DurationHistogram defines it: the ceil(q n)-th smallest value.
Nanos exact_quantile(std::vector<Nanos> sorted, double q) {
  const int64_t n = static_cast<int64_t>(sorted.size());
  const int64_t rank = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(q * n)));
  return sorted[rank - 1];
}

// The histogram reports the upper edge of the holding bucket: never below the exact value (up to
// the nanosecond the edge is truncated to), and less than one 4% bucket above it.
void expect_quantiles_within_bucket(const std::vector<Nanos>& values) {
  DurationHistogram h;
  for (Nanos v : values) h.add(v);
  ASSERT_EQ(h.count(), static_cast<int64_t>(values.size()));
  std::vector<Nanos> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  for (double q : {0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0}) {
    const Nanos exact = std::max<Nanos>(exact_quantile(sorted, q), kUs);
    const Nanos got = h.quantile(q);
    EXPECT_GE(got, exact - 1) << "q=" << q;
    EXPECT_LE(static_cast<double>(got), static_cast<double>(exact) * 1.04 + 1) << "q=" << q;
  }
}

TEST(DurationHistogramTest, Empty) {
  DurationHistogram h;
  EXPECT_EQ(h.count(), 0);
  EXPECT_EQ(h.quantile(0.5), 0);
}

TEST(DurationHistogramTest, SingleValue) {
  DurationHistogram h;
  h.add(5 * kMs);
  for (double q : {0.0, 0.5, 1.0}) {
    EXPECT_GE(h.quantile(q), 5 * kMs - 1);
    EXPECT_LE(h.quantile(q), 5 * kMs * 104 / 100);
  }
}

TEST(DurationHistogramTest, UniformMicrosecondsToTenMilliseconds) {
  std::vector<Nanos> values;
  for (Nanos us = 1; us <= 10000; ++us) values.push_back(us * kUs);
  expect_quantiles_within_bucket(values);
  DurationHistogram h;
  for (Nanos v : values) h.add(v);
  // The median of 1..10000 µs is 5000 µs: a true number, not just self-consistency.
  EXPECT_GE(h.quantile(0.5), 5000 * kUs - 1);
  EXPECT_LE(h.quantile(0.5), 5200 * kUs);
}

TEST(DurationHistogramTest, ExponentialSteps) {
  std::mt19937_64 rng(42);
  std::exponential_distribution<double> exp_ms(1.0 / 20.0);  // mean 20 ms
  std::vector<Nanos> values;
  for (int i = 0; i < 20000; ++i) values.push_back(static_cast<Nanos>(exp_ms(rng) * kMs) + 1);
  expect_quantiles_within_bucket(values);
}

TEST(DurationHistogramTest, LogUniformMicrosecondToHour) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> exponent(std::log(1e3), std::log(3.6e12));
  std::vector<Nanos> values;
  for (int i = 0; i < 20000; ++i) values.push_back(static_cast<Nanos>(std::exp(exponent(rng))));
  expect_quantiles_within_bucket(values);
}

TEST(DurationHistogramTest, BimodalSteps) {
  // 90% fast steps at 10 ms, 10% slow ones at 100 ms: p50 is fast, p95 slow.
  DurationHistogram h;
  for (int i = 0; i < 900; ++i) h.add(10 * kMs);
  for (int i = 0; i < 100; ++i) h.add(100 * kMs);
  EXPECT_GE(h.quantile(0.5), 10 * kMs - 1);
  EXPECT_LE(h.quantile(0.5), 10 * kMs * 104 / 100);
  EXPECT_GE(h.quantile(0.9), 10 * kMs - 1);
  EXPECT_LE(h.quantile(0.9), 10 * kMs * 104 / 100);
  EXPECT_GE(h.quantile(0.95), 100 * kMs - 1);
  EXPECT_LE(h.quantile(0.95), 100 * kMs * 104 / 100);
}

TEST(DurationHistogramTest, SubMicrosecondAndClear) {
  DurationHistogram h;
  h.add(0);
  h.add(10);
  h.add(999);
  EXPECT_LE(h.quantile(1.0), kUs);
  EXPECT_GT(h.quantile(1.0), 0);
  h.clear();
  EXPECT_EQ(h.count(), 0);
  EXPECT_EQ(h.quantile(0.5), 0);
  h.add(2 * kMs);
  EXPECT_GE(h.quantile(0.0), 2 * kMs - 1);
}

StepRecord make_step(int64_t step, Nanos begin, Nanos step_ns, Nanos wait_ns, int64_t samples,
                     Nanos phase0 = 0, Nanos phase1 = 0) {
  StepRecord r;
  r.step = step;
  r.step_in_epoch = step;
  r.begin_ns = begin;
  r.end_ns = begin + step_ns;
  r.data_wait_ns = wait_ns;
  r.samples = samples;
  r.phase_ns[0] = phase0;
  r.phase_ns[1] = phase1;
  return r;
}

TEST(EpochAccumulatorTest, SummaryMath) {
  EpochAccumulator acc;
  EXPECT_TRUE(acc.empty());
  // Steps 10..13: 100, 100, 200, 100 ms; waits 10, 0, 100, 10 ms; 32 samples each.
  const std::vector<Nanos> step_ms = {100, 100, 200, 100};
  const std::vector<Nanos> wait_ms = {10, 0, 100, 10};
  Nanos t = 5 * kMs;
  for (int i = 0; i < 4; ++i) {
    acc.add(make_step(10 + i, t, step_ms[i] * kMs, wait_ms[i] * kMs, 32, 50 * kMs, 30 * kMs));
    t += step_ms[i] * kMs;
  }
  EXPECT_FALSE(acc.empty());
  const EpochSummary s = acc.summarize(3, {"forward", "backward", "optimizer"});
  test::expect_totals(s, 3, 4, 10, 128, 500 * kMs, 120 * kMs);
  EXPECT_DOUBLE_EQ(s.data_wait_fraction, 120.0 / 500.0);
  EXPECT_DOUBLE_EQ(s.steps_per_s, 4 / 0.5);
  EXPECT_DOUBLE_EQ(s.samples_per_s, 128 / 0.5);
  // p50 = 2nd smallest (100 ms); p90 = 4th smallest (200 ms); both within a 4% bucket.
  EXPECT_GE(s.step_p50_ns, 100 * kMs - 1);
  EXPECT_LE(s.step_p50_ns, 104 * kMs);
  EXPECT_GE(s.step_p90_ns, 200 * kMs - 1);
  EXPECT_LE(s.step_p90_ns, 208 * kMs);
  ASSERT_EQ(s.phases.size(), 3u);
  EXPECT_EQ(s.phases[0].name, "forward");
  EXPECT_EQ(s.phases[0].ns, 200 * kMs);
  EXPECT_EQ(s.phases[1].name, "backward");
  EXPECT_EQ(s.phases[1].ns, 120 * kMs);
  EXPECT_EQ(s.phases[2].name, "optimizer");
  EXPECT_EQ(s.phases[2].ns, 0);
  // Each phase ran in all 4 steps (50 and 30 ms each); one that never ran has no median.
  EXPECT_EQ(s.phases[0].steps, 4);
  EXPECT_GE(s.phases[0].p50_ns, 48 * kMs);  // within a 4% bucket
  EXPECT_LE(s.phases[0].p50_ns, 52 * kMs);
  EXPECT_EQ(s.phases[1].steps, 4);
  EXPECT_EQ(s.phases[2].steps, 0);
  EXPECT_EQ(s.phases[2].p50_ns, 0);
  EXPECT_FALSE((s.sections.get<LoaderStats>() != nullptr));
}

TEST(EpochAccumulatorTest, NoSamplesNoPhaseNames) {
  EpochAccumulator acc;
  acc.add(make_step(0, 0, 40 * kMs, 0, 0, 7 * kMs));
  acc.add(make_step(1, 40 * kMs, 60 * kMs, 30 * kMs, 0));
  const EpochSummary s = acc.summarize(0, {});
  EXPECT_EQ(s.samples, 0);
  EXPECT_DOUBLE_EQ(s.samples_per_s, 0.0);
  EXPECT_DOUBLE_EQ(s.steps_per_s, 2 / 0.1);
  EXPECT_DOUBLE_EQ(s.data_wait_fraction, 0.3);
  EXPECT_TRUE(s.phases.empty());
}

TEST(EpochAccumulatorTest, EmptyAndClear) {
  EpochAccumulator acc;
  EpochSummary s = acc.summarize(0, {"a"});
  EXPECT_EQ(s.steps, 0);
  EXPECT_EQ(s.wall_ns, 0);
  EXPECT_DOUBLE_EQ(s.steps_per_s, 0.0);
  EXPECT_DOUBLE_EQ(s.data_wait_fraction, 0.0);
  EXPECT_EQ(s.step_p50_ns, 0);

  acc.add(make_step(4, 0, 10 * kMs, 5 * kMs, 8));
  acc.clear();
  EXPECT_TRUE(acc.empty());
  acc.add(make_step(9, 0, 20 * kMs, 0, 2));
  s = acc.summarize(1, {});
  EXPECT_EQ(s.first_step, 9);  // the first step after clear()
  EXPECT_EQ(s.steps, 1);
  EXPECT_EQ(s.samples, 2);
  EXPECT_EQ(s.data_wait_ns, 0);
  EXPECT_EQ(s.wall_ns, 20 * kMs);
  EXPECT_GE(s.step_p50_ns, 20 * kMs - 1);
  EXPECT_LE(s.step_p50_ns, 21 * kMs);
}

TEST(EpochAccumulatorTest, ManyStepsMedianAndFraction) {
  // 1000 steps alternating 10 and 30 ms with 5 ms waits on the slow ones.
  EpochAccumulator acc;
  Nanos t = 0, wall = 0, wait = 0;
  for (int i = 0; i < 1000; ++i) {
    const Nanos d = (i % 2 ? 30 : 10) * kMs;
    const Nanos w = (i % 2 ? 5 : 0) * kMs;
    acc.add(make_step(i, t, d, w, 16));
    t += d;
    wall += d;
    wait += w;
  }
  const EpochSummary s = acc.summarize(0, {});
  EXPECT_EQ(s.wall_ns, wall);
  EXPECT_DOUBLE_EQ(s.data_wait_fraction, static_cast<double>(wait) / wall);
  EXPECT_DOUBLE_EQ(s.samples_per_s, 16000 * 1e9 / wall);
  EXPECT_LE(s.step_p50_ns, 10 * kMs * 104 / 100);  // rank 500 of 1000 is a 10 ms step
  EXPECT_GE(s.step_p90_ns, 30 * kMs - 1);
}

TEST(EpochAccumulatorTest, ComputeMedianIsStepLessWaitRobustToStalls) {
  // 9 steps of 2 ms work after an 8 ms wait each, then one 400 ms stall (a window's end): the
  // median step without its wait is the 2 ms of work, where wall / steps - wait is far above it.
  EpochAccumulator acc;
  Nanos t = 0;
  for (int i = 0; i < 10; ++i) {
    const Nanos d = (i == 9 ? 400 : 10) * kMs;
    const Nanos w = (i == 9 ? 0 : 8) * kMs;
    acc.add(make_step(i, t, d, w, 1));
    t += d;
  }
  const EpochSummary s = acc.summarize(0, {});
  EXPECT_GE(s.compute_p50_ns, 2 * kMs - 1);
  EXPECT_LE(s.compute_p50_ns, 2 * kMs * 104 / 100);
  EXPECT_GE(s.step_p50_ns, 10 * kMs - 1);
  EXPECT_LE(s.step_p50_ns, 10 * kMs * 104 / 100);
}

TEST(EpochAccumulatorTest, ComputeMinIsTheShortestStepLessWait) {
  // Steps of 30 ms with no wait, one of 9 ms (the host ran ahead, unblocked) and one of 20 ms of
  // which 15 waited for data: the shortest own work is that step's 5 ms, exactly (no buckets).
  EpochAccumulator acc;
  Nanos t = 0;
  const Nanos steps[][2] = {{30, 0}, {9, 0}, {30, 0}, {20, 15}, {30, 0}};
  for (int i = 0; i < 5; ++i) {
    acc.add(make_step(i, t, steps[i][0] * kMs, steps[i][1] * kMs, 1));
    t += steps[i][0] * kMs;
  }
  EXPECT_EQ(acc.summarize(0, {}).compute_min_ns, 5 * kMs);
}

TEST(LoaderDeltaTest, DifferencesAndLaterSettings) {
  LoaderStats earlier;
  earlier.name = "tunable";
  earlier.settings.workers = 2;
  earlier.batches = 10;
  earlier.produce_count = 11;
  earlier.produce_ns = 300;
  earlier.blocked_count = 2;
  earlier.wait_ns = 100;
  LoaderStats later = earlier;
  later.settings.workers = 4;
  later.settings.prefetch = 8;
  later.max_workers = 16;
  later.pin_memory_available = true;
  later.batches = 30;
  later.produce_count = 33;
  later.produce_ns = 900;
  later.blocked_count = 5;
  later.wait_ns = 400;
  const LoaderStats d = loader_delta(later, earlier);
  EXPECT_EQ(d.name, "tunable");
  EXPECT_EQ(d.settings.workers, 4);
  EXPECT_EQ(d.settings.prefetch, 8);
  EXPECT_EQ(d.max_workers, 16);
  EXPECT_TRUE(d.pin_memory_available);
  EXPECT_EQ(d.batches, 20);
  EXPECT_EQ(d.produce_count, 22);
  EXPECT_EQ(d.produce_ns, 600);
  EXPECT_EQ(d.blocked_count, 3);
  EXPECT_EQ(d.wait_ns, 300);
}

}  // namespace
}  // namespace torchpilot
