// The configuration schema's row type and table, shared by config_schema.cpp (the table) and
// config.cpp (loading and validation).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/config_section.h"

namespace torchpilot::config_detail {

// The table: one row per key, in the order config_keys() lists them: the built-in keys, then the
// registered sections' (config_section.h).
const std::vector<KeySpec>& schema();
// The row of `key`, or nullptr when no key has that name.
const KeySpec* find_key(const std::string& key);

}  // namespace torchpilot::config_detail
