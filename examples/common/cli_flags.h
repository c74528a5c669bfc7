// Command-line parsing shared by the examples and the benchmarks, on CLI11: validators CLI11
// 2.1 lacks or gets wrong for a trainer's flags, and parse-or-exit.
//
// CLI11 2.1 reads integers with strtoll(base 0) and no overflow check: "010" is 8, "0x10" is 16,
// "99999999999999999999" saturates to INT64_MAX; an unsigned target takes "-1" as 2^64-1; floats
// take "inf" and "nan". So every integer flag goes through Integer (decimal only, in range, no
// wrap), every float flag through Number (finite, in range), before CLI11 converts the value.
// A bad flag ends the program with status 2 and CLI11's message, which names the flag; --help
// prints the help and exits 0. Nothing here runs after parsing: no training starts on a bad flag.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <type_traits>

namespace example_cli {

// A decimal integer in [min, max] ("-5", "42"; not "+1", "1e3", "0x10", " 7"). The value is
// rewritten in canonical form ("007" -> "7") so that CLI11's own base-0 conversion that follows
// reads it as decimal.
inline CLI::Validator Integer(int64_t min, int64_t max) {
  const std::string range = "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        int64_t v = 0;
        const char* begin = text.data();
        const char* end = begin + text.size();
        const auto [stop, ec] = std::from_chars(begin, end, v);
        if (ec == std::errc::result_out_of_range) {
          return "'" + text + "' is out of range " + range;
        }
        if (text.empty() || ec != std::errc() || stop != end) {
          return "'" + text + "' is not a decimal integer";
        }
        if (v < min || v > max) return "'" + text + "' is out of range " + range;
        text = std::to_string(v);
        return {};
      },
      "");
}

// The text of a range: "(0, 10]" or, with its lower end included, "[0, 10]".
inline std::string range_text(double low, bool low_included, double max) {
  char text[64];
  std::snprintf(text, sizeof text, "%s%g, %g]", low_included ? "[" : "(", low, max);
  return text;
}

// A finite number above `low` (or equal to it when `low_included`) and at most `max` ("3e-4";
// not "inf", "nan", "1e400").
inline CLI::Validator Number(double low, double max, bool low_included = false) {
  const std::string range = range_text(low, low_included, max);
  return CLI::Validator(
      [low, max, low_included, range](std::string& text) -> std::string {
        char* stop = nullptr;
        const double v = std::strtod(text.c_str(), &stop);
        if (text.empty() || stop != text.c_str() + text.size()) {
          return "'" + text + "' is not a number";
        }
        if (!std::isfinite(v)) return "'" + text + "' is not a finite number";
        const bool above_low = low_included ? v >= low : v > low;
        if (!above_low || v > max) return "'" + text + "' is out of range " + range;
        return {};
      },
      "");
}

// "cpu", "cuda" or "cuda:N".
inline CLI::Validator Device() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text == "cpu" || text == "cuda") return {};
        if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 8 &&
            text.find_first_not_of("0123456789", 5) == std::string::npos) {
          return {};
        }
        return "'" + text + "' is not cpu, cuda or cuda:N";
      },
      "");
}

// CLI11's ExistingFile without its "FILE" in the help (add_path names the type).
inline CLI::Validator ExistingFile() {
  CLI::Validator v = CLI::ExistingFile;
  v.description("");
  return v;
}

// A directory, or a path that does not exist yet (a dataset folder made on first use).
inline CLI::Validator DirectoryOrAbsent() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty()) return "an empty path";
        std::error_code ec;
        const auto status = std::filesystem::status(text, ec);
        if (std::filesystem::exists(status) && !std::filesystem::is_directory(status)) {
          return "'" + text + "' exists and is not a directory";
        }
        return {};
      },
      "");
}

// A path: not empty, and not a flag taken for the value of the one before ("--json --steps 5":
// CLI11 gives --json the value "--steps").
inline CLI::Validator Path() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty()) return "an empty path";
        if (text.rfind("--", 0) == 0) return "'" + text + "' is a flag, not a path";
        return {};
      },
      "");
}

// An integer flag in [min, max]; Integer rewrites the text, so it is a transform (CLI11's check
// works on a copy).
template <typename T>
CLI::Option* add_int(CLI::App& app, const std::string& name, T& value, int64_t min, int64_t max,
                     const std::string& help) {
  static_assert(std::is_integral_v<T>, "add_int: an integer target");
  return app.add_option(name, value, help)
      ->transform(Integer(min, max))
      ->type_name("INT in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

// A floating-point flag, finite, in (above, max].
inline CLI::Option* add_number(CLI::App& app, const std::string& name, double& value, double above,
                               double max, const std::string& help) {
  return app.add_option(name, value, help)
      ->check(Number(above, max))
      ->type_name("NUMBER in " + range_text(above, false, max));
}

// A floating-point flag, finite, in [0, max]: for amounts where 0 means none (no extra work, no
// bucketing), so the default 0 can also be given.
inline CLI::Option* add_amount(CLI::App& app, const std::string& name, double& value, double max,
                               const std::string& help) {
  return app.add_option(name, value, help)
      ->check(Number(0, max, true))
      ->type_name("NUMBER in " + range_text(0, true, max));
}

// A path flag (see Path); `kind` names it in the help (FILE, DIR).
inline CLI::Option* add_path(CLI::App& app, const std::string& name, std::string& value,
                             const std::string& kind, const std::string& help) {
  return app.add_option(name, value, help)->check(Path())->type_name(kind);
}

// The examples' torchpilot flags: --mode (off, advise or autotune; the help names
// `default_mode`), --config FILE (a YAML config file) and --json FILE (the JSON records).
inline void add_torchpilot_flags(CLI::App& app, std::string& mode, std::string& config_path,
                                 std::string& json_path, const std::string& default_mode) {
  app.add_option("--mode", mode,
                 "torchpilot mode; default " + default_mode +
                     ", unless the config file or TORCHPILOT_MODE says otherwise")
      ->check(CLI::IsMember({"off", "advise", "autotune"}));
  add_path(app, "--config", config_path, "FILE", "torchpilot YAML config file")
      ->check(ExistingFile());
  add_path(app, "--json", json_path, "FILE", "write torchpilot's JSON records here");
}

// Flags given twice: the last one wins, as with the hand-written parsers this replaces (scripts
// append overrides). Call before adding options.
inline void last_wins(CLI::App& app) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

// Parses argv. --help: the help on stdout, exit 0. A bad flag: CLI11's message on stderr (it
// names the flag) and exit 2.
inline void parse_or_exit(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    std::exit(rc == 0 ? 0 : 2);
  }
}

// A check of several flags together, after parsing (say, --heads must divide --d-model):
// reported as CLI11 reports a bad flag, exit 2.
[[noreturn]] inline void fail(CLI::App& app, const std::string& flag, const std::string& message) {
  app.exit(CLI::ValidationError(flag, message));
  std::exit(2);
}

}  // namespace example_cli
