#include "torchpilot/runtime/reports/sinks.h"

#include <fcntl.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <ctime>
#include <iterator>
#include <stdexcept>

#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/format.h"
#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/tune/answered.h"

namespace torchpilot {
namespace {

using namespace detail;

constexpr int kSchemaVersion = 1;

// Each section under its name, as the section wrote it.
void add_sections(json& j, const Sections& sections) {
  for (const auto& section : sections.all()) {
    j[std::string(section->name())] = json::parse(section->json());
  }
}

json setting_json(const Setting& s) {
  json j = json::object();
  for (const auto& [k, v] : s) j[k] = v;
  return j;
}

json advice_json(const Advice& a) {
  json evidence = json::object();
  for (const auto& e : a.evidence) evidence[e.name] = {{"value", e.value}, {"unit", e.unit}};
  return {{"id", a.id},
          {"severity", to_string(a.severity)},
          {"epoch", a.epoch},
          {"finding", a.finding},
          {"cause", a.cause},
          {"action", a.action},
          {"evidence", evidence},
          {"expected_gain", a.expected_gain},
          {"gain_estimated", a.gain_estimated}};
}

json trial_object(const TrialResult& t) {
  return {
      {"setting", setting_json(t.setting)},
      {"first_step", t.first_step},
      {"last_step", t.last_step},
      {"mean_step_ms", ms(t.mean_step_ns)},
      {"relative_error", t.relative_error},
      {"throughput", t.throughput},
      {"unit", t.unit},
      {"data_wait_fraction", t.data_wait_fraction},
      {"supply_capacity", t.supply_capacity},
      {"supply_limited", t.supply_limited},
      {"demand", t.demand},
      {"peak_memory_fraction",
       t.peak_memory_fraction >= 0 ? json(t.peak_memory_fraction) : json(nullptr)},
      {"peak_memory_bytes", t.peak_memory_bytes >= 0 ? json(t.peak_memory_bytes) : json(nullptr)},
      {"failed", t.failed},
      {"note", t.note},
      {"confirmation", t.confirmation}};
}

class LogSink final : public Sink {
 public:
  explicit LogSink(std::shared_ptr<spdlog::logger> logger) : logger_(std::move(logger)) {}
  std::string name() const override { return "log"; }
  bool wants_late_steps() const override { return false; }
  void on_epoch(const EpochSummary& summary, const std::vector<Advice>& advice) override {
    answered_.note(advice);
    if (!logger_->should_log(spdlog::level::info)) return;  // not formatted for nothing
    for (const auto& line : format_epoch(summary, advice)) logger_->info("{}", line);
  }
  void on_trial(const TrialResult& trial, bool kept) override {
    logger_->info("{}", format_trial(trial, kept));
  }
  void on_decision(const TuningDecision& decision) override {
    logger_->info("{}", format_decision(decision));
    // Advice the decision answered (the HTML report's findings set it apart by the same rule).
    for (const auto& a : answered_.answer(decision)) logger_->info("{}", format_answered(a));
  }
  void flush() override { logger_->flush(); }

 private:
  std::shared_ptr<spdlog::logger> logger_;
  AnsweredAdvice answered_;
};

// Opens log.json_path for appending without ever blocking: open(2) with O_NONBLOCK, so a FIFO
// without a reader fails at once (ENXIO) instead of waiting for one. Every failure is a
// ConfigError on log.json_path with the OS's reason.
int open_json_lines(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    std::string reason = "cannot open for appending: " + std::string(std::strerror(err));
    struct stat st {};
    if (err == ENXIO && ::stat(path.c_str(), &st) == 0) {
      if (S_ISFIFO(st.st_mode)) {
        reason = "is a FIFO with no reader (" + std::string(std::strerror(err)) +
                 "): start its reader first, or give a regular file";
      } else if (S_ISSOCK(st.st_mode)) {
        reason = "is a socket: give a regular file";
      }
    }
    throw ConfigError(path, "log.json_path", reason);
  }
  // A FIFO with a reader, a terminal or /dev/null: from here writes wait as they normally would.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

// Writes all of `data` to `fd`. A pipe whose reader went away gives EPIPE here, not a SIGPIPE
// that would end the training process: SIGPIPE is blocked for this thread while writing, and one
// raised by this write is taken back.
bool write_all(int fd, const char* data, size_t size, bool pipe_like, int& err) {
  sigset_t pipe_set, old_mask, pending;
  bool was_pending = false;
  if (pipe_like) {
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigpending(&pending);
    was_pending = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask);
  }
  bool ok = true;
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      ok = false;
      break;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  if (pipe_like) {
    if (!ok && err == EPIPE && !was_pending) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_set, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  }
  return ok;
}

class JsonLinesSink final : public Sink {
 public:
  explicit JsonLinesSink(const std::string& path) : path_(path), fd_(open_json_lines(path)) {
    struct stat st {};
    pipe_like_ = ::fstat(fd_, &st) == 0 && !S_ISREG(st.st_mode);
    // The file is appended to: a run record tells one run's records from the next.
    write(dump(json{{"type", "run"},
                    {"v", kSchemaVersion},
                    {"pid", static_cast<int64_t>(getpid())},
                    {"unix_time_s", static_cast<int64_t>(std::time(nullptr))}}));
  }
  ~JsonLinesSink() override {
    try {
      flush();
    } catch (...) {
      // The Pilot has flushed and reported already; nothing else to do at destruction.
    }
    ::close(fd_);
  }
  JsonLinesSink(const JsonLinesSink&) = delete;
  JsonLinesSink& operator=(const JsonLinesSink&) = delete;

  std::string name() const override { return "json-lines " + path_; }
  void on_step(const StepRecord& r, const std::vector<std::string>& names) override {
    write(step_json(r, names));
  }
  void on_epoch(const EpochSummary& s, const std::vector<Advice>& a) override {
    answered_.note(a);
    write(epoch_json(s, a));
  }
  void on_trial(const TrialResult& t, bool kept) override { write(trial_json(t, kept)); }
  void on_decision(const TuningDecision& d) override {
    write(decision_json(d, answered_.answer(d)));
  }
  void on_late_step(const LateStepRecord& r) override { write(late_step_json(r)); }
  void flush() override {
    if (buffer_.empty()) return;
    int err = 0;
    const bool ok = write_all(fd_, buffer_.data(), buffer_.size(), pipe_like_, err);
    buffer_.clear();
    if (!ok) {
      throw std::runtime_error("write to '" + path_ + "' failed: " + std::strerror(err));
    }
  }

 private:
  AnsweredAdvice answered_;
  static constexpr size_t kBufferBytes = 8192;  // as std::ofstream buffered
  void write(const std::string& line) {
    buffer_ += line;
    buffer_ += '\n';
    if (buffer_.size() >= kBufferBytes) flush();
  }
  std::string path_;
  int fd_;
  bool pipe_like_ = false;
  std::string buffer_;
};

}  // namespace

const char* to_string(Severity severity) {
  static constexpr const char* kNames[] = {"info", "warning", "high"};
  static_assert(std::size(kNames) == static_cast<size_t>(Severity::kHigh) + 1);
  return detail::enum_name(severity, kNames, "?");
}

std::shared_ptr<Sink> make_log_sink(std::shared_ptr<spdlog::logger> logger) {
  return std::make_shared<LogSink>(std::move(logger));
}

std::shared_ptr<Sink> make_json_lines_sink(const std::string& path) {
  return std::make_shared<JsonLinesSink>(path);
}

std::string step_json(const StepRecord& r, const std::vector<std::string>& names) {
  json phases = json::object();
  for (size_t i = 0; i < names.size() && i < kMaxPhases; ++i) phases[names[i]] = ms(r.phase_ns[i]);
  json j = {{"type", "step"},
            {"v", kSchemaVersion},
            {"step", r.step},
            {"epoch", r.epoch},
            {"step_in_epoch", r.step_in_epoch},
            {"end_ns", r.end_ns},
            {"step_ms", ms(r.step_ns())},
            {"data_wait_ms", ms(r.data_wait_ns)},
            {"own_ms", ms(r.own_ns)},
            {"cpu_ms", r.cpu_ns >= 0 ? json(ms(r.cpu_ns)) : json(nullptr)},
            {"samples", r.samples},
            {"phases_ms", phases}};
  // Collectors' figures by section: {"flops": {"model_flops": ..., "mfu": ...}}.
  for (const StepMetrics::Metric& m : r.metrics) j[m.section][m.name] = number(m.value);
  return dump(j);
}

std::string late_step_json(const LateStepRecord& r) {
  json j = json::parse(r.section->json());
  j["type"] = std::string(r.record_type);
  j["v"] = kSchemaVersion;
  j["step"] = r.step;
  j["epoch"] = r.epoch;
  return dump(j);
}

std::string epoch_json(const EpochSummary& s, const std::vector<Advice>& advice) {
  json phases = json::object();
  for (const auto& p : s.phases) phases[p.name] = ms(p.ns);
  json list = json::array();
  for (const auto& a : advice) list.push_back(advice_json(a));
  json j = {{"type", "epoch"},
            {"v", kSchemaVersion},
            {"epoch", s.epoch},
            {"closed_by", to_string(s.closed_by)},
            {"steps", s.steps},
            {"first_step", s.first_step},
            {"samples", s.samples},
            {"wall_s", static_cast<double>(s.wall_ns) / 1e9},
            {"data_wait_s", static_cast<double>(s.data_wait_ns) / 1e9},
            {"data_wait_fraction", s.data_wait_fraction},
            {"step_p50_ms", ms(s.step_p50_ns)},
            {"step_p90_ms", ms(s.step_p90_ns)},
            {"compute_p50_ms", ms(s.compute_p50_ns)},
            {"compute_min_ms", ms(s.compute_min_ns)},
            {"own_ms", ms(s.own_ns)},
            {"cpu_ms", s.cpu_ns >= 0 ? json(ms(s.cpu_ns)) : json(nullptr)},
            {"steps_per_s", s.steps_per_s},
            {"samples_per_s", s.samples_per_s},
            {"phases_ms", phases},
            {"tuning_steps", s.tuning_steps},
            {"tuned", s.tuned},
            {"advice", list}};
  add_sections(j, s.sections);
  return dump(j);
}

std::string trial_json(const TrialResult& t, bool kept) {
  json j = trial_object(t);
  j["type"] = "tuning_trial";
  j["v"] = kSchemaVersion;
  j["kept"] = kept;
  return dump(j);
}

std::string decision_json(const TuningDecision& d) { return decision_json(d, {}); }

std::string decision_json(const TuningDecision& d,
                          const std::vector<AnsweredAdvice::Answer>& answered) {
  json trials = json::array();
  for (const auto& t : d.trials) trials.push_back(trial_object(t));
  json j = {{"type", "tuning_decision"},
            {"v", kSchemaVersion},
            {"policy", d.policy},
            {"baseline", setting_json(d.baseline)},
            {"chosen", setting_json(d.chosen)},
            {"baseline_throughput", d.baseline_throughput},
            {"chosen_throughput", d.chosen_throughput},
            {"unit", d.unit},
            {"decided_at_step", d.decided_at_step},
            {"steps_used", d.steps_used},
            {"reason", d.reason},
            {"trials", trials}};
  // Earlier epochs' advice this decision answered: the tuner measured its knobs and kept these.
  json list = json::array();
  for (const auto& a : answered) {
    list.push_back({{"id", a.id}, {"epoch", a.epoch}, {"action", a.action}, {"kept", a.kept}});
  }
  j["answered"] = list;
  return dump(j);
}

std::vector<std::string> format_epoch(const EpochSummary& s, const std::vector<Advice>& advice) {
  std::vector<std::string> lines;
  // "interval 3: ..." when the Pilot closed it (no epoch end for interval.seconds).
  std::string head =
      std::string(s.closed_by == PeriodEnd::kInterval ? "interval " : "epoch ") +
      std::to_string(s.epoch) + (s.closed_by == PeriodEnd::kExit ? " (at exit)" : "") + ": " +
      std::to_string(s.steps) + " steps in " + fmt_num(static_cast<double>(s.wall_ns) / 1e9) + " s";
  if (s.samples_per_s > 0) head += ", " + fmt_num(s.samples_per_s) + " samples/s";
  head += "; step p50 " + fmt_ms(s.step_p50_ns) + ", p90 " + fmt_ms(s.step_p90_ns) +
          "; data wait " + fmt_pct(s.data_wait_fraction) + " of step time";
  lines.push_back(head);
  if (s.tuning_steps > 0) {
    lines.push_back("  " + std::to_string(s.tuning_steps) +
                    " of these steps ran auto-tune trials: the figures mix the settings tried");
  }
  std::string phases;
  for (const auto& p : s.phases) {
    phases += (phases.empty() ? "" : ", ") + p.name + " " + fmt_pct(fraction(p.ns, s.wall_ns));
  }
  if (!phases.empty()) lines.push_back("  phases (share of step time): " + phases);
  for (const auto& section : s.sections.all()) section->text(s, lines);
  if (advice.empty()) lines.push_back("  no advice: nothing above its threshold");
  for (const auto& a : advice) {
    lines.push_back("ADVICE [" + std::string(to_string(a.severity)) + "] " + a.id + ": " +
                    a.finding);
    if (!a.cause.empty()) lines.push_back("  cause: " + a.cause);
    if (!a.action.empty()) lines.push_back("  action: " + a.action);
    if (a.expected_gain > 0) {
      lines.push_back("  expected gain: +" + fmt_pct(a.expected_gain) + " throughput" +
                      (a.gain_estimated ? " (estimated)" : " (measured)"));
    }
  }
  return lines;
}

std::string format_trial(const TrialResult& t, bool kept) {
  const std::string head =
      "autotune trial [" + to_string(t.setting) + "]" + (t.confirmation ? " re-measurement" : "");
  if (t.failed) return head + " failed: " + t.note;
  return head + ": " + fmt_num(t.throughput) + " " + t.unit + " (mean step " +
         fmt_ms(t.mean_step_ns) + " +-" + fmt_pct(t.relative_error) + ", data wait " +
         fmt_pct(t.data_wait_fraction) +
         (t.supply_limited ? ", capped at the loader's capacity (steps ran on a backlog)" : "") +
         (t.peak_memory_fraction >= 0
              ? ", peak memory " + fmt_pct(t.peak_memory_fraction) + " of the device's"
              : "") +
         ", steps " + std::to_string(t.first_step) + "-" + std::to_string(t.last_step) + ")" +
         (kept ? " -> best so far" : "");
}

std::string format_answered(const AnsweredAdvice::Answer& a) {
  return "  answered by tuning: " + a.id + " of epoch " + std::to_string(a.epoch) + " (\"" +
         a.action + "\"): the tuner measured its settings and kept " + a.kept;
}

std::string format_decision(const TuningDecision& d) {
  if (d.trials.empty()) return "autotune: no decision (" + d.reason + ")";
  std::string gain;
  if (d.baseline_throughput > 0) {
    gain = " (" + std::string(d.chosen_throughput >= d.baseline_throughput ? "+" : "") +
           fmt_pct(d.chosen_throughput / d.baseline_throughput - 1.0) + ", measured)";
  }
  return "autotune decision: [" + to_string(d.chosen) + "] " + fmt_num(d.chosen_throughput) + " " +
         d.unit + " vs baseline [" + to_string(d.baseline) + "] " + fmt_num(d.baseline_throughput) +
         " " + d.unit + gain + "; " + std::to_string(d.trials.size()) + " trials in " +
         std::to_string(d.steps_used) + " warm-up steps, decided at step " +
         std::to_string(d.decided_at_step) + " (" + d.reason + ")";
}

}  // namespace torchpilot
