// The harness every benchmark in bench/ uses: the run's flags and JSON header, the interleaved
// rounds, the statistics, the clock and main's error handling. A benchmark is a `run(argc, argv)`
// that parses its own flags plus add_run_flags, measures its configurations in interleaved rounds
// (each configuration once per round, so that drift in the machine hits all of them alike), and
// writes medians and ratios under run_header's keys.
#pragma once

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli_flags.h"

namespace bench {

// --- time ---------------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

// Seconds and milliseconds from `t0` to now.
double seconds_since(Clock::time_point t0);
double ms_since(Clock::time_point t0);

// Now in UTC, ISO 8601 ("2026-11-26T12:00:00Z"): the results files' "date".
std::string utc_date();

// --- statistics ---------------------------------------------------------------------------------

// The median of `v`; NaN when empty (written as null in the JSON files).
double median(std::vector<double> v);

// The spread of per-round figures: their median, min and max (NaN when empty).
struct Spread {
  double median, min, max;
};
Spread spread(const std::vector<double>& v);

// Per round, x[i] / base[i] - minus: a configuration against the baseline measured in the same
// round (the ratio that drift affects least).
std::vector<double> per_round_ratios(const std::vector<double>& x, const std::vector<double>& base,
                                     double minus = 0);

// --- interleaved rounds -------------------------------------------------------------------------

// How a round orders its configurations: rotated by one each round (A B C, B C A, C A B) or
// reversed every other round (A B C, C B A); with two configurations both alternate A B, B A.
enum class Order { kRotate, kReverse };

// The configurations' order in round `round` (0-based) of `configs`.
std::vector<int> round_order(int round, int configs, Order order);

// Runs `rounds` rounds, each every configuration once in round_order: measure(round, position,
// config), position being its place in that round.
void interleave(int rounds, int configs, Order order,
                const std::function<void(int round, int position, int config)>& measure);

// Runs `rounds` rounds, each every item of [0, items) once in an order shuffled by `rng` (a
// std::shuffle of 0..items-1, so a seed gives the same runs as before).
void interleave_shuffled(int rounds, size_t items, std::mt19937& rng,
                         const std::function<void(size_t item)>& measure);

// --- flags -------------------------------------------------------------------------------------

// An integer flag in [min, max] (example_cli::add_int) whose help shows its default.
template <typename T>
CLI::Option* int_flag(CLI::App& app, const std::string& name, T& value, int64_t min, int64_t max,
                      const std::string& help) {
  return example_cli::add_int(app, name, value, min, max, help)->capture_default_str();
}

// A finite number flag in (above, max] (example_cli::add_number) whose help shows its default.
CLI::Option* number_flag(CLI::App& app, const std::string& name, double& value, double above,
                         double max, const std::string& help);

// --- the run's flags and JSON header ------------------------------------------------------------

// Who ran it where: every benchmark's --machine, --commit and --out.
struct RunFlags {
  std::string machine = "unnamed";
  std::string commit = "unknown";
  std::string out;  // the JSON file; empty: none written
};

// Adds --machine, --commit and --out FILE (`out_help`). `out_checked`: --out is a path that
// example_cli::Path checks (older benchmarks take any string; kept as they were).
void add_run_flags(CLI::App& app, RunFlags& run, const std::string& out_help,
                   bool out_checked = true);

// When a run happened, as each results file has always written it: "date" (utc_date) or
// "unix_time_s" (seconds since the epoch; short_epochs, collectives).
enum class Stamp { kDate, kUnixTime };

// The keys every results file starts from: bench, machine, commit and the time stamp.
nlohmann::json run_header(const std::string& bench, const RunFlags& run,
                          Stamp stamp = Stamp::kDate);

// Writes `j` to `path`, indented; throws when the file cannot be written.
void write_json(const std::string& path, const nlohmann::json& j, int indent = 2);

// The end of a run: writes `j` to run.out (write_json) and says so on stdout ("name: results in
// FILE"); nothing when run.out is empty.
void write_results(const char* name, const RunFlags& run, const nlohmann::json& j);

// The next of a process's run folders under `dir` (dir/run1, dir/run2, ...) for
// report.trace_dir: each run's windows in a folder of their own, named by the run's order here.
std::string next_run_folder(const std::string& dir);

// --- main ---------------------------------------------------------------------------------------

// main of a benchmark: run(argc, argv)'s status; an exception is reported as "name: what" on
// stderr, status 1.
int guarded_main(const char* name, int argc, char** argv, int (*run)(int, char**));

}  // namespace bench
