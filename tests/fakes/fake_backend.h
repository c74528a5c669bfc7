// FakeBackend: the one fake GPU backend (GpuBackend) of the monitor's tests. It hands out whatever
// the test queued (`queued`, drained like the CUPTI backend's batches) and records what the monitor
// asked for: starts and stops, trace windows, flushes, releases, NVTX ranges, step markers. Every
// collector is active unless a test sets `statuses`; step markers are off unless it sets `markers`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace torchpilot {
namespace test {

class FakeBackend : public GpuBackend {
 public:
  GpuDeviceInfo info{0, "Fake GPU", "FAKE", 100};
  std::vector<CollectorStatus> statuses{
      {"pm_sampling", true, ""}, {"activity", true, ""}, {"nvml", true, ""}, {"nvtx", true, ""}};
  GpuEventBatch queued;
  bool tracing = false;
  int starts = 0, stops = 0, trace_starts = 0, trace_stops = 0, flushes = 0, releases = 0;
  std::vector<std::string> ranges;  // "+name" / "-"
  int depth = 0;
  // Step markers: off unless a test turns them on; the test resolves them (resolve()) or not.
  bool markers = false;
  std::vector<uint64_t> marker_ids;        // recorded, in order
  std::vector<uint64_t> awaited;           // await_marker() calls
  std::vector<uint64_t> resolved_at_stop;  // markers handed out before each stop_trace()
  std::vector<MarkerRecord> on_await;      // resolved when the monitor awaits (the GPU catches up)
  std::vector<uint64_t> handed_out;

  GpuDeviceInfo device() const override { return info; }
  std::vector<CollectorStatus> status() const override { return statuses; }
  void start() override { ++starts; }
  std::function<void()> on_start_trace;  // e.g. the start's cost on a manual clock
  int starts_while_releasing = 0;        // the CUPTI backend's start waits for the release to end
  bool start_trace() override {
    if (on_start_trace) on_start_trace();
    if (releasing) {
      ++starts_while_releasing;
      finish_release();
    }
    for (const auto& s : statuses) {
      if (s.name == "activity" && !s.active) return false;
    }
    ++trace_starts;
    tracing = true;
    return true;
  }
  void stop_trace() override {
    ++trace_stops;
    tracing = false;
    resolved_at_stop.push_back(handed_out.empty() ? 0 : handed_out.back());
  }
  bool record_marker(uint64_t id) override {
    if (!markers) return false;
    marker_ids.push_back(id);
    return true;
  }
  bool refuse_optional = false;  // as when the last events are kept for step markers
  bool record_optional_marker(uint64_t id) override {
    return !refuse_optional && record_marker(id);
  }
  void await_marker(uint64_t id, Nanos) override {
    awaited.push_back(id);
    for (const MarkerRecord& m : on_await) queued.markers.push_back(m);
    on_await.clear();
  }
  void resolve(uint64_t id, Nanos time) { queued.markers.push_back({id, time}); }
  // slow_release: a release runs (trace_releasing()) until waited for or set done by the test.
  bool slow_release = false, releasing = false;
  int finish_releases = 0;
  void release_trace() override {
    ++releases;
    releasing = slow_release;
  }
  bool trace_releasing() const override { return releasing; }
  void finish_release() override {
    if (releasing) ++finish_releases;
    releasing = false;
  }
  std::function<void()> on_flush;  // e.g. a PM decode's cost on a manual clock
  int flush_requests = 0;
  void flush() override {
    ++flushes;
    if (on_flush) on_flush();
  }
  void request_flush() override { ++flush_requests; }
  void drain(GpuEventBatch& out) override {
    auto move = [](auto& to, auto& from) {
      to.insert(to.end(), from.begin(), from.end());
      from.clear();
    };
    move(out.kernels, queued.kernels);
    move(out.copies, queued.copies);
    move(out.syncs, queued.syncs);
    move(out.pm, queued.pm);
    move(out.nvml, queued.nvml);
    out.pm_final_until = queued.pm_final_until;
    for (const MarkerRecord& m : queued.markers) handed_out.push_back(m.id);
    move(out.markers, queued.markers);
    out.dropped += queued.dropped;
    queued.dropped = 0;
  }
  void stop() override { ++stops; }
  void range_push(const char* name) override {
    ranges.push_back(std::string("+") + name);
    ++depth;
  }
  void range_pop() override {
    ranges.push_back("-");
    --depth;
  }
};

}  // namespace test
}  // namespace torchpilot
