// The run journal: ETTR across restarts, the work lost at each failure, the checkpoint advice.
#include "torchpilot/runtime/reports/run_journal.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "fakes/string_logger.h"
#include "temp_dir.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/core/pilot.h"

namespace torchpilot {
namespace {

TEST(RunJournalTest, EttrCountsTheWorkAFailedRunLostAfterItsLastCheckpoint) {
  // Run 1 starts at 0, checkpoints at 100, is last heard of at 150 (crash); run 2 starts at 160,
  // checkpoints at 260 and stops cleanly at 300.
  const std::vector<JournalRecord> r = {{"start", 0, 0},         {"checkpoint", 100, 10},
                                        {"progress", 150, 15},   {"start", 160, 0},
                                        {"checkpoint", 260, 20}, {"stop", 300, 14}};
  const RunJournalStats s = journal_stats(r, 300, false);
  EXPECT_EQ(s.runs, 2);
  EXPECT_EQ(s.failures, 1);
  EXPECT_EQ(s.checkpoints, 2);
  EXPECT_DOUBLE_EQ(s.wall_s, 300);
  EXPECT_DOUBLE_EQ(s.lost_s, 50);
  EXPECT_DOUBLE_EQ(s.productive_s, 150 + 140 - 50);
  EXPECT_DOUBLE_EQ(s.ettr, 240.0 / 300);
  EXPECT_DOUBLE_EQ(s.mtbf_s, 300);
  EXPECT_DOUBLE_EQ(s.checkpoint_interval_s, 290.0 / 2);
  // The running run's missing stop is no failure; a crashed run without checkpoints lost it all.
  const RunJournalStats t =
      journal_stats({{"start", 0, 0}, {"progress", 50, 5}, {"start", 60, 0}}, 100, true);
  EXPECT_EQ(t.failures, 1);
  EXPECT_DOUBLE_EQ(t.lost_s, 50);
  EXPECT_DOUBLE_EQ(t.ettr, 40.0 / 100);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST(RunJournalTest, APilotAppendsItsRunAndAdvisesCheckpointsForTheFailureRate) {
  torchpilot_test::TempDir dir;
  const std::string path = dir.file("journal.jsonl");
  const double t0 = now_s() - 1000;
  {
    // An earlier run that crashed 500 s in, having checkpointed once, 10 s in; and a torn line.
    std::ofstream out(path);
    out << "{\"type\":\"start\",\"unix_time_s\":" << std::fixed << t0 << ",\"steps\":0}\n"
        << "{\"type\":\"checkpoint\",\"unix_time_s\":" << t0 + 10 << ",\"steps\":100}\n"
        << "{\"type\":\"progress\",\"unix_time_s\":" << t0 + 500 << ",\"steps\":5000}\n"
        << "{\"type\":\"progr";
  }
  std::ostringstream log;
  PilotOptions o;
  o.logger = test::string_logger("journal-test", log);
  o.default_collectors = false;
  auto sink = std::make_shared<RecordingSink>();
  o.sinks = {sink};
  Config c;
  c.gpu.enabled = false;
  c.report.journal_path = path;
  {
    Pilot pilot(c, o);
    EXPECT_NE(log.str().find("run 2, 1 failures before it, ETTR"), std::string::npos) << log.str();
    for (int i = 0; i < 3; ++i) auto s = pilot.step(1);
    pilot.checkpoint_saved(5003);
    pilot.end_epoch();
    ASSERT_EQ(sink->epochs.size(), 1u);
    const RunJournalStats* j = sink->epochs[0].sections.get<RunJournalStats>();
    ASSERT_NE(j, nullptr);
    EXPECT_EQ(j->runs, 2);
    EXPECT_EQ(j->failures, 1);
    EXPECT_EQ(j->checkpoints, 2);
    EXPECT_NEAR(j->lost_s, 490, 1e-3);
    EXPECT_NEAR(j->ettr, 0.01, 0.002);  // 10 s kept of run 1, ~0 of this one, over ~1000 s
    // Checkpoints about every 250 s against a failure every ~1000 s: ~12.5% lost.
    const auto& advice = sink->advice[0];
    auto it = std::find_if(advice.begin(), advice.end(),
                           [](const Advice& a) { return a.id == "checkpoint"; });
    ASSERT_NE(it, advice.end()) << log.str();
    EXPECT_NEAR(it->expected_gain, (1 - 0.025) / (1 - 0.125) - 1, 0.01);
    EXPECT_NE(it->action.find("every 50 s"), std::string::npos) << it->action;
  }
  // This run's records, ending with a clean stop.
  const std::vector<JournalRecord> r = read_journal(path);
  ASSERT_GE(r.size(), 6u);
  EXPECT_EQ(r[3].type, "start");
  EXPECT_EQ(r.back().type, "stop");
  EXPECT_EQ(r.back().steps, 3);
  bool checkpoint = false;
  for (size_t i = 3; i < r.size(); ++i)
    checkpoint |= r[i].type == "checkpoint" && r[i].steps == 5003;
  EXPECT_TRUE(checkpoint);
  // Read again, the finished run is no failure.
  EXPECT_EQ(journal_stats(r, now_s(), false).failures, 1);
}

TEST(RunJournalTest, NoFailuresNoCheckpointAdvice) {
  EpochSummary s;
  RunJournalStats j =
      journal_stats({{"start", 0, 0}, {"stop", 100, 10}, {"start", 110, 0}}, 200, true);
  s.sections.set(j);
  EXPECT_FALSE(advise_checkpoint(s, AdvisorsConfig{}));
  EXPECT_FALSE(advise_checkpoint(EpochSummary{}, AdvisorsConfig{}));
}

TEST(RunJournalTest, AJournalThatCannotBeOpenedStopsStartUp) {
  torchpilot_test::TempDir dir;
  Config c;
  c.gpu.enabled = false;
  c.report.journal_path = dir.file("no/such/dir/journal.jsonl");
  EXPECT_THROW(Pilot(c, PilotOptions{}), ConfigError);
}

}  // namespace
}  // namespace torchpilot
