// Config sections registered by their owners. A subsystem keeps its settings in its own folder:
// a struct with a section name and defaults, and one row per key, registered at static
// initialization. The YAML reader, the TORCHPILOT_* environment reader, validate(), config_keys()
// and config_values() then treat its keys as they treat the built-in ones, and code reads the
// values with Config::section<T>().
//
//   struct ToyConfig {
//     static constexpr const char* kSectionName = "toy";   // keys "toy.<field>"
//     double threshold = 0.1;
//   };
//   const bool registered = torchpilot::register_config_section<ToyConfig>(
//       {torchpilot::config_key<ToyConfig, &ToyConfig::threshold>("threshold", 0.0, 1.0)});
//   ... config.section<ToyConfig>().threshold
//
// Thread-safety: register during static initialization; reading is then thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "torchpilot/runtime/core/config.h"

namespace torchpilot {
namespace config_detail {

// One row per configuration key: how to parse it, its range, and where it goes. The YAML reader,
// the environment reader and config_keys() all walk the rows, so a key is declared once.
// kPath: a string the OS takes as a file's path; NUL and control bytes are refused (open(2) would
// cut the path at a NUL and use the rest silently).
enum class Type { kInt, kDouble, kBool, kString, kPath, kIntList };

struct Value {
  int64_t i = 0;
  double d = 0;
  bool b = false;
  std::string s;
  std::vector<int64_t> list;
};

struct KeySpec {
  std::string key;  // "section.name"
  Type type;
  double min;  // numeric range (ints, doubles, list elements); strings: 1 = must not be empty
  double max;
  std::vector<std::string> choices;   // strings: allowed values; empty = any
  std::string (*get)(const Config&);  // the value as text, so code-built configs are checked too
  void (*set)(Config&, const Value&);
};

// Values as text, as config_values() writes them (lists comma-separated).
std::string text(double v);
std::string text(bool v);
std::string text(int64_t v);
std::string text(const std::string& v);
std::string text(const std::vector<int>& v);

// A field's key type, its value as text and its assignment from a parsed value, by its C++ type
// (numbers, bool, string, list of ints): one definition for the built-in rows and config_key.
template <typename V>
constexpr Type type_of() {
  if constexpr (std::is_same_v<V, bool>) {
    return Type::kBool;
  } else if constexpr (std::is_integral_v<V>) {
    return Type::kInt;
  } else if constexpr (std::is_floating_point_v<V>) {
    return Type::kDouble;
  } else if constexpr (std::is_same_v<V, std::string>) {
    return Type::kString;
  } else {
    static_assert(std::is_same_v<V, std::vector<int>>, "a key is a number, bool, string or list");
    return Type::kIntList;
  }
}
template <typename V>
std::string value_text(const V& v) {
  if constexpr (std::is_integral_v<V> && !std::is_same_v<V, bool>) {
    return text(static_cast<int64_t>(v));
  } else {
    return text(v);
  }
}
template <typename V>
void assign(V& field, const Value& v) {
  if constexpr (std::is_same_v<V, bool>) {
    field = v.b;
  } else if constexpr (std::is_integral_v<V>) {
    field = static_cast<V>(v.i);
  } else if constexpr (std::is_floating_point_v<V>) {
    field = v.d;
  } else if constexpr (std::is_same_v<V, std::string>) {
    field = v.s;
  } else {
    field.assign(v.list.begin(), v.list.end());
  }
}

void register_rows(const char* section, std::vector<KeySpec> rows);

}  // namespace config_detail

// A key of section S for its field F; the key is "<S::kSectionName>.<field>". Numbers take a
// range [lo, hi]; strings may list their allowed values.
template <typename S, auto F>
config_detail::KeySpec config_key(const std::string& field, double lo = 0, double hi = 0,
                                  std::vector<std::string> choices = {}) {
  using V = std::remove_cv_t<std::remove_reference_t<decltype(std::declval<S&>().*F)>>;
  return {std::string(S::kSectionName) + "." + field,
          config_detail::type_of<V>(),
          lo,
          hi,
          std::move(choices),
          [](const Config& c) { return config_detail::value_text(c.section<S>().*F); },
          [](Config& c, const config_detail::Value& v) {
            config_detail::assign(c.section<S>().*F, v);
          }};
}

// Registers section S with its keys (config_key rows). A key that exists already is left out.
// Returns true, for use as a static initializer.
template <typename S>
bool register_config_section(std::vector<config_detail::KeySpec> keys) {
  config_detail::register_rows(S::kSectionName, std::move(keys));
  return true;
}

}  // namespace torchpilot
