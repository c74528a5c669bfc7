// The HTML report's findings (runtime/reports/findings.h): the run's advice deduplicated across
// epochs, ranked by gain, with its trend and what auto-tune answered; on synthetic epochs.
#include "torchpilot/runtime/reports/findings.h"

#include <gtest/gtest.h>

namespace torchpilot {
namespace {

Advice advice(const std::string& id, double gain, Severity severity = Severity::kWarning) {
  Advice a;
  a.id = id;
  a.severity = severity;
  a.expected_gain = gain;
  a.evidence = {{"figure", 10 * gain, "fraction"}};
  return a;
}

// Epochs of 100 steps each, numbered from 0.
std::vector<EpochSummary> epochs(int n) {
  std::vector<EpochSummary> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    out[static_cast<size_t>(i)].epoch = i;
    out[static_cast<size_t>(i)].first_step = 100 * i;
    out[static_cast<size_t>(i)].steps = 100;
  }
  return out;
}

std::vector<std::string> ids(const std::vector<Finding>& findings) {
  std::vector<std::string> out;
  for (const Finding& f : findings)
    out.push_back(f.id + (f.subject.empty() ? "" : "/" + f.subject));
  return out;
}

TEST(FindingsTest, AdviceRepeatedOverEpochsIsOneFindingRankedByItsLatestGain) {
  // 3 epochs, 7 advice, 3 findings: the epoch order (host_bound first) is not the rank order.
  const std::vector<std::vector<Advice>> given = {
      {advice("host_bound", 0.10), advice("low_mfu", 0.05)},
      {advice("host_bound", 0.12), advice("exposed_communication", 0.30)},
      {advice("host_bound", 0.08), advice("exposed_communication", 0.42),
       advice("low_mfu", 0.20, Severity::kInfo)}};
  const Findings f = rank_findings(epochs(3), given, nullptr);
  EXPECT_EQ(ids(f.ranked),
            (std::vector<std::string>{"exposed_communication", "low_mfu", "host_bound"}));
  EXPECT_TRUE(f.answered.empty());
  EXPECT_TRUE(f.earlier.empty());
  const Finding& top = f.ranked[0];
  ASSERT_EQ(top.trend.size(), 2u);
  EXPECT_EQ(top.trend[0].epoch, 1);
  EXPECT_DOUBLE_EQ(top.trend[0].gain, 0.30);
  EXPECT_DOUBLE_EQ(top.trend[1].gain, 0.42);
  EXPECT_DOUBLE_EQ(top.trend[1].figure, 4.2);
  EXPECT_DOUBLE_EQ(top.latest.expected_gain, 0.42);
  EXPECT_EQ(f.ranked[2].trend.size(), 3u);  // host_bound: every epoch
}

TEST(FindingsTest, EqualGainsRankByTheHigherSeverityAndUnestimatedGainsLast) {
  const std::vector<std::vector<Advice>> given = {{advice("a_info", 0.2, Severity::kInfo),
                                                   advice("no_gain", 0, Severity::kHigh),
                                                   advice("b_high", 0.2, Severity::kHigh)}};
  const Findings f = rank_findings(epochs(1), given, nullptr);
  EXPECT_EQ(ids(f.ranked), (std::vector<std::string>{"b_high", "a_info", "no_gain"}));
}

TEST(FindingsTest, TheSameAdviceAboutTwoSubjectsIsTwoFindings) {
  Advice rank1 = advice("straggler_rank", 0.1);
  rank1.evidence.push_back({"rank", 1, "rank"});
  Advice rank3 = advice("straggler_rank", 0.3);
  rank3.evidence.push_back({"rank", 3, "rank"});
  const Findings f = rank_findings(epochs(2), {{rank1}, {rank1, rank3}}, nullptr);
  EXPECT_EQ(ids(f.ranked),
            (std::vector<std::string>{"straggler_rank/rank 3", "straggler_rank/rank 1"}));
  EXPECT_EQ(f.ranked[1].trend.size(), 2u);
}

TEST(FindingsTest, AdviceWhoseKnobsTheTunerDecidedIsAnsweredUnlessItCameBack) {
  TuningDecision d;
  d.chosen = {{"loader.workers", 4}, {"loader.prefetch", 2}, {"loader.pin_memory", 1}};
  d.decided_at_step = 150;  // inside epoch 1
  // data_starvation in epochs 0-1 (before and while deciding), none after: answered.
  // pageable_copies in epoch 2 too, begun after the decision: not answered, still ranked.
  const std::vector<std::vector<Advice>> given = {
      {advice("data_starvation", 0.6), advice("pageable_copies", 0.05)},
      {advice("data_starvation", 0.5)},
      {advice("pageable_copies", 0.04), advice("host_sync", 0.1)}};
  const Findings f = rank_findings(epochs(3), given, &d);
  ASSERT_EQ(ids(f.answered), (std::vector<std::string>{"data_starvation"}));
  EXPECT_EQ(f.answered[0].tuned_setting, "loader.prefetch=2 loader.workers=4");
  EXPECT_EQ(ids(f.ranked), (std::vector<std::string>{"host_sync", "pageable_copies"}));
  EXPECT_EQ(f.ranked[1].tuned_setting, "loader.pin_memory=1");
  EXPECT_TRUE(f.ranked[0].tuned_setting.empty());
}

TEST(FindingsTest, WithoutADecisionTuningAnswersNothing) {
  const Findings f = rank_findings(epochs(1), {{advice("data_starvation", 0.6)}}, nullptr);
  EXPECT_EQ(ids(f.ranked), (std::vector<std::string>{"data_starvation"}));
  EXPECT_TRUE(f.ranked[0].tuned_setting.empty());
}

TEST(FindingsTest, AdviceNoLongerGivenIsEarlierNotRanked) {
  const std::vector<std::vector<Advice>> given = {
      {advice("host_bound", 0.9), advice("low_mfu", 0.1)}, {advice("host_sync", 0.2)}, {}};
  Findings f = rank_findings(epochs(3), given, nullptr);
  EXPECT_TRUE(f.ranked.empty());  // the last epoch gave none
  EXPECT_EQ(ids(f.earlier), (std::vector<std::string>{"host_sync", "host_bound", "low_mfu"}));
  f = rank_findings(epochs(2), {given[0], given[1]}, nullptr);
  EXPECT_EQ(ids(f.ranked), (std::vector<std::string>{"host_sync"}));
  EXPECT_EQ(ids(f.earlier), (std::vector<std::string>{"host_bound", "low_mfu"}));
}

TEST(FindingsTest, NoEpochsNoFindings) {
  const Findings f = rank_findings({}, {}, nullptr);
  EXPECT_TRUE(f.ranked.empty() && f.answered.empty() && f.earlier.empty());
}

}  // namespace
}  // namespace torchpilot
