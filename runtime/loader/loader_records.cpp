// The loader section's JSON and advisory-log text (loader_records.h).
#include "torchpilot/runtime/loader/loader_records.h"

#include <string>
#include <vector>

#include "torchpilot/runtime/core/format.h"
#include "torchpilot/runtime/core/metrics.h"

namespace torchpilot {
namespace {
using namespace detail;
}  // namespace

namespace {
json known(int64_t v, bool is_known = true) { return is_known && v >= 0 ? json(v) : json(nullptr); }
std::string known_text(int64_t v, bool is_known = true) {
  return is_known && v >= 0 ? std::to_string(v) : std::string("unknown");
}
}  // namespace

std::string section_json(const LoaderStats& l) {
  return dump(json{{"name", l.name},
                   {"tunable", l.tunable},
                   {"settings_known", l.settings_known},
                   {"workers", known(l.settings.workers, l.settings_known)},
                   {"batch_size", known(l.batch_size)},
                   {"max_jobs", known(l.max_jobs)},
                   {"timeout_ms", known(l.timeout_ms)},
                   {"prefetch", l.settings.prefetch},
                   {"pin_memory", l.settings.pin_memory},
                   {"device_prefetch", l.settings.device_prefetch},
                   {"max_workers", l.max_workers},
                   {"batches", l.batches},
                   {"produce_count", l.produce_count},
                   {"produce_ms", ms(l.produce_ns)},
                   {"produce_cpu_ms", ms(l.produce_cpu_ns)},
                   {"production_estimated", l.production_estimated},
                   {"blocked_count", l.blocked_count},
                   {"wait_ms", ms(l.wait_ns)}});
}

void section_text(const LoaderStats& loader, const EpochSummary&, std::vector<std::string>& lines) {
  {
    const LoaderStats& l = loader;
    if (!l.tunable) {
      // A watched loader: what its own options say, "unknown" where they cannot be read.
      std::string line = "  loader (" + l.name + "): workers " +
                         known_text(l.settings.workers, l.settings_known) + ", batch size " +
                         known_text(l.batch_size) + ", max jobs " + known_text(l.max_jobs) +
                         ", timeout " +
                         (l.timeout_ms == 0  ? std::string("none")
                          : l.timeout_ms > 0 ? std::to_string(l.timeout_ms) + " ms"
                                             : std::string("unknown"));
      if (l.settings_known) line += "; no pinned memory or GPU prefetch (stock LibTorch loader)";
      if (l.produce_count > 0 && l.produce_ns > 0) {
        // Per batch per thread, as a TunableLoader's; the CPU share tells waiting from working.
        line += "; " + std::string(l.production_estimated ? "about " : "") +
                fmt_ms(l.produce_ns / l.produce_count) + " a batch per " +
                (l.settings.workers > 0 ? "worker" : "training thread") + ", " +
                fmt_pct(fraction(l.produce_cpu_ns, l.produce_ns)) + " of it on the CPU" +
                (l.production_estimated ? " at most" : "");
      }
      lines.push_back(line);
      return;
    }
    std::string line = "  loader (" + l.name + "): workers " + std::to_string(l.settings.workers) +
                       ", prefetch " + std::to_string(l.settings.prefetch) + ", pinned " +
                       (l.settings.pin_memory ? "yes" : "no") + ", device prefetch " +
                       (l.settings.device_prefetch ? "yes" : "no");
    if (l.produce_count > 0) {
      line += "; " + std::to_string(l.produce_count) + " batches at " +
              fmt_ms(l.produce_ns / l.produce_count) + " each (per thread)";
    }
    lines.push_back(line);
  }
}

LoaderStats loader_delta(const LoaderStats& later, const LoaderStats& earlier) {
  LoaderStats d = later;
  d.batches -= earlier.batches;
  d.produce_count -= earlier.produce_count;
  d.produce_ns -= earlier.produce_ns;
  d.produce_cpu_ns -= earlier.produce_cpu_ns;
  d.blocked_count -= earlier.blocked_count;
  d.wait_ns -= earlier.wait_ns;
  return d;
}

}  // namespace torchpilot
