// The run journal: ETTR across restarts, the work lost at each failure, the checkpoint advice.
#include "torchpilot/runtime/reports/run_journal.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "fakes/scoped_env.h"
#include "fakes/string_logger.h"
#include "fakes/text.h"
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

// A Pilot on a journal, logging into a string; each epoch goes to `sink`.
struct JournalRig {
  explicit JournalRig(const std::string& journal_path) {
    c.gpu.enabled = false;
    c.report.journal_path = journal_path;
  }
  PilotOptions options() {
    PilotOptions o;
    o.logger = test::string_logger("journal-rig", log);
    o.logger->set_pattern("%v");
    o.default_collectors = false;
    o.sinks = {sink};
    return o;
  }
  std::ostringstream log;
  std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
  Config c;
};

std::string record(const char* type, const std::string& time, const std::string& steps) {
  return std::string("{\"type\":\"") + type + "\",\"unix_time_s\":" + time + ",\"steps\":" + steps +
         "}\n";
}

TEST(RunJournalTest, ARecordWithAWrongTypedFieldIsSkippedWithOneLineNamingFileLineAndKey) {
  torchpilot_test::TempDir dir;
  const std::string t0 = std::to_string(now_s() - 1000);
  const std::string t500 = std::to_string(now_s() - 500);
  // Line 1 starts a run that crashed 500 s in; lines 2-4 are records with wrong-typed fields.
  const std::string path = dir.write(
      "journal.jsonl", record("start", t0, "0") + record("progress", "\"abc\"", "5") +
                           record("progress", t500, "\"many\"") +
                           record("checkpoint", "null", "1") + record("progress", t500, "5000"));
  JournalRig rig(path);
  std::unique_ptr<Pilot> pilot;
  ASSERT_NO_THROW(pilot = std::make_unique<Pilot>(rig.c, rig.options()));
  const std::string log = rig.log.str();
  // One line: the file and line of the first, its key, what was expected, how many in all.
  EXPECT_EQ(test::count_of(log, "skipped"), 1u) << log;
  EXPECT_NE(log.find(path + ":2: unix_time_s is a string, expected a number"), std::string::npos)
      << log;
  EXPECT_NE(log.find("3 invalid records skipped"), std::string::npos) << log;
  EXPECT_EQ(log.find("type_error"), std::string::npos) << log;
  // The valid records still give the earlier run and its failure.
  EXPECT_NE(log.find("run 2, 1 failures before it"), std::string::npos) << log;
  auto s = pilot->step(1);
  s.end();
  pilot->end_epoch();
  ASSERT_EQ(rig.sink->epochs.size(), 1u);
  const RunJournalStats* j = rig.sink->epochs[0].sections.get<RunJournalStats>();
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(j->failures, 1);
  EXPECT_NEAR(j->lost_s, 500, 1);
}

TEST(RunJournalTest, ATimeNoRunHadIsAnInvalidRecord) {
  // A time of -1e300 would make an MTBF of 1e300 s and a checkpoint interval past any integer.
  torchpilot_test::TempDir dir;
  const std::string t0 = std::to_string(now_s() - 1000);
  const std::string path = dir.write(
      "journal.jsonl", record("start", t0, "0") + record("progress", "-1e300", "5") +
                           record("progress", "1e300", "5") + record("progress", t0, "-3"));
  JournalRig rig(path);
  std::unique_ptr<Pilot> pilot;
  ASSERT_NO_THROW(pilot = std::make_unique<Pilot>(rig.c, rig.options()));
  const std::string log = rig.log.str();
  EXPECT_NE(log.find("3 invalid records skipped"), std::string::npos) << log;
  EXPECT_NE(log.find(path + ":2: unix_time_s is"), std::string::npos) << log;
}

// Waits at most `bound_s` for `pid` to exit; kills it if it does not. Its exit code, or -1 when
// it had to be killed (or died of a signal).
int wait_bounded(pid_t pid, double bound_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(bound_s);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// In a child process (a hang there cannot hang the test): a Pilot on `journal`. Exit code 0: it
// refused the path with a ConfigError naming report.journal_path and "not a regular file".
int pilot_start_in_child(const std::string& journal) {
  const pid_t pid = fork();
  if (pid == 0) {
    int code = 3;
    try {
      JournalRig rig(journal);
      Pilot pilot(rig.c, rig.options());
      code = 2;
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      code = what.find("report.journal_path") != std::string::npos &&
                     what.find("not a regular file") != std::string::npos
                 ? 0
                 : 1;
    } catch (...) {
    }
    _exit(code);
  }
  return wait_bounded(pid, 10);
}

TEST(RunJournalTest, AFifoOrADeviceAsTheJournalIsRefusedWithoutBlocking) {
  torchpilot_test::TempDir dir;
  const std::string fifo = dir.file("journal.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  // -1: hung (killed after 10 s); 1: another reason; 2: accepted.
  EXPECT_EQ(pilot_start_in_child(fifo), 0);
  EXPECT_EQ(pilot_start_in_child("/dev/zero"), 0);  // read without end
  EXPECT_EQ(pilot_start_in_child("/dev/full"), 0);
  EXPECT_TRUE(read_journal(fifo).empty());
}

TEST(RunJournalTest, AJournalPastTheReadBoundIsReadFromItsTail) {
  torchpilot_test::TempDir dir;
  const std::string path = dir.file("journal.jsonl");
  {
    // 512 MiB without a line end (a sparse file: no disk), a line of 100 KiB, then a crashed run.
    std::ofstream out(path);
    out.seekp((int64_t{512} << 20) - 1);
    out << '\n' << std::string(100 << 10, 'x') << '\n';
    out << record("start", std::to_string(now_s() - 1000), "0");
    out << record("progress", std::to_string(now_s() - 500), "5000");
  }
  JournalRig rig(path);
  Pilot pilot(rig.c, rig.options());
  const std::string log = rig.log.str();
  EXPECT_NE(log.find("only its last 64 MiB read"), std::string::npos) << log;
  EXPECT_NE(log.find("longer than 65536 bytes"), std::string::npos) << log;
  EXPECT_NE(log.find("run 2, 1 failures before it"), std::string::npos) << log;
}

// Every rank of a torchrun job given one config: each keeps its own journal, and neither takes
// the other's records for a run of its own that failed.
TEST(RunJournalTest, RanksSharingAConfigReportNoFailureThatNeverHappened) {
  torchpilot_test::TempDir dir;
  const std::string path = dir.file("journal.jsonl");
  JournalRig rig0(path), rig1(path), again(path);
  {
    std::unique_ptr<Pilot> rank0, rank1;
    {
      test::ScopedEnv rank("RANK", "0");
      rank0 = std::make_unique<Pilot>(rig0.c, rig0.options());
    }
    {
      test::ScopedEnv rank("RANK", "1");
      rank1 = std::make_unique<Pilot>(rig1.c, rig1.options());
    }
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (Pilot* p : {rank0.get(), rank1.get()}) {
        auto s = p->step(1);
      }
      rank0->checkpoint_saved(epoch);
      rank1->checkpoint_saved(epoch);
      rank0->end_epoch();
      rank1->end_epoch();
    }
    for (const auto* rig : {&rig0, &rig1}) {
      ASSERT_EQ(rig->sink->epochs.size(), 2u);
      const RunJournalStats* j = rig->sink->epochs[1].sections.get<RunJournalStats>();
      ASSERT_NE(j, nullptr);
      EXPECT_EQ(j->runs, 1) << rig->log.str();
      EXPECT_EQ(j->failures, 0) << rig->log.str();
    }
  }
  const std::vector<JournalRecord> rank1 = read_journal(dir.file("journal.rank1.jsonl"));
  ASSERT_FALSE(rank1.empty());
  EXPECT_EQ(rank1.back().type, "stop");
  // The job's next start, rank 0: one clean run before it.
  test::ScopedEnv rank("RANK", "0");
  Pilot next(again.c, again.options());
  EXPECT_NE(again.log.str().find("run 2, 0 failures before it"), std::string::npos)
      << again.log.str();
}

// Two runs appending to one file at once (two jobs given one journal): each record names its
// run, and the reader keeps the runs apart.
double g_now = 0;
double fake_now() { return g_now; }

TEST(RunJournalTest, InterleavedRunsInOneFileAreReadApart) {
  torchpilot_test::TempDir dir;
  const std::string path = dir.file("journal.jsonl");
  g_now = 1000;
  auto a = std::make_unique<RunJournal>(path, &fake_now);
  g_now = 1010;
  auto b = std::make_unique<RunJournal>(path, &fake_now);
  g_now = 1100;
  a->checkpoint_saved(10);
  g_now = 1110;
  b->checkpoint_saved(10);
  g_now = 1200;
  a.reset();  // its stop comes after b's start and checkpoint
  g_now = 1300;
  b.reset();
  const RunJournalStats s = journal_stats(read_journal(path), 1300, false);
  EXPECT_EQ(s.runs, 2);
  EXPECT_EQ(s.failures, 0);
  EXPECT_DOUBLE_EQ(s.lost_s, 0);
  EXPECT_EQ(s.checkpoints, 2);
}

TEST(RunJournalTest, EachRankHasAJournalOfItsOwn) {
  EXPECT_EQ(journal_path_for_rank("/a/run.journal.jsonl", nullptr), "/a/run.journal.jsonl");
  EXPECT_EQ(journal_path_for_rank("/a/run.journal.jsonl", "0"), "/a/run.journal.jsonl");
  EXPECT_EQ(journal_path_for_rank("/a/run.journal.jsonl", "3"), "/a/run.journal.rank3.jsonl");
  EXPECT_EQ(journal_path_for_rank("/a.b/journal", "12"), "/a.b/journal.rank12");
  EXPECT_EQ(journal_path_for_rank(".journal", "1"), ".journal.rank1");
  EXPECT_EQ(journal_path_for_rank("j.jsonl", "../x"), "j.jsonl");  // not a rank
}

// A full disk: every write from the third on fails with ENOSPC.
int g_writes_left = 0;
ssize_t full_disk_write(int fd, const void* data, size_t size) {
  if (g_writes_left-- > 0) return ::write(fd, data, size);
  errno = ENOSPC;
  return -1;
}

TEST(RunJournalTest, AFullDiskIsLoggedOnceAndMarksTheEttrIncomplete) {
  torchpilot_test::TempDir dir;
  const std::string path = dir.file("journal.jsonl");
  g_writes_left = 2;   // the start record and the first progress record
  JournalRig rig("");  // the journal is given, not made from the config
  PilotOptions o = rig.options();
  o.collectors = {std::make_shared<RunJournal>(path, nullptr, &full_disk_write)};
  {
    Pilot pilot(rig.c, o);
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (int i = 0; i < 3; ++i) auto s = pilot.step(1);
      pilot.checkpoint_saved(epoch);
      pilot.end_epoch();
    }
    ASSERT_EQ(rig.sink->epochs.size(), 2u);
    const RunJournalStats* j = rig.sink->epochs[1].sections.get<RunJournalStats>();
    ASSERT_NE(j, nullptr);
    EXPECT_EQ(j->write_error, std::strerror(ENOSPC));
  }
  const std::string log = rig.log.str();
  EXPECT_EQ(test::count_of(log, "a record could not be written"), 1u) << log;
  EXPECT_EQ(
      test::count_of(log, path + ": a record could not be written (" + std::strerror(ENOSPC) + ")"),
      1u)
      << log;
  // Each epoch line says the journal lacks this run's records.
  EXPECT_EQ(test::count_of(log, "incomplete: this run's records are not all in the journal"), 2u)
      << log;
  // What did reach the file: the start and the first progress.
  const std::vector<JournalRecord> r = read_journal(path);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].type, "start");
}

// When space comes back, the next record starts on a line of its own after one cut short.
int g_cut_at = -1;
bool g_fail_next = false;
ssize_t cut_once_write(int fd, const void* data, size_t size) {
  if (g_fail_next) {
    g_fail_next = false;
    errno = ENOSPC;
    return -1;
  }
  if (g_cut_at-- == 0) {
    g_fail_next = true;  // half a record, then a full disk
    return ::write(fd, data, size / 2);
  }
  return ::write(fd, data, size);
}

TEST(RunJournalTest, ARecordCutShortByAFullDiskDoesNotSwallowTheNext) {
  torchpilot_test::TempDir dir;
  const std::string path = dir.file("journal.jsonl");
  g_now = 1000;
  g_cut_at = 1;  // the checkpoint record below
  {
    RunJournal j(path, &fake_now, &cut_once_write);
    g_now = 1100;
    j.checkpoint_saved(10);
    g_now = 1200;
    EXPECT_EQ(j.stats().write_error, std::strerror(ENOSPC));
  }
  const std::vector<JournalRecord> r = read_journal(path);
  ASSERT_EQ(r.size(), 3u);  // start, progress, stop: the cut checkpoint is lost, nothing else
  EXPECT_EQ(r[1].type, "progress");
  EXPECT_EQ(r[2].type, "stop");
}

}  // namespace
}  // namespace torchpilot
