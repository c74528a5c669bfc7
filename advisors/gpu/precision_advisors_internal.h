// A helper shared by the precision advisors (precision_advisors.cpp) and the low-MFU advisor
// (mfu_advisor.cpp).
#pragma once

#include <cstddef>

#include "torchpilot/runtime/flops/flop_records.h"

namespace torchpilot::precision_detail {

constexpr size_t P(MathPrecision p) { return static_cast<size_t>(p); }

}  // namespace torchpilot::precision_detail
