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

#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/reports/journal_stats.h"

namespace torchpilot {

class RunJournal final : public Collector {
 public:
  // `now_s`: Unix time source (tests inject one); default: the system clock.
  explicit RunJournal(const std::string& path, double (*now_s)() = nullptr);
  ~RunJournal() override;
  std::string name() const override { return "journal"; }
  void on_step_end(StepRecord& record) override;
  void on_epoch_end(EpochSummary& summary) override;
  void on_checkpoint(int64_t step) override { checkpoint_saved(step); }
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
