// A subsystem added without touching a file outside its folders (runtime/toy/, advisors/toy/):
// its config section loads from YAML, the environment and code; its collector, advisor and HTML
// panel join every Pilot through the kernel's registries. Its own executable: the registered
// keys must not reach the main suite's check that configs/default.yaml documents every key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>

#include "runtime/toy/toy.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/reports/sinks.h"

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1000000;

std::string config_error_key(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.key();
  }
  return "(no error)";
}

TEST(ToySubsystem, ItsConfigSectionLoadsLikeABuiltInOne) {
  Config c =
      Config::from_yaml_string("toy:\n  slow_ms: 5\nadvisors:\n  toy:\n    threshold: 0.5\n");
  EXPECT_DOUBLE_EQ(c.section<toy::ToyConfig>().slow_ms, 5);
  EXPECT_TRUE(c.section<toy::ToyConfig>().enabled);  // a default
  EXPECT_DOUBLE_EQ(c.section<toy::ToyAdvisorConfig>().threshold, 0.5);

  apply_env_overrides(c, {{"TORCHPILOT_TOY_SLOW_MS", "7"}, {"TORCHPILOT_TOY_ENABLED", "false"}});
  EXPECT_DOUBLE_EQ(c.section<toy::ToyConfig>().slow_ms, 7);
  EXPECT_FALSE(c.section<toy::ToyConfig>().enabled);

  // Errors name the key, as for built-in keys.
  EXPECT_EQ(config_error_key([] { Config::from_yaml_string("toy:\n  slow_ms: -1\n"); }),
            "toy.slow_ms");
  EXPECT_EQ(config_error_key([] { Config::from_yaml_string("toy:\n  nope: 1\n"); }), "toy.nope");
  EXPECT_EQ(config_error_key([] {
              Config x;
              apply_env_overrides(x, {{"TORCHPILOT_ADVISORS_TOY_THRESHOLD", "2"}});
            }),
            "advisors.toy.threshold");
  Config built;
  built.section<toy::ToyConfig>().slow_ms = -3;
  EXPECT_EQ(config_error_key([&] { validate(built); }), "toy.slow_ms");

  const auto keys = config_keys();
  for (const char* k : {"toy.slow_ms", "toy.enabled", "advisors.toy.threshold"}) {
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
  }
  const auto values = config_values(c);
  EXPECT_NE(std::find(values.begin(), values.end(),
                      std::make_pair(std::string("toy.slow_ms"), std::string("7"))),
            values.end());

  // A Config is a value: a copy's section is its own.
  Config copy = c;
  copy.section<toy::ToyConfig>().slow_ms = 9;
  EXPECT_DOUBLE_EQ(c.section<toy::ToyConfig>().slow_ms, 7);
}

struct ToyRun {
  std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
  std::string html;
};

ToyRun run_epoch(Config config, int slow, int fast) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("toy_subsystem_" + std::to_string(::getpid()) + "_" + std::to_string(slow));
  std::filesystem::create_directories(dir);
  config.gpu.enabled = false;
  config.report.html_path = (dir / "report.html").string();
  ToyRun run;
  auto clock = std::make_shared<ManualClock>();
  PilotOptions options;
  options.clock = clock;
  options.sinks = {run.sink};
  options.default_collectors = false;  // no device collectors; the toy's is `always`
  {
    Pilot pilot(config, options);
    for (int i = 0; i < slow + fast; ++i) {
      auto step = pilot.step(1);
      clock->advance(i < slow ? 20 * kMs : 1 * kMs);
    }
    pilot.end_epoch();
  }
  std::ifstream in(config.report.html_path);
  std::stringstream text;
  text << in.rdbuf();
  run.html = text.str();
  std::filesystem::remove_all(dir);
  return run;
}

TEST(ToySubsystem, ItsCollectorAdvisorAndPanelJoinThePilot) {
  Config config;
  config.section<toy::ToyConfig>().slow_ms = 10;
  const ToyRun run = run_epoch(config, 6, 4);

  ASSERT_EQ(run.sink->epochs.size(), 1u);
  const toy::ToyStats* stats = run.sink->epochs[0].sections.get<toy::ToyStats>();
  ASSERT_NE(stats, nullptr) << "the collector's section";
  EXPECT_EQ(stats->steps, 10);
  EXPECT_EQ(stats->slow_steps, 6);
  const auto lines = format_epoch(run.sink->epochs[0], {});
  EXPECT_NE(std::find(lines.begin(), lines.end(), "  toy: 6 of 10 steps slow"), lines.end());

  const auto& advice = run.sink->advice[0];
  const auto toy =
      std::find_if(advice.begin(), advice.end(), [](const Advice& a) { return a.id == "toy"; });
  ASSERT_NE(toy, advice.end()) << "the advisor's advice";
  EXPECT_DOUBLE_EQ(toy->evidence.at(0).value, 0.6);

  EXPECT_NE(run.html.find("<section id=\"toy-panel\">"), std::string::npos) << "the panel";
  EXPECT_NE(run.html.find("<tr><td>0</td><td>6</td></tr>"), std::string::npos);
}

TEST(ToySubsystem, ItsSettingsGovernIt) {
  Config quiet;
  quiet.section<toy::ToyConfig>().slow_ms = 10;
  quiet.section<toy::ToyAdvisorConfig>().threshold = 0.9;  // 60% slow: no advice
  const ToyRun a = run_epoch(quiet, 6, 4);
  EXPECT_EQ(a.sink->epochs.at(0).sections.get<toy::ToyStats>()->slow_steps, 6);
  for (const Advice& x : a.sink->advice.at(0)) EXPECT_NE(x.id, "toy");

  Config off;
  off.section<toy::ToyConfig>().enabled = false;  // no collector: no section, no advice, no panel
  const ToyRun b = run_epoch(off, 6, 4);
  EXPECT_EQ(b.sink->epochs.at(0).sections.get<toy::ToyStats>(), nullptr);
  EXPECT_EQ(b.html.find("toy-panel"), std::string::npos);
}

}  // namespace
}  // namespace torchpilot
