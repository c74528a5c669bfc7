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
  // Why a record of this run could not be written (the OS's reason), or empty: when set, the file
  // lacks some of this run's records and the next run reads it as shorter, or failed.
  std::string write_error;
};
std::string section_json(const RunJournalStats& s);
void section_text(const RunJournalStats& s, const EpochSummary& epoch,
                  std::vector<std::string>& lines);

// A journal's records, for reading it back (tests, tools).
struct JournalRecord {
  std::string type;   // start | progress | checkpoint | stop
  double time_s = 0;  // Unix time
  int64_t steps = 0;  // progress: steps this run; checkpoint: the trainer's step
  std::string run;  // the run's id (runs writing one file at once are read apart); "" in old files
};
// What reading a journal left out, for one log line.
struct JournalReadNotes {
  int64_t invalid = 0;        // lines of JSON that are not a valid record, or too long: skipped
  std::string first_invalid;  // "<path>:<line>: <why>" of the first of them
  int64_t unread_bytes = 0;   // the file's bytes before the last kJournalReadMaxBytes: not read
};
// The reading bounds: the last 64 MiB of a file (at a progress record a second, about a week of
// one rank's runs; the runs before are left out, with a warning) and lines of at most 64 KiB (a
// record takes about 110 bytes; a longer line is skipped as invalid). Reading stays bounded in
// time and memory whatever the file holds.
constexpr int64_t kJournalReadMaxBytes = int64_t{64} << 20;
// A record's time outside these (Unix seconds: 1970 to about the year 5100) is invalid.
constexpr double kJournalEarliestTimeS = 0;
constexpr double kJournalLatestTimeS = 1e11;
constexpr size_t kJournalLineMaxBytes = 64 << 10;
// Empty when the file cannot be opened or is not a regular file. A line cut short by a crash is
// skipped quietly; any other line that is not a valid record is skipped and noted.
std::vector<JournalRecord> read_journal(const std::string& path, JournalReadNotes* notes = nullptr);
// The figures of a journal's records at `now_s` (Unix time); the last run to start is the
// running one when `running` (its missing stop is not a failure). Records name their run; those
// without a name (older files) belong to the run started last.
RunJournalStats journal_stats(const std::vector<JournalRecord>& records, double now_s,
                              bool running);

}  // namespace torchpilot
