// The run journal's figures (runtime/reports/run_journal.h writes the journal): the epoch
// section "journal" and the reading of a journal's records. Records only, so advisors include it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/records.h"

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

}  // namespace torchpilot
