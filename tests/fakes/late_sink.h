// A recording sink that reads late step records only while `wants` (the advisory log reads none).
#pragma once

#include "torchpilot/runtime/core/sink.h"

namespace torchpilot {
namespace test {

struct LateSink final : RecordingSink {
  explicit LateSink(bool w = false) : wants(w) {}
  bool wants;
  bool wants_late_steps() const override { return wants; }
};

}  // namespace test
}  // namespace torchpilot
