// Config edge cases: bad inputs from a corpus (tests/fixtures/config/bad), the config path and
// log.json_path as directories and FIFOs, environment after file then cross-key checks, ignored
// build-option variables, and the step history's memory. The promise: a bad config is refused at
// start with the key and the reason; nothing hangs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fakes/scoped_env.h"
#include "temp_dir.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/reports/sinks.h"

namespace torchpilot {
namespace {

namespace fs = std::filesystem;
using torchpilot_test::TempDir;

const std::string kSourceDir = TORCHPILOT_SOURCE_DIR;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `fn`, which must throw ConfigError, and returns the error.
ConfigError expect_config_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a ConfigError: " << e.what();
    return ConfigError("", "", "");
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return ConfigError("", "", "");
}

using test::ScopedEnv;

PilotOptions quiet_options() {
  PilotOptions o;
  o.logger = std::make_shared<spdlog::logger>("config_edge_test",
                                              std::make_shared<spdlog::sinks::null_sink_mt>());
  o.default_collectors = false;
  return o;
}

// Runs `fn` on another thread and waits a generous while: a hang check, not a timing check. If
// it has not returned, `release` unblocks it (so the test ends) and the test fails.
template <typename Fn>
void expect_returns(Fn fn, const std::function<void()>& release) {
  auto done = std::async(std::launch::async, fn);
  if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "hung: did not return within 10 s";
    release();
  }
  done.get();
}

// Opens `fifo` at its other end without blocking and closes it again: a writer blocked in open()
// gets its reader, a reader blocked in open() its writer.
void poke_fifo(const std::string& fifo, int flags) {
  const int fd = ::open(fifo.c_str(), flags | O_NONBLOCK);
  if (fd >= 0) ::close(fd);
}

// --- The corpus of bad files: one file per case, the expectation in its first line ------------

struct BadCase {
  std::string file;
  std::string key;
  int line = 0;
  std::string reason;  // a substring of the reason
};

// "# expect: key=<key> line=<n> reason=<substring to the end of the line>"
BadCase parse_expectation(const std::string& path) {
  BadCase c;
  c.file = path;
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  static const std::regex re(R"(^# expect: key=(\S+) line=(\d+) reason=(.*)$)");
  std::smatch m;
  if (!std::regex_match(first, m, re)) {
    ADD_FAILURE() << path << ": first line is not '# expect: key=... line=... reason=...'";
    return c;
  }
  c.key = m[1];
  c.line = std::stoi(m[2]);
  c.reason = m[3];
  return c;
}

TEST(ConfigEdge, EveryBadFileInTheCorpusIsRefusedWithKeyAndLine) {
  const fs::path dir = kSourceDir + "/tests/fixtures/config/bad";
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 30u);
  for (const auto& path : files) {
    SCOPED_TRACE(path);
    const BadCase c = parse_expectation(path);
    // Through the file reader (no environment in play: none of these keys is set in it) ...
    const ConfigError e = expect_config_error([&] { Config::from_yaml_file(path); });
    EXPECT_EQ(e.key(), c.key) << e.what();
    EXPECT_EQ(e.source(), path + ":" + std::to_string(c.line)) << e.what();
    EXPECT_NE(e.reason().find(c.reason), std::string::npos) << e.what();
    // ... and the string reader alike.
    const ConfigError s =
        expect_config_error([&] { Config::from_yaml_string(read_text(path), "t.yaml"); });
    EXPECT_EQ(s.key(), c.key) << s.what();
    EXPECT_EQ(s.source(), "t.yaml:" + std::to_string(c.line)) << s.what();
  }
}

// Bad environment variables, one row per case.
TEST(ConfigEdge, EveryBadEnvironmentVariableIsRefusedWithKey) {
  struct Row {
    const char* name;
    const char* value;
    const char* key;
    const char* reason;
  };
  const std::vector<Row> rows = {
      {"TORCHPILOT_FOO", "1", "TORCHPILOT_FOO", "unknown"},
      {"TORCHPILOT_AUTOTUNE_PREFETCH_CHOICES", "1,2,", "autotune.prefetch_choices", "integer"},
      {"TORCHPILOT_AUTOTUNE_PREFETCH_CHOICES", ",1", "autotune.prefetch_choices", "integer"},
      {"TORCHPILOT_AUTOTUNE_PREFETCH_CHOICES", "1,,2", "autotune.prefetch_choices", "integer"},
      {"TORCHPILOT_AUTOTUNE_PREFETCH_CHOICES", "", "autotune.prefetch_choices", "non-empty"},
      {"TORCHPILOT_AUTOTUNE_PREFETCH_CHOICES", "4,4", "autotune.prefetch_choices",
       "duplicate value 4"},
      {"TORCHPILOT_AUTOTUNE_PREFETCH_CHOICES", "[1,2]", "autotune.prefetch_choices", "integer"},
      {"TORCHPILOT_RECORDS_STEP_HISTORY", "16777216", "records.step_history", "out of range"},
      {"TORCHPILOT_REPORT_PROMETHEUS_ADDRESS", "", "report.prometheus_address",
       "must not be empty"},
      {"TORCHPILOT_AUTOTUNE_SETTLE_STEPS", "3 ", "autotune.settle_steps", "integer"},
      {"TORCHPILOT_MODE", "", "mode", "expected one of"},
  };
  for (const auto& row : rows) {
    SCOPED_TRACE(std::string(row.name) + "=" + row.value);
    Config c;
    const ConfigError e = expect_config_error([&] {
      apply_env_overrides(c, {{row.name, row.value}});
    });
    EXPECT_EQ(e.key(), row.key) << e.what();
    EXPECT_NE(e.source().find(row.name), std::string::npos) << e.what();
    EXPECT_NE(e.reason().find(row.reason), std::string::npos) << e.what();
  }
}

// Random byte edits of configs/default.yaml: whatever yaml-cpp makes of them, only a ConfigError
// (or a Config) comes out.
// yaml-cpp reads a top-level line starting with ',' as endless empty documents: refused with the
// line, not loaded until memory runs out.
TEST(ConfigEdge, AStrayCommaLineIsASyntaxErrorWithItsLine) {
  const ConfigError e = expect_config_error(
      [] { Config::from_yaml_string("mode: advise\n,2,4\ngpu:\n  nvtx: false\n", "c.yaml"); });
  EXPECT_EQ(e.key(), "<syntax>") << e.what();
  EXPECT_EQ(e.source(), "c.yaml:2") << e.what();
  const ConfigError first = expect_config_error([] { Config::from_yaml_string(",2\n", "c.yaml"); });
  EXPECT_EQ(first.source(), "c.yaml:1") << first.what();
}

TEST(ConfigEdge, MutatedDefaultYamlOnlyEverThrowsConfigError) {
  const std::string base = read_text(kSourceDir + "/configs/default.yaml");
  ASSERT_FALSE(base.empty());
  const std::string alphabet = "?:{}[],-&*!|>'\"%@`#~. \n\t0123456789abcxyz";
  std::mt19937 rng(12345);
  for (int i = 0; i < 3000; ++i) {
    std::string text = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      const size_t at = rng() % text.size();
      const char ch = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          text[at] = ch;
          break;
        case 1:
          text.insert(at, 1, ch);
          break;
        default:
          text.erase(at, 1);
          break;
      }
    }
    try {
      Config::from_yaml_string(text, "m.yaml");
    } catch (const ConfigError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a ConfigError: " << e.what() << "\n--- input ---\n" << text;
      return;
    }
  }
}

// --- 1. The config path ---------------------------------------------------------------------

TEST(ConfigEdge, DirectoryAsConfigPathIsRefused) {
  TempDir dir;
  const std::string path = dir.file("");
  {
    const ConfigError e = expect_config_error([&] { Config::from_yaml_file(path); });
    EXPECT_EQ(e.source(), path);
    EXPECT_EQ(e.key(), "<file>");
    EXPECT_NE(e.reason().find("is a directory"), std::string::npos) << e.what();
  }
  {
    ScopedEnv env("TORCHPILOT_CONFIG", "/tmp");
    const ConfigError e = expect_config_error([] { Config::load(); });
    EXPECT_EQ(e.source(), "/tmp");
    EXPECT_NE(e.reason().find("is a directory"), std::string::npos) << e.what();
  }
}

TEST(ConfigEdge, FifoAsConfigPathIsRefusedWithoutHanging) {
  TempDir dir;
  const std::string fifo = dir.file("config.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  expect_returns(
      [&] {
        const ConfigError e = expect_config_error([&] { Config::from_yaml_file(fifo); });
        EXPECT_EQ(e.source(), fifo);
        EXPECT_NE(e.reason().find("not a regular file"), std::string::npos) << e.what();
      },
      [&] { poke_fifo(fifo, O_WRONLY); });
}

TEST(ConfigEdge, MissingConfigFileNamesTheOsReason) {
  const ConfigError e =
      expect_config_error([] { Config::from_yaml_file("/nonexistent/torchpilot/c.yaml"); });
  EXPECT_EQ(e.key(), "<file>");
  EXPECT_NE(e.reason().find(std::strerror(ENOENT)), std::string::npos) << e.what();
}

// --- 2 and 3. log.json_path -------------------------------------------------------------------

ConfigError pilot_error(const std::string& json_path) {
  Config config;
  config.log.json_path = json_path;
  return expect_config_error([&] { Pilot pilot(config, quiet_options()); });
}

TEST(ConfigEdge, UnopenableJsonPathIsAConfigErrorWithTheOsReason) {
  {
    const ConfigError e = pilot_error("/nonexistent/dir/x.jsonl");
    EXPECT_EQ(e.key(), "log.json_path");
    EXPECT_NE(e.reason().find(std::strerror(ENOENT)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.jsonl"), std::string::npos);
  }
  {
    TempDir dir;
    const ConfigError e = pilot_error(dir.file(""));
    EXPECT_EQ(e.key(), "log.json_path");
    EXPECT_NE(e.reason().find(std::strerror(EISDIR)), std::string::npos) << e.what();
  }
  {  // the sink on its own says the same
    const ConfigError e =
        expect_config_error([] { make_json_lines_sink("/nonexistent/dir/x.jsonl"); });
    EXPECT_EQ(e.key(), "log.json_path");
  }
}

TEST(ConfigEdge, FifoWithoutReaderAsJsonPathDoesNotHang) {
  TempDir dir;
  const std::string fifo = dir.file("records.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  int reader = -1;  // opened only to release a hung open(); kept open so no write gets SIGPIPE
  expect_returns(
      [&] {
        const ConfigError e = pilot_error(fifo);
        EXPECT_EQ(e.key(), "log.json_path");
        EXPECT_NE(e.reason().find("FIFO with no reader"), std::string::npos) << e.what();
      },
      [&] { reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK); });
  if (reader >= 0) ::close(reader);
}

TEST(ConfigEdge, FifoWithReaderAsJsonPathGetsTheRecords) {
  TempDir dir;
  const std::string fifo = dir.file("records.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0) << std::strerror(errno);
  expect_returns(
      [&] {
        Config config;
        config.log.json_path = fifo;
        Pilot pilot(config, quiet_options());
        pilot.flush();
      },
      [&] { poke_fifo(fifo, O_RDONLY); });
  char buf[512] = {};
  const ssize_t n = ::read(reader, buf, sizeof buf - 1);
  ::close(reader);
  ASSERT_GT(n, 0);
  EXPECT_NE(std::string(buf).find("\"type\":\"run\""), std::string::npos) << buf;
}

TEST(ConfigEdge, RegularJsonPathIsAppendedTo) {
  TempDir dir;
  const std::string path = dir.write("r.jsonl", "{\"earlier\":1}\n");
  {
    Config config;
    config.log.json_path = path;
    Pilot pilot(config, quiet_options());
    pilot.flush();
  }
  const std::string text = read_text(path);
  EXPECT_EQ(text.rfind("{\"earlier\":1}\n", 0), 0u) << text;
  EXPECT_NE(text.find("\"type\":\"run\""), std::string::npos) << text;
}

// --- 4. Complex keys (also in the corpus) ------------------------------------------------------

TEST(ConfigEdge, ComplexKeysAreConfigErrors) {
  for (const char* text : {"? [a, b]\n: 1\n", "{a: 1}: 2\n", "gpu:\n  ? {x: 1}\n  : 2\n"}) {
    SCOPED_TRACE(text);
    const ConfigError e = expect_config_error([&] { Config::from_yaml_string(text, "c.yaml"); });
    EXPECT_EQ(e.source().rfind("c.yaml:", 0), 0u) << e.what();
  }
}

// --- 5. Cross-key checks after file and environment ---------------------------------------------

TEST(ConfigEdge, EnvironmentCanFixAFileValueBeforeTheCrossKeyCheck) {
  TempDir dir;
  // Alone, the file breaks the rule (threshold above the default high_severity 0.25) ...
  const std::string path =
      dir.write("c.yaml", "advisors:\n  data_starvation:\n    threshold: 0.3\n");
  EXPECT_THROW(Config::from_yaml_string(read_text(path)), ConfigError);
  // ... the environment mends it.
  ScopedEnv env("TORCHPILOT_ADVISORS_DATA_STARVATION_HIGH_SEVERITY", "0.5");
  const Config c = Config::from_yaml_file(path);
  EXPECT_DOUBLE_EQ(c.advisors.data_starvation.threshold, 0.3);
  EXPECT_DOUBLE_EQ(c.advisors.data_starvation.high_severity, 0.5);
  ScopedEnv config_env("TORCHPILOT_CONFIG", path);
  EXPECT_DOUBLE_EQ(Config::load().advisors.data_starvation.high_severity, 0.5);
}

TEST(ConfigEdge, CrossKeyErrorNamesBothSources) {
  TempDir dir;
  const std::string path =
      dir.write("c.yaml", "advisors:\n  data_starvation:\n    high_severity: 0.3\n");
  ScopedEnv env("TORCHPILOT_ADVISORS_DATA_STARVATION_THRESHOLD", "0.4");
  const ConfigError e = expect_config_error([&] { Config::from_yaml_file(path); });
  EXPECT_EQ(e.key(), "advisors.data_starvation.high_severity");
  const std::string what = e.what();
  EXPECT_NE(what.find(path + ":3"), std::string::npos) << what;
  EXPECT_NE(what.find("TORCHPILOT_ADVISORS_DATA_STARVATION_THRESHOLD"), std::string::npos) << what;
}

// --- 7. The step history's memory ---------------------------------------------------------------

// The process's virtual size in bytes (/proc/self/statm, first field). A reservation maps its
// pages at once although it touches none (resident memory would not show it).
long long virtual_bytes() {
  std::ifstream in("/proc/self/statm");
  long long pages = -1;
  in >> pages;
  return pages * sysconf(_SC_PAGESIZE);
}

TEST(ConfigEdge, LargestStepHistoryIsNotReservedUpFront) {
  constexpr int kMaxHistory = 1 << 20;  // docs/configuration.md
  const long long ring_bytes = static_cast<long long>(kMaxHistory) * sizeof(StepRecord);
  ASSERT_GT(ring_bytes, 400LL << 20);  // the premise: reserving it would show
  Config config;
  config.records.step_history = kMaxHistory;
  const long long before = virtual_bytes();
  ASSERT_GT(before, 0);
  {
    Pilot pilot(config, quiet_options());
    const long long after = virtual_bytes();
    EXPECT_LT(after - before, 100LL << 20) << "constructing the Pilot grew the address space by "
                                           << ((after - before) >> 20) << " MiB";
    for (int i = 0; i < 40; ++i) {
      auto step = pilot.step(1);
    }
    EXPECT_EQ(pilot.recent_steps().size(), 40u);
  }
}

TEST(ConfigEdge, StepHistoryAboveTheNewMaximumIsRefused) {
  Config config;
  config.records.step_history = 1 << 24;  // the old maximum: ~9 GiB of records once full
  const ConfigError e = expect_config_error([&] { validate(config); });
  EXPECT_EQ(e.key(), "records.step_history");
  config.records.step_history = 1 << 20;
  EXPECT_NO_THROW(validate(config));
}

// --- 8. Build options in the environment --------------------------------------------------------

TEST(ConfigEdge, BuildOptionVariablesAreIgnored) {
  Config c;
  EXPECT_NO_THROW(apply_env_overrides(c, {{"TORCHPILOT_GPU_COLLECTORS", "OFF"}}));
  ScopedEnv env("TORCHPILOT_GPU_COLLECTORS", "AUTO");
  EXPECT_NO_THROW(Config::load());
}

// Every TORCHPILOT_* option or cache variable of CMakeLists.txt is a build option, not a key.
TEST(ConfigEdge, EveryCMakeOptionIsIgnoredInTheEnvironment) {
  const std::string cmake = read_text(kSourceDir + "/CMakeLists.txt");
  static const std::regex re(
      R"(option\((TORCHPILOT_[A-Z_]+) "|set\((TORCHPILOT_[A-Z_]+) [^ ()]+ CACHE)");
  std::vector<std::string> names;
  for (auto it = std::sregex_iterator(cmake.begin(), cmake.end(), re); it != std::sregex_iterator();
       ++it) {
    names.push_back((*it)[1].matched ? (*it)[1].str() : (*it)[2].str());
  }
  ASSERT_FALSE(names.empty());
  EXPECT_NE(std::find(names.begin(), names.end(), "TORCHPILOT_GPU_COLLECTORS"), names.end());
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    Config c;
    EXPECT_NO_THROW(apply_env_overrides(c, {{name, "ON"}}));
  }
}

// A key this version renamed fails with its new name, in a file and in the environment.
TEST(ConfigEdge, ARenamedKeyNamesItsNewName) {
  auto reason = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const ConfigError& e) {
      return e.reason();
    }
    return std::string("(no error)");
  };
  const std::string yaml = reason([] {
    Config::from_yaml_string("advisors:\n  precision:\n    fp32_matmul_threshold: 0.1\n");
  });
  EXPECT_NE(yaml.find("was renamed advisors.fp32_matmul.threshold"), std::string::npos) << yaml;
  const std::string env = reason([] {
    Config c;
    apply_env_overrides(c, {{"TORCHPILOT_ADVISORS_OPTIMIZER_THRESHOLD", "0.1"}});
  });
  EXPECT_NE(env.find("was renamed advisors.per_parameter_optimizer.threshold"), std::string::npos)
      << env;
  EXPECT_EQ(reason([] { Config::from_yaml_string("advisors:\n  nothing: {a: 1}\n"); }),
            "unknown key");
}

// --- Output paths, checked at the Pilot's start -------------------------------------------------

// A Pilot made from `config` must fail: its ConfigError.
ConfigError start_error(const Config& config) {
  return expect_config_error([&] { Pilot pilot(config, quiet_options()); });
}

// A folder this process cannot create files in: a read-only folder in `dir`, or, for root (whom
// permissions do not stop), /sys. Empty when there is none.
std::string unwritable_folder(const TempDir& dir) {
  const std::string ro = dir.file("read_only");
  fs::create_directories(ro);
  ::chmod(ro.c_str(), 0555);
  for (const std::string& folder : {ro, std::string("/sys")}) {
    const std::string probe = folder + "/probe";
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return folder;
    ::close(fd);
    ::unlink(probe.c_str());
  }
  return {};
}

TEST(ConfigEdge, HtmlPathThatIsADirectoryIsRefusedAtStart) {
  TempDir dir;
  Config config;
  config.report.html_path = dir.file("");
  const ConfigError e = start_error(config);
  EXPECT_EQ(e.key(), "report.html_path");
  EXPECT_EQ(e.source(), "Config");
  EXPECT_NE(e.reason().find(std::strerror(EISDIR)), std::string::npos) << e.what();
}

TEST(ConfigEdge, HtmlPathInAFolderThatTakesNoFilesIsRefusedAtStartWithTheOsReason) {
  TempDir dir;
  const std::string folder = unwritable_folder(dir);
  if (folder.empty()) GTEST_SKIP() << "no folder here is closed to this process";
  Config config;
  config.report.html_path = folder + "/run.html";
  const ConfigError e = start_error(config);
  EXPECT_EQ(e.key(), "report.html_path");
  EXPECT_NE(e.reason().find(std::strerror(EACCES)), std::string::npos) << e.what();
  EXPECT_NE(e.reason().find(folder), std::string::npos) << e.what();
}

TEST(ConfigEdge, OneFileForTwoOutputsIsRefusedAtStart) {
  TempDir dir;
  const std::string records = dir.write("records.jsonl", "{\"earlier\":1}\n");
  fs::create_symlink(records, dir.file("link.jsonl"));
  ASSERT_EQ(::link(records.c_str(), dir.file("hard.jsonl").c_str()), 0) << std::strerror(errno);
  const std::string fresh = dir.file("fresh.jsonl");  // not there yet
  struct Case {
    std::string json, html, journal;
    std::string key, other;  // the key refused and the one it shares with
  };
  const std::vector<Case> cases = {
      {records, records, records, "report.html_path", "log.json_path"},
      {records, "", dir.file("sub/../records.jsonl"), "report.journal_path", "log.json_path"},
      {records, "", dir.file("./records.jsonl"), "report.journal_path", "log.json_path"},
      {"", dir.file("link.jsonl"), records, "report.journal_path", "report.html_path"},
      {dir.file("hard.jsonl"), "", records, "report.journal_path", "log.json_path"},
      {fresh, "", dir.file(".//fresh.jsonl"), "report.journal_path", "log.json_path"},
      // the report is written to "<html_path>.tmp" first, then renamed
      {"", dir.file("run.html"), dir.file("run.html.tmp"), "report.journal_path",
       "report.html_path"},
  };
  fs::create_directories(dir.file("sub"));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json + " | " + c.html + " | " + c.journal);
    Config config;
    config.log.json_path = c.json;
    config.report.html_path = c.html;
    config.report.journal_path = c.journal;
    const ConfigError e = start_error(config);
    EXPECT_EQ(e.key(), c.key) << e.what();
    EXPECT_NE(e.reason().find(c.other), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_text(records), "{\"earlier\":1}\n") << "refused outputs are left as they were";
  EXPECT_FALSE(fs::exists(fresh)) << "the check leaves nothing behind";
}

TEST(ConfigEdge, ARanksJournalIsCheckedAtTheFileItOpens) {
  // Rank 1's journal is "run.rank1.jsonl": the check looks at that file, shared or not.
  TempDir dir;
  const char* old_rank = std::getenv("RANK");
  const std::string saved = old_rank != nullptr ? old_rank : "";
  ::setenv("RANK", "1", 1);
  Config config;
  config.log.json_path = dir.file("run.rank1.jsonl");
  config.report.journal_path = dir.file("run.jsonl");
  const ConfigError e = start_error(config);
  EXPECT_EQ(e.key(), "report.journal_path") << e.what();
  EXPECT_NE(e.reason().find("log.json_path"), std::string::npos) << e.what();
  // Rank 1's file a folder: refused, though the configured name is free.
  fs::create_directories(dir.file("other.rank1.jsonl"));
  Config folder;
  folder.report.journal_path = dir.file("other.jsonl");
  EXPECT_EQ(start_error(folder).key(), "report.journal_path");
  if (old_rank != nullptr) {
    ::setenv("RANK", saved.c_str(), 1);
  } else {
    ::unsetenv("RANK");
  }
}

TEST(ConfigEdge, TraceDirThatTakesNoFilesIsRefusedAtStart) {
  TempDir dir;
  const std::string folder = unwritable_folder(dir);
  if (folder.empty()) GTEST_SKIP() << "no folder here is closed to this process";
  for (const std::string& trace_dir : {folder, folder + "/traces/run"}) {
    SCOPED_TRACE(trace_dir);
    Config config;
    config.report.trace_dir = trace_dir;
    const ConfigError e = start_error(config);
    EXPECT_EQ(e.key(), "report.trace_dir");
    EXPECT_NE(e.reason().find(std::strerror(EACCES)), std::string::npos) << e.what();
  }
  Config config;  // a file where the folder should be
  config.report.trace_dir = dir.write("file", "x") + "/traces";
  EXPECT_EQ(start_error(config).key(), "report.trace_dir");
}

TEST(ConfigEdge, ARefusedStartLeavesNoFileBehindAndTruncatesNothing) {
  TempDir dir;
  const std::string journal = dir.write("journal.jsonl", "{\"type\":\"start\"}\n");
  Config config;
  config.log.json_path = dir.file("records.jsonl");
  config.report.journal_path = journal;
  config.report.html_path = dir.file("missing/run.html");
  const ConfigError e = start_error(config);
  EXPECT_EQ(e.key(), "report.html_path");
  EXPECT_NE(e.reason().find(std::strerror(ENOENT)), std::string::npos) << e.what();
  EXPECT_FALSE(fs::exists(config.log.json_path)) << "an output made before the refusal";
  EXPECT_EQ(read_text(journal), "{\"type\":\"start\"}\n");
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir.file(""))) {
    left.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(left, std::vector<std::string>{"journal.jsonl"});
}

TEST(ConfigEdge, AnOutputsPathFromTheEnvironmentNamesItsVariable) {
  TempDir dir;
  ScopedEnv no_file("TORCHPILOT_CONFIG", nullptr);
  for (const std::string& path : {dir.file(""), dir.file("missing/run.html")}) {
    SCOPED_TRACE(path);
    ScopedEnv env("TORCHPILOT_REPORT_HTML_PATH", path);
    const Config config = Config::load();
    const ConfigError e = start_error(config);
    EXPECT_EQ(e.key(), "report.html_path");
    EXPECT_EQ(e.source(), "environment variable TORCHPILOT_REPORT_HTML_PATH") << e.what();
  }
  {  // from a file: its line
    const std::string yaml = dir.write("c.yaml", "report:\n  html_path: " + dir.file("") + "\n");
    const ConfigError e = start_error(Config::from_yaml_file(yaml));
    EXPECT_EQ(e.source(), yaml + ":2") << e.what();
  }
  {  // a value changed in code since it was loaded is not blamed on the variable
    ScopedEnv env("TORCHPILOT_REPORT_HTML_PATH", dir.file("run.html"));
    Config config = Config::load();
    config.report.html_path = dir.file("");
    EXPECT_EQ(start_error(config).source(), "Config");
  }
}

// --- Bytes and tags a path or a value cannot hold --------------------------------------------

TEST(ConfigEdge, NulAndControlBytesInAPathAreRefused) {
  {  // YAML's "\0": the OS would see the path cut short at it
    const ConfigError e = expect_config_error(
        [] { Config::from_yaml_string("log:\n  json_path: \"a\\0b.jsonl\"\n", "c.yaml"); });
    EXPECT_EQ(e.key(), "log.json_path");
    EXPECT_EQ(e.source(), "c.yaml:2");
    EXPECT_NE(e.reason().find("NUL"), std::string::npos) << e.what();
  }
  for (const char* text :
       {"report:\n  trace_dir: \"traces\\n\"\n", "report:\n  journal_path: \"j\\x1b[31m.jsonl\"\n",
        "gpu:\n  cupti_path: \"lib\\x7fcupti.so\"\n"}) {
    SCOPED_TRACE(text);
    const ConfigError e = expect_config_error([&] { Config::from_yaml_string(text); });
    EXPECT_NE(e.reason().find("control byte"), std::string::npos) << e.what();
  }
  {
    Config c;
    const ConfigError e = expect_config_error([&] {
      apply_env_overrides(c, {{"TORCHPILOT_REPORT_HTML_PATH", "run\t.html"}});
    });
    EXPECT_EQ(e.source(), "environment variable TORCHPILOT_REPORT_HTML_PATH");
    EXPECT_EQ(e.key(), "report.html_path");
  }
  {  // set in code: validate(), so the Pilot
    Config c;
    c.log.json_path = std::string("a\0b", 3);
    EXPECT_EQ(expect_config_error([&] { validate(c); }).key(), "log.json_path");
    EXPECT_EQ(start_error(c).key(), "log.json_path");
  }
  // Other bytes stay: spaces and UTF-8 are names like any other.
  EXPECT_EQ(
      Config::from_yaml_string("log:\n  json_path: \"r\xc3\xa9sultats 1.jsonl\"\n").log.json_path,
      "r\xc3\xa9sultats 1.jsonl");
}

TEST(ConfigEdge, TagsOutsideYamlsCoreSchemaAreRefused) {
  for (const char* text :
       {"report:\n  html_path: !!binary cnVuLmh0bWw=\n", "report:\n  html_path: !local run.html\n",
        "gpu: !!omap\n  - enabled: true\n", "cost:\n  budget: !!timestamp 0.1\n",
        "autotune:\n  prefetch_choices: [1, !!binary Mg==]\n", "? !!binary bW9kZQ==\n: off\n"}) {
    SCOPED_TRACE(text);
    const ConfigError e = expect_config_error([&] { Config::from_yaml_string(text, "c.yaml"); });
    EXPECT_NE(e.reason().find("YAML tag"), std::string::npos) << e.what();
    EXPECT_EQ(e.source().rfind("c.yaml:", 0), 0u) << e.what();
  }
  const ConfigError e = expect_config_error(
      [] { Config::from_yaml_string("report:\n  html_path: !!binary cnVuLmh0bWw=\n"); });
  EXPECT_EQ(e.key(), "report.html_path");
  EXPECT_NE(e.reason().find("!!binary"), std::string::npos) << e.what();
  // The core schema's tags, and quotes (the non-specific tag "!"), are read as before.
  const Config c = Config::from_yaml_string(
      "mode: !!str advise\nreport:\n  html_path: !!str 'run.html'\n  prometheus_port: !!int 0\n"
      "cost: !!map\n  budget: !!float 0.02\ngpu:\n  enabled: !!bool true\n"
      "autotune:\n  prefetch_choices: !!seq [1, !!int 2]\nlog:\n  json_path: ! ''\n");
  EXPECT_EQ(c.report.html_path, "run.html");
  EXPECT_DOUBLE_EQ(c.cost.budget, 0.02);
  EXPECT_EQ(c.autotune.prefetch_choices, (std::vector<int>{1, 2}));
}

}  // namespace
}  // namespace torchpilot
