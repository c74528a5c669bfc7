// docs/architecture.md lists what is registered: every default collector, sink and advisor that
// the full library (torchpilot::torchpilot: core, GPU collectors, LibTorch hooks) registers is
// named there in backticks. A registration the page does not name fails here.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "torchpilot/runtime/core/advisor_registry.h"
#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/sink.h"

namespace torchpilot {
namespace {

std::string architecture_page() {
  std::ifstream in(std::string(TORCHPILOT_SOURCE_DIR) + "/docs/architecture.md");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool names(const std::string& page, const std::string& name) {
  return page.find("`" + name + "`") != std::string::npos;
}

TEST(ArchitectureDoc, NamesEveryRegisteredCollectorSinkAndAdvisor) {
  const std::string page = architecture_page();
  ASSERT_FALSE(page.empty()) << "docs/architecture.md not found";
  const auto collectors = default_collectors();
  EXPECT_GE(collectors.size(), 3u) << "the stall tracker, the journal, the GPU monitor at least";
  for (const auto& c : collectors) EXPECT_TRUE(names(page, c.name)) << "collector " << c.name;
  const auto sinks = default_sinks();
  EXPECT_GE(sinks.size(), 4u);
  for (const auto& s : sinks) EXPECT_TRUE(names(page, s.name)) << "sink " << s.name;
  const auto advisors = registered_advisors();
  EXPECT_GE(advisors.size(), 18u);
  for (const auto& a : advisors) EXPECT_TRUE(names(page, a.id)) << "advisor " << a.id;
}

}  // namespace
}  // namespace torchpilot
