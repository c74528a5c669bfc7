// The configuration schema's row type and table, shared by config_schema.cpp (the table) and
// config.cpp (loading and validation).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/config.h"

namespace torchpilot::config_detail {

// One row per configuration key: how to parse it, its range, and where it goes. The YAML reader,
// the environment reader and config_keys() all walk this table, so a key is declared once.
enum class Type { kInt, kDouble, kBool, kString, kIntList };

struct Value {
  int64_t i = 0;
  double d = 0;
  bool b = false;
  std::string s;
  std::vector<int64_t> list;
};

struct KeySpec {
  const char* key;
  Type type;
  double min;  // numeric range (ints, doubles, list elements)
  double max;
  std::vector<std::string> choices;   // strings: allowed values; empty = any
  std::string (*get)(const Config&);  // the value as text, so code-built configs are checked too
  void (*set)(Config&, const Value&);
};

// The table: one row per key, in the order config_keys() lists them.
const std::vector<KeySpec>& schema();
// The row of `key`, or nullptr when no key has that name.
const KeySpec* find_key(const std::string& key);

}  // namespace torchpilot::config_detail
