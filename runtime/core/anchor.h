// A subsystem's registration at static initialization, and the anchor that keeps its object in a
// program linking the static library (the link line names it:
// "LINKER:--undefined=torchpilot_<name>_anchor", CMakeLists.txt). Used at namespace scope, followed
// by the registering block:
//   TORCHPILOT_REGISTRATION(stalls) { register_default_collector("stalls", -100, &make); }
// defines extern "C" int torchpilot_stalls_anchor() and runs the block once, when the object's
// statics are initialized.
#pragma once

#define TORCHPILOT_REGISTRATION(name)                                                          \
  static void torchpilot_register_##name();                                                    \
  static const bool torchpilot_registered_##name = (torchpilot_register_##name(), true);       \
  extern "C" int torchpilot_##name##_anchor() { return torchpilot_registered_##name ? 1 : 0; } \
  static void torchpilot_register_##name()
