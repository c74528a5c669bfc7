#include "torchpilot/runtime/reports/run_journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <unordered_map>

#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/file_kind.h"
#include "torchpilot/runtime/core/format.h"
#include "torchpilot/runtime/core/logging.h"

namespace torchpilot {
namespace {

using detail::json;

double system_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string section_json(const RunJournalStats& s) {
  return detail::dump(
      {{"runs", s.runs},
       {"failures", s.failures},
       {"checkpoints", s.checkpoints},
       {"wall_s", s.wall_s},
       {"productive_s", s.productive_s},
       {"lost_s", s.lost_s},
       {"ettr", detail::number(s.ettr)},
       {"mtbf_s", detail::number(s.mtbf_s)},
       {"checkpoint_interval_s", detail::number(s.checkpoint_interval_s)},
       {"write_error", s.write_error.empty() ? json(nullptr) : json(s.write_error)}});
}

void section_text(const RunJournalStats& s, const EpochSummary&, std::vector<std::string>& lines) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "  run journal: ETTR %s over %lld runs (%lld failures, %.0f s of work lost), "
                "%lld checkpoints",
                detail::fmt_opt_pct(s.ettr).c_str(), static_cast<long long>(s.runs),
                static_cast<long long>(s.failures), s.lost_s,
                static_cast<long long>(s.checkpoints));
  std::string line = buf;
  if (!s.write_error.empty()) {
    line += "; incomplete: this run's records are not all in the journal (" + s.write_error + ")";
  }
  lines.push_back(std::move(line));
}

namespace {

// Why `j` is not a journal record, or empty.
std::string invalid_because(const json& j) {
  if (!j.is_object()) return std::string("a JSON ") + j.type_name() + ", expected an object";
  struct Field {
    const char* key;
    bool (json::*is)() const noexcept;
    const char* expected;
    bool required;
  };
  static const Field kFields[] = {{"type", &json::is_string, "a string", true},
                                  {"unix_time_s", &json::is_number, "a number", true},
                                  {"steps", &json::is_number_integer, "an integer", true},
                                  {"run", &json::is_string, "a string", false}};
  for (const Field& f : kFields) {
    const auto it = j.find(f.key);
    if (it == j.end()) {
      if (f.required) return std::string(f.key) + " is missing, expected " + f.expected;
      continue;
    }
    if (!((*it).*f.is)()) {
      const std::string is = it->is_null() ? "null" : std::string("a ") + it->type_name();
      return std::string(f.key) + " is " + is + ", expected " + f.expected;
    }
  }
  // A time no run had: ETTR, MTBF and the checkpoint interval derived from it would be absurd
  // (and turned into steps, out of any integer's range).
  const double t = j["unix_time_s"].get<double>();
  if (!(t >= kJournalEarliestTimeS && t <= kJournalLatestTimeS)) {
    return "unix_time_s is " + std::to_string(t) + ", expected seconds since 1970, at most 1e11";
  }
  if (j["steps"].get<int64_t>() < 0) return "steps is negative, expected a count";
  return {};
}

// Of a run's progress records in a row only the last counts (journal_stats reads a run's last
// time): keeping that one alone bounds memory by checkpoints and runs, not by seconds.
void add_record(std::vector<JournalRecord>& records, JournalRecord r) {
  if (r.type == "progress" && !records.empty() && records.back().type == "progress" &&
      records.back().run == r.run && records.back().time_s <= r.time_s) {
    records.back() = std::move(r);
  } else {
    records.push_back(std::move(r));
  }
}

// The records of an open regular file of `size` bytes, within the reading bounds.
std::vector<JournalRecord> read_records(int fd, int64_t size, const std::string& path,
                                        JournalReadNotes& notes) {
  std::vector<JournalRecord> out;
  const int64_t begin = std::max<int64_t>(0, size - kJournalReadMaxBytes);
  notes.unread_bytes = begin;
  std::string line;
  bool too_long = false;
  // The line the bound cut (part of what is not read), unless the bound fell on a line's start.
  char before = '\n';
  bool cut = begin > 0 && !(::pread(fd, &before, 1, begin - 1) == 1 && before == '\n');
  int64_t line_number = 0;
  int64_t line_at = begin;  // the line's first byte
  auto finish = [&] {
    ++line_number;
    std::string why;
    if (too_long) {
      why = "longer than " + std::to_string(kJournalLineMaxBytes) + " bytes";
    } else if (!line.empty()) {
      const json j = json::parse(line, nullptr, false);
      if (j.is_discarded()) return;  // a line cut short by a crash
      why = invalid_because(j);
      if (why.empty()) {
        add_record(out, {j["type"].get<std::string>(), j["unix_time_s"].get<double>(),
                         j["steps"].get<int64_t>(), j.value("run", std::string())});
        return;
      }
    } else {
      return;
    }
    if (notes.invalid++ == 0) {
      // Line numbers count from the file's start only when it was read from there.
      notes.first_invalid = (begin == 0 ? path + ":" + std::to_string(line_number)
                                        : path + " (at byte " + std::to_string(line_at) + ")") +
                            ": " + why;
    }
  };
  std::vector<char> buf(size_t{1} << 16);
  int64_t at = begin;
  while (at < size) {
    const ssize_t n = ::pread(
        fd, buf.data(),
        static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(buf.size()), size - at)), at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // an I/O error or a file cut shorter meanwhile: what was read counts
    const char* p = buf.data();
    const char* const e = p + n;
    while (p < e) {
      const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(e - p)));
      const char* piece_end = nl != nullptr ? nl : e;
      const size_t piece = static_cast<size_t>(piece_end - p);
      if (!cut && !too_long) {
        if (line.size() + piece > kJournalLineMaxBytes) {
          too_long = true;  // the rest of it is not kept
          line.clear();
        } else {
          line.append(p, piece);
        }
      }
      if (nl == nullptr) break;
      if (cut) {
        cut = false;
      } else {
        finish();
      }
      line.clear();
      too_long = false;
      line_at = at + (nl + 1 - buf.data());
      p = nl + 1;
    }
    at += n;
  }
  if (!cut && (too_long || !line.empty())) finish();  // a last line without its end
  return out;
}

}  // namespace

std::vector<JournalRecord> read_journal(const std::string& path, JournalReadNotes* notes) {
  JournalReadNotes ignored;
  // O_NONBLOCK: opening a FIFO must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return {};
  struct stat st {};
  std::vector<JournalRecord> out;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    out = read_records(fd, st.st_size, path, notes != nullptr ? *notes : ignored);
  }
  ::close(fd);
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
  std::unordered_map<std::string, size_t> by_id;  // a named run's index in `runs`
  for (const JournalRecord& r : records) {
    if (r.type == "start") {
      if (!r.run.empty()) by_id[r.run] = runs.size();
      runs.push_back({r.time_s, r.time_s});
      continue;
    }
    if (runs.empty()) continue;
    // Runs writing at once interleave their records: each goes to the run it names.
    size_t i = runs.size() - 1;
    if (!r.run.empty()) {
      const auto it = by_id.find(r.run);
      if (it == by_id.end()) continue;  // its start is not in what was read
      i = it->second;
    }
    Run& run = runs[i];
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

RunJournal::RunJournal(const std::string& path, double (*now_s)(), WriteFn write)
    : path_(path),
      now_(now_s != nullptr ? now_s : &system_now_s),
      write_(write != nullptr ? write : &::write) {
  {
    std::random_device device;  // 48 bits: an id that fits a short string
    char id[16];
    std::snprintf(id, sizeof id, "%04x%08x", device() & 0xffffu, device());
    run_ = id;
  }
  // One descriptor read back and appended to. O_NONBLOCK: opening a FIFO must not wait for its
  // other end; what was opened is then checked (fstat, not the path: nothing can swap it between).
  fd_ = ::open(path_.c_str(), O_RDWR | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    throw ConfigError(
        "<config>", "report.journal_path",
        "cannot open '" + path_ + "' for reading and appending: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string kind = file_kind(st.st_mode);
    ::close(fd_);
    fd_ = -1;
    throw ConfigError("<config>", "report.journal_path",
                      "'" + path_ + "' is not a regular file (" + kind +
                          "): the journal is read back at start-up and appended to, which only "
                          "a regular file allows without blocking or reading without end");
  }
  // A regular file: writes block as usual (a non-blocking one's EAGAIN would read as a failure).
  (void)::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  try {
    records_ = read_records(fd_, st.st_size, path_, read_notes_);
    // A line a crash cut short must not swallow this run's first record.
    char last = '\n';
    line_open_ = st.st_size > 0 && ::pread(fd_, &last, 1, st.st_size - 1) == 1 && last != '\n';
    append("start", 0);
  } catch (...) {
    ::close(fd_);  // a constructor that throws runs no destructor
    fd_ = -1;
    throw;
  }
}

RunJournal::~RunJournal() { close(); }

void RunJournal::close() {
  if (fd_ < 0) return;
  append("progress", steps_);
  append("stop", steps_);
  if (::close(fd_) != 0 && write_error_.empty()) {  // a network file system reports here
    write_error_ = std::strerror(errno);
    tell_write_error();
  }
  fd_ = -1;
}

void RunJournal::attach(CollectorHost* host) {
  host_ = host;
  tell_write_error();  // the start record's failure, if it failed
}

void RunJournal::append(const char* type, int64_t steps) {
  const double t = now_();
  add_record(records_, {type, t, steps, run_});
  const json j = {{"type", type},
                  {"unix_time_s", t},
                  {"steps", steps},
                  {"run", run_},
                  {"pid", static_cast<int64_t>(getpid())}};
  // One write a record, at once: the journal is what survives a crash.
  write_line((line_open_ ? "\n" : "") + detail::dump(j) + "\n");
}

void RunJournal::write_line(const std::string& line) {
  if (fd_ < 0) return;
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = write_(fd_, line.data() + done, line.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // Later records are still tried (space may come back), each on a line of its own.
    line_open_ = line_open_ || done > 0;
    if (write_error_.empty()) {
      write_error_ = n < 0 ? std::strerror(errno) : "nothing written";
      tell_write_error();
    }
    return;
  }
  line_open_ = false;
}

void RunJournal::tell_write_error() {
  if (host_ == nullptr || write_error_.empty() || write_error_told_) return;
  write_error_told_ = true;
  host_->log(LogLevel::kError,
             "run journal " + path_ + ": a record could not be written (" + write_error_ +
                 "); this run's records there are incomplete from here (the epoch lines say so) "
                 "and the next run may count it as failed");
}

std::string RunJournal::read_warning() const {
  std::string w;
  const JournalReadNotes& n = read_notes_;
  if (n.invalid > 0) {
    w = std::to_string(n.invalid) + " invalid records skipped, the first " + n.first_invalid;
  }
  if (n.unread_bytes > 0) {
    w += (w.empty() ? "" : "; ") + std::string("only its last ") +
         std::to_string(kJournalReadMaxBytes >> 20) + " MiB read: the runs in the " +
         std::to_string(n.unread_bytes >> 20) + " MiB before are left out of ETTR";
  }
  return w;
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

RunJournalStats RunJournal::stats() const {
  RunJournalStats s = journal_stats(records_, now_(), true);
  s.write_error = write_error_;
  return s;
}

}  // namespace torchpilot
