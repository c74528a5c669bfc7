// A configuration whose auto-tuner decides within a few dozen steps: windows in steps only
// (settle 1, measure 3) and a warm-up budget of 60 steps, for the tests that run a search.
#pragma once

#include "torchpilot/runtime/core/config.h"

namespace torchpilot {
namespace test {

inline Config short_autotune_config(Mode mode = Mode::kAutotune) {
  Config c;
  c.mode = mode;
  c.autotune.settle_steps = 1;
  c.autotune.measure_steps = 3;
  c.autotune.min_window_ms = 0;
  c.autotune.warmup_seconds = 0;
  c.autotune.warmup_steps = 60;
  return c;
}

}  // namespace test
}  // namespace torchpilot
