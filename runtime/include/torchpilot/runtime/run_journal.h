// The run journal (docs/reports.md, "ETTR"): an append-only JSON-lines file (report.journal_path)
// that outlives the process. Each Pilot appends `start`, `progress` (steps done, at most once a
// second and at each epoch end), `checkpoint` (Pilot::checkpoint_saved) and, at a clean exit,
// `stop`. Read back at start-up, the runs before this one give the failures (a run without
// `stop`), the work each lost (its time after its last checkpoint) and the effective training
// time ratio: ETTR = productive time / wall time since the first start.
//
// A collector: its epoch section "journal" (RunJournalStats) feeds the checkpoint advisor.
// Thread-safety: training thread only. Failure behaviour: the constructor throws ConfigError when
// the file cannot be opened for appending; later write errors are logged once by the Pilot.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "torchpilot/runtime/collector.h"
#include "torchpilot/runtime/records.h"

namespace torchpilot {

struct RunJournalStats {
  static constexpr const char* kSectionName = "journal";
  int64_t runs = 0;      // starts in the journal, this one included
  int64_t failures = 0;  // earlier runs that ended without a stop record
  int64_t checkpoints = 0;
  double wall_s = 0;                            // first start to now
  double productive_s = 0;                      // steps' time not lost to failures
  double lost_s = 0;                            // failed runs' time after their last checkpoint
  double ettr = kNotMeasured;                   // productive_s / wall_s
  double mtbf_s = kNotMeasured;                 // wall_s / failures
  double checkpoint_interval_s = kNotMeasured;  // mean time between checkpoints
};
std::string section_json(const RunJournalStats& s);
void section_text(const RunJournalStats& s, const EpochSummary& epoch,
                  std::vector<std::string>& lines);

// A journal's records, for reading it back (tests, tools).
struct JournalRecord {
  std::string type;   // start | progress | checkpoint | stop
  double time_s = 0;  // Unix time
  int64_t steps = 0;  // progress: steps this run; checkpoint: the trainer's step
};
std::vector<JournalRecord> read_journal(const std::string& path);
// The figures of a journal's records at `now_s` (Unix time); the last run is the running one
// when `running` (its missing stop is not a failure).
RunJournalStats journal_stats(const std::vector<JournalRecord>& records, double now_s,
                              bool running);

class RunJournal final : public Collector {
 public:
  // `now_s`: Unix time source (tests inject one); default: the system clock.
  explicit RunJournal(const std::string& path, double (*now_s)() = nullptr);
  ~RunJournal() override;
  std::string name() const override { return "journal"; }
  void on_step_end(StepRecord& record) override;
  void on_epoch_end(EpochSummary& summary) override;
  void checkpoint_saved(int64_t step);
  RunJournalStats stats() const;

 private:
  void append(const char* type, int64_t steps);
  std::string path_;
  double (*now_)();
  std::FILE* file_ = nullptr;
  std::vector<JournalRecord> records_;  // earlier runs' and this run's
  int64_t steps_ = 0;
  double last_progress_s_ = 0;
};

}  // namespace torchpilot
