// Checks of an epoch summary's totals that several tests share.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>

#include "torchpilot/runtime/core/records.h"

namespace torchpilot {
namespace test {

// An epoch's number, steps, first step, samples, wall time and data wait, as `s` states them.
inline void expect_totals(const EpochSummary& s, int64_t epoch, int64_t steps, int64_t first_step,
                          int64_t samples, Nanos wall_ns, Nanos data_wait_ns) {
  EXPECT_EQ(s.epoch, epoch);
  EXPECT_EQ(s.steps, steps);
  EXPECT_EQ(s.first_step, first_step);
  EXPECT_EQ(s.samples, samples);
  EXPECT_EQ(s.wall_ns, wall_ns);
  EXPECT_EQ(s.data_wait_ns, data_wait_ns);
}

}  // namespace test
}  // namespace torchpilot
