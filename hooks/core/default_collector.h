// A default collector of hooks/ (one per Pilot, runtime/core/collector.h), registered at static
// initialization, and the link anchor that keeps its translation unit in programs that link the
// static library (the anchor is named on the link line: CMake, torchpilot). At global scope:
//   TORCHPILOT_DEFAULT_COLLECTOR(torchpilot::make_memory_collector, torchpilot_memory_anchor)
#pragma once

#include "torchpilot/runtime/core/collector.h"

#define TORCHPILOT_DEFAULT_COLLECTOR(factory, anchor)   \
  static const bool anchor##_registered = [] {          \
    ::torchpilot::register_default_collector(&factory); \
    return true;                                        \
  }();                                                  \
  extern "C" int anchor() { return anchor##_registered ? 1 : 0; }
