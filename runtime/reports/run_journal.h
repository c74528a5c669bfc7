// The run journal (docs/reports.md, "ETTR"): an append-only JSON-lines file (report.journal_path)
// that outlives the process. Each Pilot appends `start`, `progress` (steps done, at most once a
// second and at each epoch end), `checkpoint` (Pilot::checkpoint_saved) and, at a clean exit,
// `stop`, each record naming its run. Read back at start-up, the runs before this one give the
// failures (a run without `stop`), the work each lost (its time after its last checkpoint) and
// the effective training time ratio: ETTR = productive time / wall time since the first start.
//
// A collector: its epoch section "journal" (RunJournalStats) feeds the checkpoint advisor.
// Thread-safety: training thread only. Failure behaviour: the constructor throws ConfigError when
// the file cannot be opened for reading and appending or is not a regular file (a FIFO would
// block, a device never end); reading is bounded (journal_stats.h). A record that cannot be
// written is logged once through the host, with the OS's reason, and the epoch section says so.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/reports/journal_stats.h"

namespace torchpilot {

// journal_path_for_rank (core/config.h): the file of one rank.

class RunJournal final : public Collector {
 public:
  // `now_s`: Unix time source; `write`: how bytes reach the file (default ::write). Tests inject
  // both (a full disk is a `write` that fails with ENOSPC).
  using WriteFn = ssize_t (*)(int fd, const void* data, size_t size);
  explicit RunJournal(const std::string& path, double (*now_s)() = nullptr,
                      WriteFn write = nullptr);
  ~RunJournal() override;
  RunJournal(const RunJournal&) = delete;
  RunJournal& operator=(const RunJournal&) = delete;
  std::string name() const override { return "journal"; }
  unsigned step_hooks() const override { return kHookStepEnd; }
  void attach(CollectorHost* host) override;
  void on_step_end(StepRecord& record) override;
  void on_epoch_end(EpochSummary& summary) override;
  void on_checkpoint(int64_t step) override { checkpoint_saved(step); }
  void on_close() override { close(); }
  void checkpoint_saved(int64_t step);
  RunJournalStats stats() const;
  // The warning that reading the file at start-up deserves (records skipped, a part unread), or
  // empty.
  std::string read_warning() const;

 private:
  void append(const char* type, int64_t steps);
  void write_line(const std::string& line);
  void tell_write_error();
  void close();  // the last progress and the stop record; then the file is closed
  std::string path_;
  double (*now_)();
  WriteFn write_;
  std::string run_;  // this run's id, in each of its records
  int fd_ = -1;
  CollectorHost* host_ = nullptr;
  std::vector<JournalRecord> records_;  // earlier runs' and this run's (runs of progress: the last)
  JournalReadNotes read_notes_;
  std::string write_error_;  // the first failed write's reason
  bool write_error_told_ = false;
  bool line_open_ = false;  // a write failed part-way: the next record starts on a new line
  int64_t steps_ = 0;
  double last_progress_s_ = 0;
};

}  // namespace torchpilot
