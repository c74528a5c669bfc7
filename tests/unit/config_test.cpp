// Config: defaults, configs/default.yaml, YAML errors (key, file and line), environment overrides.
#include "torchpilot/runtime/core/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fakes/scoped_env.h"
#include "temp_dir.h"
#include "torchpilot/runtime/core/pilot.h"

namespace torchpilot {
namespace {

namespace fs = std::filesystem;

const std::string kDefaultYaml = std::string(TORCHPILOT_SOURCE_DIR) + "/configs/default.yaml";

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void expect_config_eq(const Config& a, const Config& b) {
  EXPECT_EQ(config_values(a), config_values(b));
}

// Runs `fn`, which must throw ConfigError, and returns the error.
ConfigError expect_config_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return ConfigError("", "", "");
}

ConfigError yaml_error(const std::string& text, const std::string& origin = "test.yaml") {
  return expect_config_error([&] { Config::from_yaml_string(text, origin); });
}

ConfigError env_error(const Environment& env) {
  Config config;
  return expect_config_error([&] { apply_env_overrides(config, env); });
}

// Leaf and section paths ("autotune", "autotune.warmup_steps") of a block-style YAML file.
std::set<std::string> yaml_key_paths(const std::string& text) {
  std::set<std::string> paths;
  std::vector<std::pair<size_t, std::string>> stack;  // (indent, name)
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos || line[indent] == '#') continue;
    const size_t colon = line.find(':', indent);
    if (colon == std::string::npos) continue;
    const std::string name = line.substr(indent, colon - indent);
    while (!stack.empty() && stack.back().first >= indent) stack.pop_back();
    std::string path;
    for (const auto& [i, n] : stack) path += n + ".";
    path += name;
    paths.insert(path);
    stack.emplace_back(indent, name);
  }
  return paths;
}

using test::ScopedEnv;

using torchpilot_test::TempDir;

TEST(ConfigTest, Defaults) {
  const Config c;
  EXPECT_EQ(c.mode, Mode::kAdvise);
  EXPECT_EQ(c.log.level, "info");
  EXPECT_EQ(c.log.json_path, "");
  EXPECT_EQ(c.records.step_history, 4096);
  EXPECT_DOUBLE_EQ(c.advisors.data_starvation.threshold, 0.05);
  EXPECT_DOUBLE_EQ(c.advisors.data_starvation.high_severity, 0.25);
  EXPECT_EQ(c.autotune.warmup_steps, 200);
  EXPECT_DOUBLE_EQ(c.autotune.warmup_seconds, 10);
  EXPECT_EQ(c.autotune.settle_steps, 3);
  EXPECT_EQ(c.autotune.measure_steps, 10);
  EXPECT_DOUBLE_EQ(c.autotune.min_window_ms, 250);
  EXPECT_DOUBLE_EQ(c.autotune.noise_margin, 0.03);
  EXPECT_EQ(c.autotune.max_workers, 0);
  EXPECT_EQ(c.autotune.prefetch_choices, (std::vector<int>{1, 2, 4, 8}));
  EXPECT_TRUE(c.autotune.tune_pin_memory);
  EXPECT_TRUE(c.autotune.tune_device_prefetch);
  EXPECT_EQ(c.autotune.confirm_settings, 3);
  EXPECT_EQ(c.autotune.confirm_rounds, 2);
  EXPECT_STREQ(to_string(Mode::kOff), "off");
  EXPECT_STREQ(to_string(Mode::kAdvise), "advise");
  EXPECT_STREQ(to_string(Mode::kAutotune), "autotune");
}

TEST(ConfigTest, EmptyYamlMeansDefaults) {
  expect_config_eq(Config::from_yaml_string(""), Config());
  expect_config_eq(Config::from_yaml_string("# only a comment\n"), Config());
}

TEST(ConfigTest, DefaultYamlEqualsDefaultConfig) {
  ASSERT_TRUE(fs::exists(kDefaultYaml)) << kDefaultYaml;
  // from_yaml_string: the process environment must not leak into the comparison.
  const Config from_file = Config::from_yaml_string(read_file(kDefaultYaml), kDefaultYaml);
  expect_config_eq(from_file, Config());
}

TEST(ConfigTest, EveryKeyIsDocumentedInDefaultYaml) {
  ASSERT_TRUE(fs::exists(kDefaultYaml)) << kDefaultYaml;
  const std::set<std::string> paths = yaml_key_paths(read_file(kDefaultYaml));
  const std::vector<std::string> keys = config_keys();
  ASSERT_FALSE(keys.empty());
  for (const auto& key : keys) EXPECT_EQ(paths.count(key), 1u) << key << " missing in default.yaml";
  // And the file has no leaf that is not a key (sections are prefixes of keys).
  for (const auto& path : paths) {
    bool known = false;
    for (const auto& key : keys) known = known || key == path || key.rfind(path + ".", 0) == 0;
    EXPECT_TRUE(known) << path << " in default.yaml is not a config key";
  }
}

TEST(ConfigTest, EveryKeyIsListedInConfigurationDoc) {
  const std::string doc = read_file(std::string(TORCHPILOT_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_FALSE(doc.empty());
  for (const auto& key : config_keys()) {
    EXPECT_NE(doc.find("| `" + key + "` |"), std::string::npos) << key << " missing in the doc";
  }
}

TEST(ConfigTest, ConfigKeysAreUniqueAndDotted) {
  const std::vector<std::string> keys = config_keys();
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), keys.size());
  EXPECT_EQ(keys.front(), "mode");
  for (const char* k : {"records.step_history", "advisors.data_starvation.threshold",
                        "autotune.prefetch_choices", "log.json_path"}) {
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
  }
}

// YAML text setting one dotted key: "a.b.c" and "v" give "a:\n  b:\n    c: v\n".
std::string yaml_for_key(const std::string& key, const std::string& value) {
  std::string out, indent;
  size_t begin = 0;
  for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', begin)) {
    out += indent + key.substr(begin, dot - begin) + ":\n";
    indent += "  ";
    begin = dot + 1;
  }
  return out + indent + key.substr(begin) + ": " + value + "\n";
}

// The schema table is consistent: each key reads and writes its own field, and no other key's.
// For every key, a YAML file setting only that key to a valid value other than its default changes
// config_values() at exactly that key; the key's TORCHPILOT_* variable does the same.
TEST(ConfigTest, EveryKeySetsExactlyItsOwnValue) {
  const auto defaults = config_values(Config());
  // Candidate values, tried in order; a key takes the first one that loads and differs from its
  // default (ints reject fractions, booleans and numbers reject words, and so on).
  const std::vector<std::string> candidates = {
      "0.125", "17", "1", "0", "[3]", "debug", "off", "sm", "/tmp/torchpilot-key.jsonl", "5000"};
  for (const auto& key : config_keys()) {
    SCOPED_TRACE(key);
    bool found = false;
    for (const auto& value : candidates) {
      Config c;
      try {
        c = Config::from_yaml_string(yaml_for_key(key, value));
      } catch (const ConfigError&) {
        continue;  // not a valid value of this key
      }
      const auto values = config_values(c);
      ASSERT_EQ(values.size(), defaults.size());
      std::vector<std::string> changed;
      for (size_t i = 0; i < values.size(); ++i) {
        EXPECT_EQ(values[i].first, defaults[i].first);
        if (values[i].second != defaults[i].second) changed.push_back(values[i].first);
      }
      if (changed.empty()) continue;  // the default itself
      EXPECT_EQ(changed, std::vector<std::string>{key}) << "value " << value;
      // The environment variable sets the same field.
      std::string name = "TORCHPILOT_";
      for (char ch : key) name += ch == '.' ? '_' : static_cast<char>(std::toupper(ch));
      Config from_env;
      apply_env_overrides(from_env, {{name, value == "[3]" ? "3" : value}});
      expect_config_eq(from_env, c);
      found = true;
      break;
    }
    EXPECT_TRUE(found) << "no candidate value loads and changes " << key;
  }
}

TEST(ConfigTest, ParsesEveryKey) {
  const Config c = Config::from_yaml_string(R"(
mode: autotune
log:
  level: debug
  json_path: /tmp/records.jsonl
records:
  step_history: 64
advisors:
  data_starvation:
    threshold: 0.1
    high_severity: 0.4
autotune:
  warmup_steps: 120
  settle_steps: 2
  measure_steps: 5
  noise_margin: 0.05
  max_workers: 6
  prefetch_choices: [2, 16]
  tune_pin_memory: false
  tune_device_prefetch: no
  confirm_settings: 4
  confirm_rounds: 0
)");
  EXPECT_EQ(c.mode, Mode::kAutotune);
  EXPECT_EQ(c.log.level, "debug");
  EXPECT_EQ(c.log.json_path, "/tmp/records.jsonl");
  EXPECT_EQ(c.records.step_history, 64);
  EXPECT_DOUBLE_EQ(c.advisors.data_starvation.threshold, 0.1);
  EXPECT_DOUBLE_EQ(c.advisors.data_starvation.high_severity, 0.4);
  EXPECT_EQ(c.autotune.warmup_steps, 120);
  EXPECT_EQ(c.autotune.settle_steps, 2);
  EXPECT_EQ(c.autotune.measure_steps, 5);
  EXPECT_DOUBLE_EQ(c.autotune.noise_margin, 0.05);
  EXPECT_EQ(c.autotune.max_workers, 6);
  EXPECT_EQ(c.autotune.prefetch_choices, (std::vector<int>{2, 16}));
  EXPECT_FALSE(c.autotune.tune_pin_memory);
  EXPECT_FALSE(c.autotune.tune_device_prefetch);
  EXPECT_EQ(c.autotune.confirm_settings, 4);
  EXPECT_EQ(c.autotune.confirm_rounds, 0);
}

TEST(ConfigTest, PartialFileKeepsOtherDefaults) {
  const Config c = Config::from_yaml_string("autotune:\n  settle_steps: 9\n");
  Config expected;
  expected.autotune.settle_steps = 9;
  expect_config_eq(c, expected);
}

TEST(ConfigTest, UnknownTopLevelKey) {
  const ConfigError e = yaml_error("mode: advise\nbogus: 1\n", "my.yaml");
  EXPECT_EQ(e.key(), "bogus");
  EXPECT_EQ(e.source(), "my.yaml:2");
  EXPECT_NE(e.reason().find("unknown"), std::string::npos) << e.reason();
  const std::string what = e.what();
  EXPECT_NE(what.find("my.yaml:2"), std::string::npos) << what;
  EXPECT_NE(what.find("bogus"), std::string::npos) << what;
}

TEST(ConfigTest, UnknownNestedKey) {
  const ConfigError e =
      yaml_error("mode: advise\nautotune:\n  warmup_steps: 10\n  warmup_stpes: 3\n", "my.yaml");
  EXPECT_EQ(e.key(), "autotune.warmup_stpes");
  EXPECT_EQ(e.source(), "my.yaml:4");
}

TEST(ConfigTest, UnknownSectionReportsItsOwnLine) {
  const ConfigError e = yaml_error("mode: advise\nextras:\n  a: 1\n", "my.yaml");
  EXPECT_EQ(e.key(), "extras");
  EXPECT_EQ(e.source(), "my.yaml:2");
  // A known key used as a section.
  const ConfigError e2 = yaml_error("log:\n  level:\n    nested: 1\n", "my.yaml");
  EXPECT_EQ(e2.key(), "log.level");
  EXPECT_EQ(e2.source(), "my.yaml:2");
}

TEST(ConfigTest, UnknownKeyInFileNamesFileAndLine) {
  TempDir dir;
  const std::string path =
      dir.write("bad.yaml", "# comment\nautotune:\n  settle_steps: 2\n  surprise: true\n");
  const ConfigError e = expect_config_error([&] { Config::from_yaml_file(path); });
  EXPECT_EQ(e.key(), "autotune.surprise");
  EXPECT_NE(e.source().find("bad.yaml"), std::string::npos) << e.source();
  EXPECT_EQ(e.source(), path + ":4");
}

// A YAML text, the key its error must name, and (where given) a part of the reason and the
// source the error must state.
struct BadYaml {
  const char* yaml;
  const char* key;
  const char* in_reason = "";
  const char* source = "";
};

// Each YAML text is refused with its error saying what the row says.
void expect_errors(const std::vector<BadYaml>& rows) {
  for (const BadYaml& row : rows) {
    SCOPED_TRACE(row.yaml);
    const ConfigError e = yaml_error(row.yaml);
    EXPECT_EQ(e.key(), row.key);
    if (*row.in_reason != '\0') {
      EXPECT_NE(e.reason().find(row.in_reason), std::string::npos) << e.reason();
    }
    if (*row.source != '\0') EXPECT_EQ(e.source(), row.source);
  }
}

TEST(ConfigTest, WrongTypes) {
  expect_errors({
      {"autotune:\n  warmup_steps: ten\n", "autotune.warmup_steps", "integer", "test.yaml:2"},
      {"autotune:\n  warmup_steps: 1.5\n", "autotune.warmup_steps", "integer"},
      // a list for a scalar, a mapping for a scalar
      {"autotune:\n  settle_steps: [1, 2]\n", "autotune.settle_steps", "single value"},
      {"mode: {a: 1}\n", "mode"},
      {"autotune:\n  noise_margin: abc\n", "autotune.noise_margin", "number"},
      {"autotune:\n  confirm_rounds: 1.5\n", "autotune.confirm_rounds", "integer"},
      {"autotune:\n  tune_pin_memory: maybe\n", "autotune.tune_pin_memory", "maybe"},
      // a scalar for a list, a list of something else
      {"autotune:\n  prefetch_choices: 4\n", "autotune.prefetch_choices", "list"},
      {"autotune:\n  prefetch_choices: [1, x]\n", "autotune.prefetch_choices"},
      {"autotune:\n  prefetch_choices: [1, [2]]\n", "autotune.prefetch_choices"},
      {"autotune:\n  prefetch_choices: []\n", "autotune.prefetch_choices"},
      // no value at all; the root must be a mapping
      {"records:\n  step_history:\n", "records.step_history"},
      {"- 1\n- 2\n", "<root>"},
  });
}

TEST(ConfigTest, OutOfRange) {
  expect_errors({
      {"autotune:\n  warmup_steps: -1\n", "autotune.warmup_steps", "out of range"},
      {"autotune:\n  noise_margin: 0.9\n", "autotune.noise_margin", "out of range"},
      {"autotune:\n  prefetch_choices: [0]\n", "autotune.prefetch_choices", "out of range"},
      {"autotune:\n  confirm_settings: 0\n", "autotune.confirm_settings", "out of range"},
      {"autotune:\n  confirm_settings: 17\n", "autotune.confirm_settings"},
      {"autotune:\n  confirm_rounds: 11\n", "autotune.confirm_rounds", "out of range"},
      {"autotune:\n  prefetch_choices: [2, 65]\n", "autotune.prefetch_choices"},
      {"records:\n  step_history: 15\n", "records.step_history"},
      {"advisors:\n  data_starvation:\n    threshold: 1.5\n", "advisors.data_starvation.threshold",
       "", "test.yaml:3"},
      {"autotune:\n  measure_steps: 2\n", "autotune.measure_steps"},
      // beyond int64
      {"autotune:\n  warmup_steps: 99999999999999999999999\n", "autotune.warmup_steps"},
  });
  // The edges themselves are allowed.
  const Config c =
      Config::from_yaml_string("autotune:\n  noise_margin: 0.5\n  prefetch_choices: [1, 64]\n");
  EXPECT_DOUBLE_EQ(c.autotune.noise_margin, 0.5);
  EXPECT_EQ(c.autotune.prefetch_choices, (std::vector<int>{1, 64}));
  const Config edges =
      Config::from_yaml_string("autotune:\n  confirm_settings: 16\n  confirm_rounds: 10\n");
  EXPECT_EQ(edges.autotune.confirm_settings, 16);
  EXPECT_EQ(edges.autotune.confirm_rounds, 10);
}

TEST(ConfigTest, BadEnumValue) {
  const ConfigError e = yaml_error("mode: turbo\n");
  EXPECT_EQ(e.key(), "mode");
  EXPECT_EQ(e.source(), "test.yaml:1");
  EXPECT_NE(e.reason().find("turbo"), std::string::npos) << e.reason();
  EXPECT_NE(e.reason().find("autotune"), std::string::npos) << e.reason();
  const ConfigError e2 = yaml_error("log:\n  level: loud\n");
  EXPECT_EQ(e2.key(), "log.level");
}

TEST(ConfigTest, YamlSyntaxError) {
  const ConfigError e = yaml_error("mode: advise\nautotune: [1, 2\n", "broken.yaml");
  EXPECT_EQ(e.key(), "<syntax>");
  EXPECT_EQ(e.source().rfind("broken.yaml:", 0), 0u) << e.source();
  EXPECT_FALSE(e.reason().empty());
}

TEST(ConfigTest, MissingFile) {
  const std::string path = "/nonexistent/torchpilot/none.yaml";
  const ConfigError e = expect_config_error([&] { Config::from_yaml_file(path); });
  EXPECT_EQ(e.source(), path);
  EXPECT_EQ(e.key(), "<file>");
}

TEST(ConfigTest, HighSeverityBelowThreshold) {
  const ConfigError e =
      yaml_error("advisors:\n  data_starvation:\n    threshold: 0.3\n    high_severity: 0.2\n");
  EXPECT_EQ(e.key(), "advisors.data_starvation.high_severity");
  EXPECT_NE(e.source().find("test.yaml"), std::string::npos);
  // Equal is fine.
  const Config c = Config::from_yaml_string(
      "advisors:\n  data_starvation:\n    threshold: 0.3\n    high_severity: 0.3\n");
  EXPECT_DOUBLE_EQ(c.advisors.data_starvation.high_severity, 0.3);
  // Only the threshold, above the default high_severity (0.25).
  const ConfigError e2 = yaml_error("advisors:\n  data_starvation:\n    threshold: 0.5\n");
  EXPECT_EQ(e2.key(), "advisors.data_starvation.high_severity");
}

TEST(ConfigTest, EnvironmentOverrides) {
  Config c;
  apply_env_overrides(c, Environment{{"PATH", "/usr/bin"},
                                     {"TORCHPILOT_MODE", "autotune"},
                                     {"TORCHPILOT_LOG_LEVEL", "warn"},
                                     {"TORCHPILOT_LOG_JSON_PATH", "/tmp/x.jsonl"},
                                     {"TORCHPILOT_RECORDS_STEP_HISTORY", "32"},
                                     {"TORCHPILOT_ADVISORS_DATA_STARVATION_THRESHOLD", "0.1"},
                                     {"TORCHPILOT_AUTOTUNE_WARMUP_STEPS", "64"},
                                     {"TORCHPILOT_AUTOTUNE_NOISE_MARGIN", "0.02"},
                                     {"TORCHPILOT_AUTOTUNE_PREFETCH_CHOICES", "1,2,4"},
                                     {"TORCHPILOT_AUTOTUNE_TUNE_PIN_MEMORY", "false"},
                                     {"TORCHPILOT_AUTOTUNE_TUNE_DEVICE_PREFETCH", "0"}});
  Config expected;
  expected.mode = Mode::kAutotune;
  expected.log.level = "warn";
  expected.log.json_path = "/tmp/x.jsonl";
  expected.records.step_history = 32;
  expected.advisors.data_starvation.threshold = 0.1;
  expected.autotune.warmup_steps = 64;
  expected.autotune.noise_margin = 0.02;
  expected.autotune.prefetch_choices = {1, 2, 4};
  expected.autotune.tune_pin_memory = false;
  expected.autotune.tune_device_prefetch = false;
  expect_config_eq(c, expected);
}

TEST(ConfigTest, EnvironmentBooleans) {
  for (const auto& [text, value] : std::vector<std::pair<std::string, bool>>{{"true", true},
                                                                             {"1", true},
                                                                             {"yes", true},
                                                                             {"on", true},
                                                                             {"false", false},
                                                                             {"0", false},
                                                                             {"no", false},
                                                                             {"off", false}}) {
    Config c;
    c.autotune.tune_pin_memory = !value;
    apply_env_overrides(c, Environment{{"TORCHPILOT_AUTOTUNE_TUNE_PIN_MEMORY", text}});
    EXPECT_EQ(c.autotune.tune_pin_memory, value) << text;
  }
  const ConfigError e = env_error({{"TORCHPILOT_AUTOTUNE_TUNE_PIN_MEMORY", "maybe"}});
  EXPECT_EQ(e.key(), "autotune.tune_pin_memory");
  EXPECT_NE(e.source().find("TORCHPILOT_AUTOTUNE_TUNE_PIN_MEMORY"), std::string::npos);
}

TEST(ConfigTest, EnvironmentErrors) {
  {
    const ConfigError e = env_error({{"TORCHPILOT_FOO", "1"}});
    EXPECT_EQ(e.key(), "TORCHPILOT_FOO");
    EXPECT_NE(e.source().find("TORCHPILOT_FOO"), std::string::npos) << e.source();
    EXPECT_NE(e.reason().find("unknown"), std::string::npos) << e.reason();
  }
  {
    const ConfigError e = env_error({{"TORCHPILOT_AUTOTUNE_WARMUP_STEPS", "abc"}});
    EXPECT_EQ(e.key(), "autotune.warmup_steps");
    EXPECT_NE(e.source().find("TORCHPILOT_AUTOTUNE_WARMUP_STEPS"), std::string::npos);
  }
  {
    const ConfigError e = env_error({{"TORCHPILOT_AUTOTUNE_PREFETCH_CHOICES", "1,x,4"}});
    EXPECT_EQ(e.key(), "autotune.prefetch_choices");
  }
  {
    const ConfigError e = env_error({{"TORCHPILOT_AUTOTUNE_PREFETCH_CHOICES", "2,0"}});
    EXPECT_EQ(e.key(), "autotune.prefetch_choices");
  }
  {
    const ConfigError e = env_error({{"TORCHPILOT_AUTOTUNE_PREFETCH_CHOICES", ""}});
    EXPECT_EQ(e.key(), "autotune.prefetch_choices");
  }
  {
    const ConfigError e = env_error({{"TORCHPILOT_MODE", "fast"}});
    EXPECT_EQ(e.key(), "mode");
  }
  {  // cross-check after the overrides
    const ConfigError e = env_error({{"TORCHPILOT_ADVISORS_DATA_STARVATION_THRESHOLD", "0.5"}});
    EXPECT_EQ(e.key(), "advisors.data_starvation.high_severity");
  }
  // Raising both together is fine.
  Config c;
  apply_env_overrides(c, {{"TORCHPILOT_ADVISORS_DATA_STARVATION_THRESHOLD", "0.5"},
                          {"TORCHPILOT_ADVISORS_DATA_STARVATION_HIGH_SEVERITY", "0.6"}});
  EXPECT_DOUBLE_EQ(c.advisors.data_starvation.threshold, 0.5);
  EXPECT_DOUBLE_EQ(c.advisors.data_starvation.high_severity, 0.6);
}

TEST(ConfigTest, EnvironmentIgnoresConfigPathAndOtherVariables) {
  Config c;
  apply_env_overrides(c, Environment{{"TORCHPILOT_CONFIG", "/nonexistent/file.yaml"},
                                     {"MY_TORCHPILOT_FOO", "1"},
                                     {"TORCHPILOTFOO", "1"},
                                     {"HOME", "/root"}});
  expect_config_eq(c, Config());
}

TEST(ConfigTest, FileThenProcessEnvironment) {
  TempDir dir;
  const std::string path =
      dir.write("c.yaml", "autotune:\n  settle_steps: 2\n  measure_steps: 7\n");
  ScopedEnv env("TORCHPILOT_AUTOTUNE_SETTLE_STEPS", "5");
  const Config c = Config::from_yaml_file(path);
  EXPECT_EQ(c.autotune.settle_steps, 5);   // the variable wins over the file
  EXPECT_EQ(c.autotune.measure_steps, 7);  // the file wins over the default
}

TEST(ConfigTest, LoadReadsTorchpilotConfig) {
  TempDir dir;
  const std::string path = dir.write("c.yaml", "mode: off\n");
  {
    ScopedEnv env("TORCHPILOT_CONFIG", path);
    EXPECT_EQ(Config::load().mode, Mode::kOff);
  }
  {
    ScopedEnv env("TORCHPILOT_CONFIG", dir.write("bad.yaml", "mode: sometimes\n"));
    const ConfigError e = expect_config_error([] { Config::load(); });
    EXPECT_EQ(e.key(), "mode");
  }
}

}  // namespace
}  // namespace torchpilot

TEST(ConfigValidate, CodeBuiltConfigsGetTheSameChecks) {
  torchpilot::Config ok;
  EXPECT_NO_THROW(torchpilot::validate(ok));
  torchpilot::Config bad;
  bad.autotune.measure_steps = 1;  // below the range [3, ...]
  try {
    torchpilot::validate(bad);
    FAIL() << "no ConfigError";
  } catch (const torchpilot::ConfigError& e) {
    EXPECT_EQ(e.key(), "autotune.measure_steps");
  }
  torchpilot::Config level;
  level.log.level = "loud";
  EXPECT_THROW(torchpilot::validate(level), torchpilot::ConfigError);
  torchpilot::Config choices;
  choices.autotune.prefetch_choices = {2, 0};
  EXPECT_THROW(torchpilot::validate(choices), torchpilot::ConfigError);
  torchpilot::Config address;
  address.report.prometheus_address = "";
  EXPECT_THROW(torchpilot::validate(address), torchpilot::ConfigError);
  torchpilot::Config pilot_config;
  pilot_config.records.step_history = 0;
  EXPECT_THROW(torchpilot::Pilot{pilot_config}, torchpilot::ConfigError);
}

TEST(ConfigValidate, BooleansIgnoreCase) {
  auto c = torchpilot::Config::from_yaml_string("autotune:\n  tune_pin_memory: False\n");
  EXPECT_FALSE(c.autotune.tune_pin_memory);
}
