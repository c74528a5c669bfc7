#include "torchpilot/runtime/config.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

extern char** environ;

namespace torchpilot {
namespace {

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

std::string text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
std::string text(bool v) { return v ? "true" : "false"; }
std::string text(const std::vector<int>& list) {
  std::string out;
  for (int v : list) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out;
}

// Rows for plain fields: TP_INT(field.path, min, max) etc. The key is the field's path spelled
// out (#field), so a row cannot give a key a name other than the field it sets.
#define TP_INT(field, lo, hi)                                                          \
  {                                                                                    \
#field, Type::kInt, lo, hi, {},                                                      \
        [](const Config& c) -> std::string { return std::to_string(c.field); },          \
        [](Config& c, const Value& v) { c.field = static_cast<decltype(c.field)>(v.i); } \
  }
#define TP_DOUBLE(field, lo, hi)                                                                 \
  {                                                                                              \
#field, Type::kDouble, lo, hi,                                                               \
        {}, [](const Config& c)                                                                  \
                 -> std::string { return text(c.field); }, [](Config & c,                        \
                                                              const Value& v) { c.field = v.d; } \
  }
#define TP_BOOL(field)                                                                           \
  {                                                                                              \
#field, Type::kBool, 0, 0,                                                                   \
        {}, [](const Config& c)                                                                  \
                 -> std::string { return text(c.field); }, [](Config & c,                        \
                                                              const Value& v) { c.field = v.b; } \
  }
#define TP_STRING(field)                                                                   \
  {                                                                                        \
#field, Type::kString, 0, 0,                                                           \
        {}, [](const Config& c)                                                            \
                 -> std::string { return c.field; }, [](Config & c,                        \
                                                        const Value& v) { c.field = v.s; } \
  }

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> table = {
      {"mode",
       Type::kString,
       0,
       0,
       {"off", "advise", "autotune"},
       [](const Config& c) -> std::string { return to_string(c.mode); },
       [](Config& c, const Value& v) {
         c.mode = v.s == "off" ? Mode::kOff : v.s == "advise" ? Mode::kAdvise : Mode::kAutotune;
       }},
      {"log.level",
       Type::kString,
       0,
       0,
       {"trace", "debug", "info", "warn", "error", "off"},
       [](const Config& c) -> std::string { return c.log.level; },
       [](Config& c, const Value& v) { c.log.level = v.s; }},
      TP_STRING(log.json_path),
      TP_INT(records.step_history, 16, 1 << 24),
      TP_DOUBLE(advisors.data_starvation.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.data_starvation.high_severity, 0.0, 1.0),
      TP_DOUBLE(advisors.busy_inefficient.utilization, 0.0, 1.0),
      TP_DOUBLE(advisors.busy_inefficient.sm_efficiency, 0.0, 1.0),
      TP_DOUBLE(advisors.host_sync.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.pageable_copies.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.launch_bound.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.precision.fp32_matmul_threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.attention.unfused_threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.low_mfu.threshold, 0.0, 1.0),
      TP_INT(autotune.warmup_steps, 0, 1e9),
      TP_DOUBLE(autotune.warmup_seconds, 0.0, 86400.0),
      TP_INT(autotune.settle_steps, 0, 10000),
      TP_INT(autotune.measure_steps, 3, 10000),
      TP_DOUBLE(autotune.min_window_ms, 0.0, 600000.0),
      TP_DOUBLE(autotune.noise_margin, 0.0, 0.5),
      TP_INT(autotune.max_workers, 0, 1024),
      {"autotune.prefetch_choices",
       Type::kIntList,
       1,
       64,
       {},
       [](const Config& c) -> std::string { return text(c.autotune.prefetch_choices); },
       [](Config& c, const Value& v) {
         c.autotune.prefetch_choices.assign(v.list.begin(), v.list.end());
       }},
      TP_BOOL(autotune.tune_pin_memory),
      TP_BOOL(autotune.tune_device_prefetch),
      TP_BOOL(gpu.enabled),
      TP_INT(gpu.device, 0, 1023),
      TP_BOOL(gpu.pm_sampling),
      TP_DOUBLE(gpu.pm_interval_ms, 0.1, 1000.0),
      TP_BOOL(gpu.nvml),
      TP_DOUBLE(gpu.nvml_interval_ms, 10.0, 60000.0),
      TP_BOOL(gpu.nvtx),
      TP_BOOL(gpu.activity),
      TP_INT(gpu.trace_first_step, 0, 1e9),
      TP_INT(gpu.trace_steps, 1, 100000),
      TP_INT(gpu.trace_every_epochs, 0, 1000000),
      TP_DOUBLE(gpu.trace_anomaly_factor, 0.0, 1000.0),
      TP_INT(gpu.trace_buffer_mb, 1, 4096),
      TP_STRING(gpu.cupti_path),
      TP_DOUBLE(flops.peak_tflops, 0.0, 1e6),
      TP_INT(flops.skip_steps, 0, 1000000),
      TP_INT(flops.count_steps, 1, 10000),
      TP_INT(flops.recount_every_steps, 0, 1e9),
      TP_BOOL(flops.allow_tf32),
  };
  return table;
}

#undef TP_INT
#undef TP_DOUBLE
#undef TP_BOOL
#undef TP_STRING

const KeySpec* find_key(const std::string& key) {
  for (const auto& spec : schema()) {
    if (key == spec.key) return &spec;
  }
  return nullptr;
}

std::string describe_range(const KeySpec& spec) {
  std::ostringstream out;
  out << "[" << spec.min << ", " << spec.max << "]";
  return out.str();
}

// Parses one scalar's text by the key's type; `fail` reports the reason.
template <typename Fail>
int64_t parse_int(const std::string& text, const KeySpec& spec, Fail fail) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    fail("expected an integer, got '" + text + "'");
  if (v < spec.min || v > spec.max) {
    fail("value " + text + " is out of range " + describe_range(spec));
  }
  return v;
}

template <typename Fail>
Value parse_scalar(const std::string& text, const KeySpec& spec, Fail fail) {
  Value v;
  switch (spec.type) {
    case Type::kInt:
      v.i = parse_int(text, spec, fail);
      break;
    case Type::kDouble: {
      errno = 0;
      char* end = nullptr;
      v.d = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v.d)) {
        fail("expected a number, got '" + text + "'");
      }
      if (v.d < spec.min || v.d > spec.max) {
        fail("value " + text + " is out of range " + describe_range(spec));
      }
      break;
    }
    case Type::kBool: {
      std::string t;
      for (char ch : text) t += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (t == "true" || t == "1" || t == "yes" || t == "on") {
        v.b = true;
      } else if (t == "false" || t == "0" || t == "no" || t == "off") {
        v.b = false;
      } else {
        fail("expected true or false, got '" + text + "'");
      }
      break;
    }
    case Type::kString:
      if (!spec.choices.empty()) {
        bool ok = false;
        std::string all;
        for (const auto& c : spec.choices) {
          ok = ok || c == text;
          all += (all.empty() ? "" : " | ") + c;
        }
        if (!ok) fail("expected one of " + all + ", got '" + text + "'");
      }
      v.s = text;
      break;
    case Type::kIntList: {
      std::stringstream in(text);
      std::string item;
      while (std::getline(in, item, ',')) v.list.push_back(parse_int(item, spec, fail));
      if (v.list.empty()) fail("expected a non-empty list of integers");
      break;
    }
  }
  return v;
}

// Walks a YAML mapping; every leaf must be a known key.
void apply_yaml_node(Config& config, const YAML::Node& node, const std::string& prefix,
                     const std::string& source) {
  if (!node.IsMap()) {
    throw ConfigError(source, prefix.empty() ? "<root>" : prefix, "expected a mapping");
  }
  for (const auto& item : node) {
    const std::string name = item.first.as<std::string>();
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    const YAML::Node& value = item.second;
    const KeySpec* spec = find_key(key);
    // The key's line: a block mapping or list as the value starts on the line after it.
    const std::string where =
        source + ":" + std::to_string(item.first.Mark().line + 1);  // yaml-cpp lines are 0-based
    auto fail = [&](const std::string& reason) { throw ConfigError(where, key, reason); };
    if (spec == nullptr) {
      if (value.IsMap()) {
        // A section: known if some key starts with it.
        bool known_section = false;
        for (const auto& s : schema()) {
          known_section = known_section || std::string(s.key).rfind(key + ".", 0) == 0;
        }
        if (!known_section) fail("unknown key");
        apply_yaml_node(config, value, key, source);
        continue;
      }
      fail("unknown key");
    }
    if (spec->type == Type::kIntList) {
      if (!value.IsSequence()) fail("expected a list of integers");
      std::string joined;
      for (const auto& e : value) {
        if (!e.IsScalar()) fail("expected a list of integers");
        joined += (joined.empty() ? "" : ",") + e.Scalar();
      }
      spec->set(config, parse_scalar(joined, *spec, fail));
      continue;
    }
    if (!value.IsScalar()) fail("expected a single value");
    spec->set(config, parse_scalar(value.Scalar(), *spec, fail));
  }
}

// Cross-key rules that no single key can check.
void check_cross_keys(const Config& c, const std::string& source) {
  if (c.advisors.data_starvation.high_severity < c.advisors.data_starvation.threshold) {
    throw ConfigError(source, "advisors.data_starvation.high_severity",
                      "must not be below advisors.data_starvation.threshold");
  }
}

std::string env_name(const std::string& key) {
  std::string name = "TORCHPILOT_";
  for (char ch : key) name += ch == '.' ? '_' : static_cast<char>(std::toupper(ch));
  return name;
}

const char* const kConfigPathVariable = "TORCHPILOT_CONFIG";

}  // namespace

const char* to_string(Mode mode) {
  switch (mode) {
    case Mode::kOff:
      return "off";
    case Mode::kAdvise:
      return "advise";
    case Mode::kAutotune:
      return "autotune";
  }
  return "?";
}

ConfigError::ConfigError(std::string source, std::string key, std::string reason)
    : std::runtime_error("torchpilot config error in " + source + ": key '" + key + "': " + reason),
      source_(std::move(source)),
      key_(std::move(key)),
      reason_(std::move(reason)) {}

Config Config::from_yaml_string(const std::string& text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(origin + ":" + std::to_string(e.mark.line + 1), "<syntax>", e.msg);
  }
  Config config;
  if (root.IsNull()) return config;  // an empty file means defaults
  apply_yaml_node(config, root, "", origin);
  check_cross_keys(config, origin);
  return config;
}

Config Config::from_yaml_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path, "<file>", "cannot open the file");
  std::stringstream text;
  text << in.rdbuf();
  Config config = from_yaml_string(text.str(), path);
  apply_env_overrides(config, process_environment());
  return config;
}

Config Config::load() {
  const char* path = std::getenv(kConfigPathVariable);
  if (path != nullptr && *path != '\0') return from_yaml_file(path);
  Config config;
  apply_env_overrides(config, process_environment());
  return config;
}

Environment process_environment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string::npos) env.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

void apply_env_overrides(Config& config, const Environment& env) {
  for (const auto& [name, text] : env) {
    if (name.rfind("TORCHPILOT_", 0) != 0 || name == kConfigPathVariable) continue;
    const KeySpec* spec = nullptr;
    for (const auto& s : schema()) {
      if (env_name(s.key) == name) spec = &s;
    }
    if (spec == nullptr) throw ConfigError("environment variable " + name, name, "unknown key");
    auto fail = [&](const std::string& reason) {
      throw ConfigError("environment variable " + name, spec->key, reason);
    };
    spec->set(config, parse_scalar(text, *spec, fail));
  }
  check_cross_keys(config, "environment");
}

void validate(const Config& config) {
  for (const auto& spec : schema()) {
    auto fail = [&](const std::string& reason) { throw ConfigError("Config", spec.key, reason); };
    parse_scalar(spec.get(config), spec, fail);
  }
  check_cross_keys(config, "Config");
}

std::vector<std::pair<std::string, std::string>> config_values(const Config& config) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& spec : schema()) out.emplace_back(spec.key, spec.get(config));
  return out;
}

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  for (const auto& s : schema()) keys.emplace_back(s.key);
  return keys;
}

}  // namespace torchpilot
