// Advice the run's own tuning answered (runtime/tune/answered.h): the JPEG example's epoch 0 said
// "prefetch 8", the tuner measured 8 worse and kept 4, and the log and the JSON lines kept the
// advice as if it stood. They now mark it, by the rule the HTML report's findings use.
#include "torchpilot/runtime/tune/answered.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "temp_dir.h"
#include "torchpilot/runtime/reports/findings.h"
#include "torchpilot/runtime/reports/sinks.h"

namespace torchpilot {
namespace {

Advice given(const std::string& id, const std::string& action) {
  Advice a;
  a.id = id;
  a.epoch = 0;
  a.action = action;
  a.expected_gain = 0.3;
  return a;
}

TuningDecision kept_prefetch_4() {
  TuningDecision d;
  d.policy = "loader coordinate search";
  d.baseline = {{"loader.workers", 4}, {"loader.prefetch", 4}};
  d.chosen = {{"loader.workers", 4}, {"loader.prefetch", 4}};
  d.decided_at_step = 150;
  TrialResult base;
  base.setting = d.baseline;
  TrialResult deeper;
  deeper.setting = {{"loader.workers", 4}, {"loader.prefetch", 8}};
  d.trials = {base, deeper};
  return d;
}

const std::vector<Advice> kEpoch0 = {
    given("data_starvation", "prefetch deeper (e.g. 8 batches per worker)"),
    given("periodic_stall", "checkpoint asynchronously")};

TEST(AnsweredTest, TheLogMarksTheAdviceTheDecisionAnswered) {
  std::ostringstream out;
  auto logger = std::make_shared<spdlog::logger>(
      "answered", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  logger->set_pattern("%v");
  const auto sink = make_log_sink(logger);
  EpochSummary e0;
  e0.steps = 100;
  sink->on_epoch(e0, kEpoch0);
  sink->on_decision(kept_prefetch_4());
  const std::string log = out.str();
  EXPECT_NE(log.find("answered by tuning: data_starvation of epoch 0 (\"prefetch deeper (e.g. 8 "
                     "batches per worker)\"): the tuner measured its settings and kept "
                     "loader.prefetch=4 loader.workers=4"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("answered by tuning: periodic_stall"), std::string::npos)
      << "no knob of the tuner's: not answered";
}

TEST(AnsweredTest, TheJsonDecisionRecordListsItAsTheFindingsDo) {
  torchpilot_test::TempDir dir;
  const std::string path = dir.file("records.jsonl");
  {
    const auto sink = make_json_lines_sink(path);
    EpochSummary e0;
    e0.steps = 100;
    sink->on_epoch(e0, kEpoch0);
    sink->on_decision(kept_prefetch_4());
    sink->flush();
  }
  std::ifstream in(path);
  std::string line;
  nlohmann::json decision;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") == "tuning_decision") decision = j;
  }
  ASSERT_TRUE(decision.contains("answered")) << decision.dump();
  ASSERT_EQ(decision["answered"].size(), 1u) << decision.dump();
  EXPECT_EQ(decision["answered"][0]["id"], "data_starvation");
  EXPECT_EQ(decision["answered"][0]["epoch"], 0);
  EXPECT_EQ(decision["answered"][0]["kept"], "loader.prefetch=4 loader.workers=4");
  // The HTML report's findings: the same advice answered, with the same setting.
  std::vector<EpochSummary> epochs(1);
  epochs[0].steps = 100;
  const TuningDecision d = kept_prefetch_4();
  const Findings f = rank_findings(epochs, {kEpoch0}, &d);
  ASSERT_EQ(f.answered.size(), 1u);
  EXPECT_EQ(f.answered[0].id, "data_starvation");
  EXPECT_EQ(f.answered[0].tuned_setting, decision["answered"][0]["kept"]);
}

// Advice given again after the decision is not answered by it: the next decision (a second
// search) answers only what was noted since.
TEST(AnsweredTest, AnAnswerIsGivenOnce) {
  AnsweredAdvice answered;
  answered.note(kEpoch0);
  EXPECT_EQ(answered.answer(kept_prefetch_4()).size(), 1u);
  EXPECT_TRUE(answered.answer(kept_prefetch_4()).empty());
  TuningDecision none = kept_prefetch_4();
  none.chosen = {{"batch.micro", 8}};
  answered.note(kEpoch0);
  EXPECT_TRUE(answered.answer(none).empty()) << "the decision set no loader knob";
}

}  // namespace
}  // namespace torchpilot
