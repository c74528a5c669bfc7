// torchpilot-analyze: the advisors over a PyTorch profiler (Kineto) trace (docs/analyze.md).
//
//   torchpilot-analyze TRACE.json[.gz] [--config FILE] [--json] [--peak-tflops X]
//                      [--device-name NAME] [--frontend auto|python|cxx] [--max-input-mb N]
//                      [--max-events N] [--max-seconds N] [--version]
//
// The profiled steps are one epoch: the same summary the live library builds (kineto_trace.h),
// the same advisors (run_advisors) and the same text (format_epoch) or JSON (epoch_json, as the
// JSON-lines sink writes it), its actions in the trainer's language: Python's API for a trace
// Python's torch.profiler made, C++ and torchpilot's for others (frontend_actions.h). Exit 0 with
// the advice printed; 2 on a bad flag or a file that is
// missing, unreadable, over a limit (--max-input-mb, --max-events, --max-seconds) or not a Kineto
// trace (one line on stderr).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_flags.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/analyze/frontend_actions.h"
#include "torchpilot/runtime/analyze/kineto_trace.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/reports/sinks.h"

namespace {

// The message --max-seconds's alarm writes: set before the alarm, written by the handler with
// write(2) alone (async-signal-safe), as timeout(1) ends a command.
char g_timeout_message[256];

extern "C" void on_timeout(int) {
  const ssize_t ignored = ::write(STDERR_FILENO, g_timeout_message, std::strlen(g_timeout_message));
  (void)ignored;
  ::_exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace torchpilot;
  CLI::App app{
      "torchpilot-analyze: reads a PyTorch profiler (Kineto) trace and prints torchpilot's "
      "advice for the profiled steps (docs/analyze.md)"};
  example_cli::last_wins(app);
  app.set_version_flag("--version", std::string("torchpilot-analyze ") + TORCHPILOT_VERSION);
  std::string trace_path, config_path, device_name, frontend = "auto";
  double peak_tflops = 0;
  bool as_json = false;
  app.add_option("TRACE", trace_path, "the trace: .json or .json.gz (torch.profiler's export)")
      ->required()
      ->check(example_cli::Path())
      ->type_name("FILE");
  example_cli::add_path(app, "--config", config_path, "FILE",
                        "a torchpilot YAML config (advisors' thresholds, flops.peak_tflops, ...)")
      ->check(example_cli::ExistingFile());
  app.add_flag(
      "--json", as_json,
      "print the epoch's summary and advice as one JSON line (as log.json_path's records)");
  example_cli::add_number(app, "--peak-tflops", peak_tflops, 0, 1e6,
                          "dense peak TFLOP/s for MFU, every precision (default: the device table "
                          "row of the trace's GPU, or flops.peak_tflops)");
  app.add_option("--device-name", device_name,
                 "the GPU's name for the peak table (default: the trace's deviceProperties)")
      ->check(CLI::Validator(
          [](std::string& s) { return s.empty() ? std::string("an empty name") : std::string(); },
          ""))
      ->type_name("NAME");
  app.add_option("--frontend", frontend,
                 "the language of the actions: python (torch.profiler's traces), cxx (LibTorch's), "
                 "or auto (told by the trace's marks)")
      ->check(CLI::IsMember({"auto", "python", "cxx"}))
      ->capture_default_str();
  KinetoLimits limits;
  int64_t max_input_mb = limits.max_input_bytes >> 20;
  int64_t max_seconds = 300;
  example_cli::add_int(app, "--max-input-mb", max_input_mb, 1, 65536,
                       "refuse a trace file, or its text once decompressed, larger than this "
                       "(MB; default 512)");
  example_cli::add_int(app, "--max-events", limits.max_events, 1, int64_t{1} << 40,
                       "refuse a trace of more events than this (default 4000000)");
  example_cli::add_int(app, "--max-seconds", max_seconds, 1, 86400,
                       "give up (status 2) after this many seconds (default 300)");
  example_cli::parse_or_exit(app, argc, argv);
  limits.max_input_bytes = max_input_mb << 20;
  std::snprintf(g_timeout_message, sizeof g_timeout_message,
                "torchpilot-analyze: gave up after %lld s (--max-seconds)\n",
                static_cast<long long>(max_seconds));
  ::signal(SIGALRM, on_timeout);
  ::alarm(static_cast<unsigned>(max_seconds));
  const std::string trace_name = printable(trace_path);

  Config config;
  if (!config_path.empty()) {
    try {
      config = Config::from_yaml_file(config_path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torchpilot-analyze: --config: %s\n", e.what());
      return 2;
    }
  }
  KinetoTrace trace;
  try {
    trace = parse_kineto_trace(read_trace_file(trace_path, limits), limits);
  } catch (const KinetoError& e) {
    const std::string what = e.what();
    // read_trace_file names the file; the parser's messages do not.
    const bool named = what.rfind(trace_name, 0) == 0;
    std::fprintf(stderr, "torchpilot-analyze: %s%s\n", named ? "" : (trace_name + ": ").c_str(),
                 what.c_str());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "torchpilot-analyze: %s: out of memory reading the trace: lower --max-input-mb "
                 "or --max-events, or raise the memory limit\n",
                 trace_name.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torchpilot-analyze: %s: %s\n", trace_name.c_str(), e.what());
    return 2;
  }
  KinetoOptions options;
  options.peak_tflops = peak_tflops > 0 ? peak_tflops : config.flops.peak_tflops;
  options.device_name = device_name;
  options.link_peak_gbps = config.comm.link_peak_gbps;
  const EpochSummary summary = kineto_epoch_summary(trace, options);
  std::vector<std::string> errors;
  std::vector<Advice> advice = run_advisors(summary, config, &errors);
  const bool told = frontend != "auto";
  if (!told) frontend = trace.frontend;
  use_frontend_actions(frontend, advice);
  const std::string made_by =
      told ? "--frontend " + frontend
           : (frontend == "python" ? "Python's torch.profiler (" + trace.frontend_evidence + ")"
                                   : "no mark of Python's torch.profiler: LibTorch's profiler");

  if (as_json) {
    nlohmann::json j = nlohmann::json::parse(epoch_json(summary, advice));
    j["trace"] = {{"frontend", frontend}, {"frontend_from", made_by}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("trace %s: %zu profiled steps (ProfilerStep#%lld..#%lld) on %s\n",
                trace_name.c_str(), trace.steps.size(),
                static_cast<long long>(trace.steps.front().number),
                static_cast<long long>(trace.steps.back().number),
                trace.device.empty() ? "no GPU" : trace.device.c_str());
    std::printf("  (actions for %s: %s)\n", frontend == "python" ? "Python" : "C++",
                made_by.c_str());
    for (const std::string& note : trace.notes) std::printf("  (%s)\n", note.c_str());
    for (const std::string& line : format_epoch(summary, advice)) {
      std::printf("%s\n", line.c_str());
    }
  }
  for (const std::string& e : errors) {
    std::fprintf(stderr, "torchpilot-analyze: advisor failed: %s\n", e.c_str());
  }
  return 0;
}
