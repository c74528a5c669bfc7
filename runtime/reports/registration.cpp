// The reports subsystem's place in every Pilot: the sinks that report.* and log.* keys turn on
// (the advisory log always; JSON lines, trace windows, the HTML report when their key is set) and
// the run journal's collector. The registration runs at static initialization; its anchor
// (anchor.h) is named on the link line (CMake, torchpilot_core) so that a static library does not
// drop this object.
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "torchpilot/runtime/core/anchor.h"
#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/reports/html_report.h"
#include "torchpilot/runtime/reports/run_journal.h"
#include "torchpilot/runtime/reports/sinks.h"
#include "torchpilot/runtime/reports/trace_events.h"

namespace torchpilot {
namespace {

using Logger = std::shared_ptr<spdlog::logger>;

std::shared_ptr<Sink> log_sink(const Config&, const Logger& logger) {
  return make_log_sink(logger);
}

std::shared_ptr<Sink> json_sink(const Config& config, const Logger&) {
  if (config.log.json_path.empty()) return nullptr;
  return make_json_lines_sink(config.log.json_path);
}

std::shared_ptr<Sink> trace_sink(const Config& config, const Logger& logger) {
  if (config.report.trace_dir.empty()) return nullptr;
  return make_trace_sink(config.report.trace_dir, logger);
}

std::shared_ptr<Sink> html_sink(const Config& config, const Logger&) {
  if (config.report.html_path.empty()) return nullptr;
  return make_html_report(config.report.html_path);
}

// The endpoint lives in hooks/reports (it needs cpp-httplib); a build without it says so.
std::shared_ptr<Sink> no_endpoint(const Config& config, const Logger& logger) {
  if (config.report.prometheus_port != 0 && !default_sink_registered("prometheus")) {
    logger->warn(
        "report.prometheus_port is set but this build has no metrics endpoint (cpp-httplib was "
        "not found at configure time)");
  }
  return nullptr;
}

// The run journal (report.journal_path): its record of this run and the ETTR of those before.
// Each rank keeps its own file (journal_path_for_rank).
std::unique_ptr<Collector> make_journal(CollectorHost& host) {
  const std::string& configured = host.config().report.journal_path;
  if (configured.empty()) return nullptr;
  const std::string path = journal_path_for_rank(configured, std::getenv("RANK"));
  auto journal = std::make_unique<RunJournal>(path);  // ConfigError: the Pilot's start fails
  const std::string warning = journal->read_warning();
  if (!warning.empty()) host.logger().warn("run journal {}: {}", path, warning);
  const RunJournalStats j = journal->stats();
  host.logger().info(
      "run journal {}: run {}, {} failures before it, ETTR {:.1f}% ({:.0f} s of work lost)", path,
      j.runs, j.failures, measured(j.ettr) ? 100 * j.ettr : 100.0, j.lost_s);
  return journal;
}

}  // namespace

TORCHPILOT_REGISTRATION(reports) {
  register_default_sink("log", 0, &log_sink);
  register_default_sink("json_lines", 10, &json_sink);
  register_default_sink("trace", 20, &trace_sink);
  register_default_sink("html_report", 30, &html_sink);
  register_default_sink("no_prometheus", 50, &no_endpoint);
  // Before the default collectors, after the stall tracker: its section comes first.
  register_default_collector("journal", -50, &make_journal, /*always=*/true);
}

}  // namespace torchpilot
