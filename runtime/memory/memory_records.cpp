#include "torchpilot/runtime/memory/memory_records.h"

#include <cstdio>

#include "torchpilot/runtime/core/format.h"

namespace torchpilot {

namespace {
double share(int64_t part, int64_t whole) {
  return whole > 0 ? static_cast<double>(part) / static_cast<double>(whole) : 0;
}
double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024 * 1024); }
}  // namespace

double MemoryEpochStats::peak_allocated_fraction() const {
  return share(peak_allocated_bytes, capacity_bytes);
}
double MemoryEpochStats::peak_reserved_fraction() const {
  return share(peak_reserved_bytes, capacity_bytes);
}

std::string section_json(const MemoryEpochStats& m) {
  return detail::dump({{"device", m.device},
                       {"capacity_bytes", m.capacity_bytes},
                       {"peak_allocated_bytes", m.peak_allocated_bytes},
                       {"peak_reserved_bytes", m.peak_reserved_bytes},
                       {"reserved_bytes", m.reserved_bytes},
                       {"slack_bytes", m.slack_bytes()},
                       {"alloc_retries", m.alloc_retries},
                       {"ooms", m.ooms},
                       {"peak_allocated_fraction", m.peak_allocated_fraction()},
                       {"peak_reserved_fraction", m.peak_reserved_fraction()}});
}

void section_text(const MemoryEpochStats& m, const EpochSummary&, std::vector<std::string>& lines) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "  memory (GPU %d): peak allocated %.2f GiB (%.1f%% of %.1f GiB), peak reserved "
                "%.2f GiB (%.1f%%), %.2f GiB reserved but not allocated at the peak; %lld "
                "allocator retries, %lld OOMs",
                m.device, gib(m.peak_allocated_bytes), 100 * m.peak_allocated_fraction(),
                gib(m.capacity_bytes), gib(m.peak_reserved_bytes), 100 * m.peak_reserved_fraction(),
                gib(m.slack_bytes()), static_cast<long long>(m.alloc_retries),
                static_cast<long long>(m.ooms));
  lines.push_back(buf);
}

}  // namespace torchpilot
