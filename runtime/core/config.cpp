#include "torchpilot/runtime/core/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "config_internal.h"

extern char** environ;

namespace torchpilot {
namespace {

using config_detail::find_key;
using config_detail::KeySpec;
using config_detail::schema;
using config_detail::Type;
using config_detail::Value;

std::string describe_range(const KeySpec& spec) {
  std::ostringstream out;
  out << "[" << spec.min << ", " << spec.max << "]";
  return out.str();
}

// A list key's rules beyond each element's range: not empty, no value twice.
template <typename Fail>
void check_list(const std::vector<int64_t>& list, Fail fail) {
  if (list.empty()) fail("expected a non-empty list of integers");
  std::set<int64_t> seen;
  for (int64_t v : list) {
    if (!seen.insert(v).second) fail("duplicate value " + std::to_string(v) + " in the list");
  }
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
      if (text.empty() && spec.min > 0) fail("must not be empty");
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
    case Type::kPath:
      // open(2) ends a path at a NUL and would use what comes before it, silently; a control
      // byte (a newline, tab or escape) is a quoting or paste accident, never a wanted name.
      for (size_t i = 0; i < text.size(); ++i) {
        const auto byte = static_cast<unsigned char>(text[i]);
        if (byte == 0) {
          fail("a path cannot hold a NUL byte (byte " + std::to_string(i + 1) +
               "): the OS would take only what comes before it");
        }
        if (byte < 0x20 || byte == 0x7f) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", byte);
          fail("a path cannot hold a control byte (" + std::string(hex) + " at byte " +
               std::to_string(i + 1) + ")");
        }
      }
      v.s = text;
      break;
    case Type::kIntList: {
      // Comma-separated; every item counts, so "1,2," and "1,,2" are refused, not shortened.
      if (text.empty()) fail("expected a non-empty list of integers");
      for (size_t begin = 0;;) {
        const size_t comma = text.find(',', begin);
        v.list.push_back(parse_int(text.substr(begin, comma - begin), spec, fail));
        if (comma == std::string::npos) break;
        begin = comma + 1;
      }
      check_list(v.list, fail);
      break;
    }
  }
  return v;
}

// What a YAML node is, for reasons: "a list", "a mapping", "no value", "a value".
const char* kind(const YAML::Node& node) {
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  if (node.IsScalar()) return "a value";
  return "no value";
}

// A line for a node: yaml-cpp's 0-based mark as 1-based, or `fallback` where it has none.
int line_of(const YAML::Node& node, int fallback) {
  const int line = node.Mark().line;
  return line >= 0 ? line + 1 : fallback;
}

// A node's tag when the reader does not support it, as written ("!!binary", "!local"), else "".
// The reader takes plain values: no tag, the non-specific "!" (a quoted scalar) and the YAML core
// schema's tags. Another tag (!!binary, !!timestamp, !!omap, a local tag) would be dropped
// silently by yaml-cpp's conversions, its meaning lost.
std::string unsupported_tag(const YAML::Node& node) {
  const std::string& tag = node.Tag();
  if (tag.empty() || tag == "?" || tag == "!") return "";
  static const std::string kStandard = "tag:yaml.org,2002:";
  if (tag.rfind(kStandard, 0) != 0) return tag;
  const std::string name = tag.substr(kStandard.size());
  for (const char* core : {"str", "int", "float", "bool", "null", "map", "seq"}) {
    if (name == core) return "";
  }
  return "!!" + name;
}

std::string tag_reason(const std::string& tag) {
  return "unsupported YAML tag " + tag +
         ": values take no tag or one of the core schema's (!!str, !!int, !!float, !!bool, "
         "!!null, !!map, !!seq)";
}

// Where each key's value came from ("my.yaml:4", "environment variable TORCHPILOT_X"); a key not
// listed has its default (or, in validate(), the value set in code).
using Origins = std::map<std::string, std::string>;

// Walks the YAML mappings; every leaf must be a known key, set once.
std::string unknown_key(const std::string& key_or_variable);

class YamlReader {
 public:
  YamlReader(Config& config, std::string source, Origins& origins)
      : config_(config), source_(std::move(source)), origins_(origins) {}

  void walk(const YAML::Node& node, const std::string& prefix, int line) {
    if (const std::string tag = unsupported_tag(node); !tag.empty()) {
      throw ConfigError(source_ + ":" + std::to_string(line_of(node, line)),
                        prefix.empty() ? "<root>" : prefix, tag_reason(tag));
    }
    if (!node.IsMap()) {
      throw ConfigError(source_ + ":" + std::to_string(line_of(node, line)),
                        prefix.empty() ? "<root>" : prefix,
                        std::string("expected a mapping, got ") + kind(node));
    }
    for (const auto& item : node) {
      // The key's line: a block mapping or list as the value starts on the line after it.
      const int key_line = line_of(item.first, line);
      const std::string where = source_ + ":" + std::to_string(key_line);
      if (const std::string tag = unsupported_tag(item.first); !tag.empty()) {
        throw ConfigError(where, prefix.empty() ? "<root>" : prefix, tag_reason(tag));
      }
      if (!item.first.IsScalar()) {  // "? [a, b]", "{a: 1}: 2", "~: 1"
        throw ConfigError(where, prefix.empty() ? "<root>" : prefix,
                          std::string("a key must be a plain name; this one is ") +
                              (item.first.IsDefined() && !item.first.IsNull() ? kind(item.first)
                                                                              : "empty (null)"));
      }
      const std::string& name = item.first.Scalar();
      const std::string key = prefix.empty() ? name : prefix + "." + name;
      const YAML::Node& value = item.second;
      auto fail = [&](const std::string& reason) { throw ConfigError(where, key, reason); };
      // yaml-cpp keeps both of two equal keys; so does a dotted name beside its section.
      const auto [first, inserted] = seen_.emplace(key, key_line);
      if (!inserted) fail("duplicate key: already set at line " + std::to_string(first->second));
      if (const std::string tag = unsupported_tag(value); !tag.empty()) fail(tag_reason(tag));
      const KeySpec* spec = find_key(key);
      if (spec == nullptr) {
        // A section: known if some key starts with it.
        bool known_section = false;
        for (const auto& s : schema()) {
          known_section = known_section || std::string(s.key).rfind(key + ".", 0) == 0;
        }
        if (!known_section) fail(unknown_key(key));
        if (!value.IsMap()) {
          fail(std::string("is a section: expected a mapping of its keys, got ") + kind(value));
        }
        walk(value, key, key_line);
        continue;
      }
      origins_[key] = where;
      if (spec->type == Type::kIntList) {
        if (!value.IsSequence())
          fail(std::string("expected a list of integers, got ") + kind(value));
        Value v;
        int index = 0;
        for (const auto& e : value) {
          ++index;
          if (const std::string tag = unsupported_tag(e); !tag.empty()) fail(tag_reason(tag));
          if (!e.IsScalar()) {
            fail("expected a list of integers; element " + std::to_string(index) + " is " +
                 (e.IsNull() ? std::string("empty: it has no value") : kind(e)));
          }
          v.list.push_back(parse_int(e.Scalar(), *spec, fail));
        }
        check_list(v.list, fail);
        spec->set(config_, v);
        continue;
      }
      if (!value.IsScalar()) fail(std::string("expected a single value, got ") + kind(value));
      spec->set(config_, parse_scalar(value.Scalar(), *spec, fail));
    }
  }

 private:
  Config& config_;
  std::string source_;
  Origins& origins_;
  std::map<std::string, int> seen_;  // key or section -> the line that set it
};

// The 1-based line of the "---" that starts a second document, or 0 if no such line is found.
int second_document_line(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  bool content = false;  // a document (content or its "---") has begun
  for (int n = 1; std::getline(in, line); ++n) {
    const bool marker = line.rfind("---", 0) == 0 &&
                        (line.size() == 3 || std::isspace(static_cast<unsigned char>(line[3])));
    const size_t first = line.find_first_not_of(" \t\r");
    if (marker) {
      if (content) return n;
      content = true;
    } else if (first != std::string::npos && line[first] != '#' && line[0] != '%') {
      content = true;
    }
  }
  return 0;
}

// Where the documents of a YAML text start (events only, nothing built).
class DocumentStarts : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> marks;
  void OnDocumentStart(const YAML::Mark& mark) override { marks.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// Reads YAML text into `config`, recording origins; no cross-key checks (they run once every
// source is in).
void read_yaml(const std::string& text, const std::string& origin, Config& config,
               Origins& origins) {
  // Documents are counted first, two at most: on some malformed input (a top-level line that
  // starts with ',') yaml-cpp yields empty documents without end, and LoadAll grows until the
  // process runs out of memory.
  DocumentStarts starts;
  YAML::Node document;
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    while (starts.marks.size() < 2 && parser.HandleNextDocument(starts)) {
    }
    if (starts.marks.size() < 2) document = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(origin + ":" + std::to_string(e.mark.line + 1), "<syntax>", e.msg);
  }
  if (starts.marks.size() > 1 && starts.marks[1].pos <= starts.marks[0].pos) {
    // A "document" that consumed nothing: what yaml-cpp makes of a stray ',' at the top level.
    throw ConfigError(origin + ":" + std::to_string(starts.marks[1].line + 1), "<syntax>",
                      "not readable as YAML from here");
  }
  if (starts.marks.size() > 1) {
    int line = second_document_line(text);
    if (line == 0) line = starts.marks[1].line + 1;
    throw ConfigError(origin + ":" + std::to_string(line), "<document>",
                      "a config file holds one YAML document; a second one starts here");
  }
  if (!document || document.IsNull()) return;  // an empty file means defaults
  try {
    YamlReader(config, origin, origins).walk(document, "", 1);
  } catch (const YAML::Exception& e) {  // anything yaml-cpp throws while walking
    throw ConfigError(origin + ":" + std::to_string(e.mark.line + 1), "<yaml>", e.msg);
  }
}

std::string number_text(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Cross-key rules that no single key can check; they run on the merged config (file, then
// environment). `fallback` names the source when no key of the rule has a recorded origin.
void check_cross_keys(const Config& c, const std::string& fallback, const Origins& origins) {
  const auto& ds = c.advisors.data_starvation;
  if (ds.high_severity < ds.threshold) {
    const std::string high_key = "advisors.data_starvation.high_severity";
    const std::string low_key = "advisors.data_starvation.threshold";
    // validate() has no origins: its values were set in code or kept their defaults.
    const std::string unset = fallback == "Config" ? "code or default" : "default";
    auto from = [&](const std::string& key) {
      const auto it = origins.find(key);
      return it == origins.end() ? unset : it->second;
    };
    const auto high = origins.find(high_key);
    const auto low = origins.find(low_key);
    const std::string source = high != origins.end()  ? high->second
                               : low != origins.end() ? low->second
                                                      : fallback;
    throw ConfigError(source, high_key,
                      "must not be below " + low_key + ": " + number_text(ds.high_severity) +
                          " (from " + from(high_key) + ") < " + number_text(ds.threshold) +
                          " (from " + from(low_key) + ")");
  }
}

std::string env_name(const std::string& key) {
  std::string name = "TORCHPILOT_";
  for (char ch : key) name += ch == '.' ? '_' : static_cast<char>(std::toupper(ch));
  return name;
}

// Keeps where each loaded key's value came from in the Config, with the value, for checks that
// run later (check_output_paths at the Pilot's start).
void keep_sources(Config& config, const Origins& origins) {
  for (const auto& [key, where] : origins) {
    if (const KeySpec* spec = find_key(key)) config.sources[key] = {where, spec->get(config)};
  }
}

// TORCHPILOT_* variables that are not keys, so apply_env_overrides passes over them: the config
// file's path, and the CMake build options (README, "Build"), which scripts often export beside
// the keys but which mean nothing at run time. This is the one list of them.
const char* const kConfigPathVariable = "TORCHPILOT_CONFIG";
const char* const kNonKeyVariables[] = {
    kConfigPathVariable,         "TORCHPILOT_GPU_COLLECTORS", "TORCHPILOT_BUILD_TESTS",
    "TORCHPILOT_BUILD_EXAMPLES", "TORCHPILOT_BUILD_BENCH",    "TORCHPILOT_INSTALL",
    "TORCHPILOT_BUILD_TOOLS",
};

bool is_non_key_variable(const std::string& name) {
  for (const char* v : kNonKeyVariables) {
    if (name == v) return true;
  }
  return false;
}

// Why a key (or a TORCHPILOT_* variable) is unknown: a key this version renamed says its new name.
std::string unknown_key(const std::string& key_or_variable) {
  static const std::pair<const char*, const char*> renamed[] = {
      {"advisors.precision.fp32_matmul_threshold", "advisors.fp32_matmul.threshold"},
      {"advisors.attention.unfused_threshold", "advisors.unfused_attention.threshold"},
      {"advisors.linear_bias.threshold", "advisors.unfused_linear_bias.threshold"},
      {"advisors.optimizer.threshold", "advisors.per_parameter_optimizer.threshold"},
  };
  for (const auto& [old_key, new_key] : renamed) {
    const std::string o = old_key;
    if (key_or_variable == o || key_or_variable == env_name(o) ||
        o.rfind(key_or_variable + ".", 0) == 0) {  // a section of the old key, in YAML
      return "unknown key: " + o + " was renamed " + new_key + " (docs/configuration.md)";
    }
  }
  return "unknown key";
}

// Sets TORCHPILOT_<KEY> overrides, recording origins; no cross-key checks.
void read_env(Config& config, const Environment& env, Origins& origins) {
  for (const auto& [name, text] : env) {
    if (name.rfind("TORCHPILOT_", 0) != 0 || is_non_key_variable(name)) continue;
    const KeySpec* spec = nullptr;
    for (const auto& s : schema()) {
      if (env_name(s.key) == name) spec = &s;
    }
    const std::string source = "environment variable " + name;
    if (spec == nullptr) throw ConfigError(source, name, unknown_key(name));
    auto fail = [&](const std::string& reason) { throw ConfigError(source, spec->key, reason); };
    spec->set(config, parse_scalar(text, *spec, fail));
    origins[spec->key] = source;
  }
}

// The whole of a config file, read without blocking: a directory, FIFO or device is refused.
std::string read_config_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    throw ConfigError(path, "<file>", std::string("cannot open the file: ") + std::strerror(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw ConfigError(path, "<file>", std::string("cannot stat the file: ") + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) throw ConfigError(path, "<file>", "is a directory, not a YAML file");
  if (!S_ISREG(st.st_mode)) {
    throw ConfigError(path, "<file>",
                      "is not a regular file (a FIFO, socket or device); give a YAML file");
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      throw ConfigError(path, "<file>",
                        std::string("cannot read the file: ") + std::strerror(errno));
    }
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

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
  Config config;
  Origins origins;
  read_yaml(text, origin, config, origins);
  check_cross_keys(config, origin, origins);
  keep_sources(config, origins);
  return config;
}

Config Config::from_yaml_file(const std::string& path) {
  Config config;
  Origins origins;
  read_yaml(read_config_file(path), path, config, origins);
  read_env(config, process_environment(), origins);
  check_cross_keys(config, path, origins);  // on the merged values: the environment may mend
  keep_sources(config, origins);
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
  Origins origins;
  read_env(config, env, origins);
  check_cross_keys(config, "environment", origins);
  keep_sources(config, origins);
}

std::string source_of(const Config& config, const std::string& key) {
  const auto it = config.sources.find(key);
  const KeySpec* spec = find_key(key);
  if (it != config.sources.end() && spec != nullptr && spec->get(config) == it->second.value) {
    return it->second.where;
  }
  return "Config";
}

void validate(const Config& config) {
  for (const auto& spec : schema()) {
    auto fail = [&](const std::string& reason) { throw ConfigError("Config", spec.key, reason); };
    parse_scalar(spec.get(config), spec, fail);
  }
  check_cross_keys(config, "Config", Origins());
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
