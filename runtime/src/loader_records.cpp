// The loader section's JSON and advisory-log text (loader_records.h).
#include "torchpilot/runtime/loader_records.h"

#include <string>
#include <vector>

#include "format.h"

namespace torchpilot {
namespace {
using namespace detail;
}  // namespace

std::string section_json(const LoaderStats& l) {
  return dump(json{{"name", l.name},
                   {"tunable", l.tunable},
                   {"workers", l.settings.workers},
                   {"prefetch", l.settings.prefetch},
                   {"pin_memory", l.settings.pin_memory},
                   {"device_prefetch", l.settings.device_prefetch},
                   {"max_workers", l.max_workers},
                   {"batches", l.batches},
                   {"produce_count", l.produce_count},
                   {"produce_ms", ms(l.produce_ns)},
                   {"produce_cpu_ms", ms(l.produce_cpu_ns)},
                   {"blocked_count", l.blocked_count},
                   {"wait_ms", ms(l.wait_ns)}});
}

void section_text(const LoaderStats& loader, const EpochSummary&, std::vector<std::string>& lines) {
  {
    const LoaderStats& l = loader;
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

}  // namespace torchpilot
