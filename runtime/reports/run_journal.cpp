#include "torchpilot/runtime/reports/run_journal.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/format.h"

namespace torchpilot {
namespace {

using detail::json;

double system_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string section_json(const RunJournalStats& s) {
  return detail::dump({{"runs", s.runs},
                       {"failures", s.failures},
                       {"checkpoints", s.checkpoints},
                       {"wall_s", s.wall_s},
                       {"productive_s", s.productive_s},
                       {"lost_s", s.lost_s},
                       {"ettr", detail::number(s.ettr)},
                       {"mtbf_s", detail::number(s.mtbf_s)},
                       {"checkpoint_interval_s", detail::number(s.checkpoint_interval_s)}});
}

void section_text(const RunJournalStats& s, const EpochSummary&, std::vector<std::string>& lines) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "  run journal: ETTR %s over %lld runs (%lld failures, %.0f s of work lost), "
                "%lld checkpoints",
                detail::fmt_opt_pct(s.ettr).c_str(), static_cast<long long>(s.runs),
                static_cast<long long>(s.failures), s.lost_s,
                static_cast<long long>(s.checkpoints));
  lines.push_back(buf);
}

std::vector<JournalRecord> read_journal(const std::string& path) {
  std::vector<JournalRecord> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    // A line cut short by a crash is skipped, not fatal.
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("type") || !j["type"].is_string())
      continue;
    JournalRecord r;
    r.type = j["type"].get<std::string>();
    r.time_s = j.value("unix_time_s", 0.0);
    r.steps = j.value("steps", int64_t{0});
    out.push_back(r);
  }
  return out;
}

RunJournalStats journal_stats(const std::vector<JournalRecord>& records, double now_s,
                              bool running) {
  RunJournalStats s;
  struct Run {
    double start = 0, last = 0, last_checkpoint = -1;
    bool stopped = false;
    int64_t checkpoints = 0;
  };
  std::vector<Run> runs;
  for (const JournalRecord& r : records) {
    if (r.type == "start") {
      runs.push_back({r.time_s, r.time_s});
      continue;
    }
    if (runs.empty()) continue;
    Run& run = runs.back();
    run.last = std::max(run.last, r.time_s);
    if (r.type == "checkpoint") {
      run.last_checkpoint = r.time_s;
      ++run.checkpoints;
    }
    if (r.type == "stop") run.stopped = true;
  }
  if (runs.empty()) return s;
  s.runs = static_cast<int64_t>(runs.size());
  s.wall_s = std::max(0.0, now_s - runs.front().start);
  double run_time = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& run = runs[i];
    const bool current = running && i + 1 == runs.size();
    const double end = current ? now_s : run.last;
    const double t = std::max(0.0, end - run.start);
    run_time += t;
    s.checkpoints += run.checkpoints;
    double lost = 0;
    if (!current && !run.stopped) {
      ++s.failures;
      // Work after the last checkpoint is redone by the next run (all of it without one).
      lost = run.last_checkpoint >= 0 ? run.last - run.last_checkpoint : t;
    }
    s.lost_s += lost;
    s.productive_s += t - lost;
  }
  if (s.wall_s > 0) s.ettr = s.productive_s / s.wall_s;
  if (s.failures > 0) s.mtbf_s = s.wall_s / static_cast<double>(s.failures);
  if (s.checkpoints > 0) s.checkpoint_interval_s = run_time / static_cast<double>(s.checkpoints);
  return s;
}

RunJournal::RunJournal(const std::string& path, double (*now_s)())
    : path_(path), now_(now_s != nullptr ? now_s : &system_now_s) {
  records_ = read_journal(path_);
  file_ = std::fopen(path_.c_str(), "a");
  if (file_ == nullptr) {
    throw ConfigError("<config>", "report.journal_path",
                      "cannot open '" + path_ + "' for appending: " + std::strerror(errno));
  }
  // A line a crash cut short must not swallow this run's first record.
  {
    std::ifstream in(path_, std::ios::binary | std::ios::ate);
    if (in && in.tellg() > 0) {
      in.seekg(-1, std::ios::end);
      if (in.get() != '\n') std::fputc('\n', file_);
    }
  }
  append("start", 0);
}

RunJournal::~RunJournal() {
  if (file_ == nullptr) return;
  append("progress", steps_);
  append("stop", steps_);
  std::fclose(file_);
}

void RunJournal::append(const char* type, int64_t steps) {
  const double t = now_();
  records_.push_back({type, t, steps});
  const json j = {{"type", type},
                  {"unix_time_s", t},
                  {"steps", steps},
                  {"pid", static_cast<int64_t>(getpid())}};
  const std::string line = detail::dump(j) + "\n";
  // Flushed at once: the journal is what survives a crash.
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

void RunJournal::on_step_end(StepRecord&) {
  ++steps_;
  // At most once a second: the work a crash loses is known to within a second.
  const double t = now_();
  if (t - last_progress_s_ >= 1.0) {
    last_progress_s_ = t;
    append("progress", steps_);
  }
}

void RunJournal::on_epoch_end(EpochSummary& summary) {
  append("progress", steps_);
  summary.sections.set(stats());
}

void RunJournal::checkpoint_saved(int64_t step) { append("checkpoint", step); }

RunJournalStats RunJournal::stats() const { return journal_stats(records_, now_(), true); }

}  // namespace torchpilot
