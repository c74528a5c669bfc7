#include "torchpilot/runtime/reports/trace_events.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/format.h"
#include "torchpilot/runtime/gpu/gpu_records.h"

namespace torchpilot {
namespace {

using detail::json;

const char* copy_kind_name(const CopyRecord& c) {
  static constexpr const char* kNames[] = {"HtoD", "DtoH", "DtoD", "copy"};
  static_assert(std::size(kNames) == static_cast<size_t>(CopyKind::kOther) + 1);
  return c.memset ? "memset" : detail::enum_name(c.kind, kNames, "copy");
}

// Builds the event list. Times are microseconds from the window's start (small numbers keep
// nanosecond precision in a double); the origin on the steady clock is in otherData.
class TraceBuilder {
 public:
  explicit TraceBuilder(Nanos origin) : origin_(origin) {}

  double us(Nanos t) const { return static_cast<double>(t - origin_) / 1000.0; }

  // A track's complete events; overlapping events that do not nest go to further lanes (each its
  // own tid, named "<track> (lane n)"), so every tid's events nest.
  struct Slice {
    Interval span;
    std::string name;
    json args;
  };
  void track(int pid, const std::string& name, std::vector<Slice> slices) {
    if (slices.empty()) return;
    std::stable_sort(slices.begin(), slices.end(), [](const Slice& a, const Slice& b) {
      return a.span.begin != b.span.begin ? a.span.begin < b.span.begin : a.span.end > b.span.end;
    });
    std::vector<std::vector<Nanos>> lanes;  // each lane's stack of open ends
    std::vector<int> lane_tids;
    for (Slice& s : slices) {
      s.span.end = std::max(s.span.end, s.span.begin);
      size_t lane = 0;
      for (; lane < lanes.size(); ++lane) {
        auto& stack = lanes[lane];
        while (!stack.empty() && stack.back() <= s.span.begin) stack.pop_back();
        if (stack.empty() || stack.back() >= s.span.end) break;
      }
      if (lane == lanes.size()) {
        lanes.emplace_back();
        lane_tids.push_back(
            new_thread(pid, lane == 0 ? name : name + " (lane " + std::to_string(lane + 1) + ")"));
      }
      lanes[lane].push_back(s.span.end);
      json e = {{"ph", "X"},
                {"name", s.name},
                {"pid", pid},
                {"tid", lane_tids[lane]},
                {"ts", us(s.span.begin)},
                {"dur", static_cast<double>(s.span.end - s.span.begin) / 1000.0}};
      if (!s.args.is_null()) e["args"] = std::move(s.args);
      events_.push_back(std::move(e));
    }
  }

  void process(int pid, const std::string& name, int sort) {
    events_.push_back({{"ph", "M"},
                       {"name", "process_name"},
                       {"pid", pid},
                       {"tid", 0},
                       {"args", {{"name", name}}}});
    events_.push_back({{"ph", "M"},
                       {"name", "process_sort_index"},
                       {"pid", pid},
                       {"tid", 0},
                       {"args", {{"sort_index", sort}}}});
  }

  void counter(int pid, const char* name, Nanos t, double value) {
    if (!measured(value)) return;
    events_.push_back(
        {{"ph", "C"}, {"name", name}, {"pid", pid}, {"ts", us(t)}, {"args", {{name, value}}}});
  }

  void instant(int pid, int tid, const std::string& name, Nanos t, json args) {
    events_.push_back({{"ph", "i"},
                       {"s", "g"},
                       {"name", name},
                       {"pid", pid},
                       {"tid", tid},
                       {"ts", us(t)},
                       {"args", std::move(args)}});
  }

  json finish(json other) {
    return {{"traceEvents", std::move(events_)},
            {"displayTimeUnit", "ns"},
            {"otherData", std::move(other)}};
  }

 private:
  int new_thread(int pid, const std::string& name) {
    const int tid = ++next_tid_;
    events_.push_back({{"ph", "M"},
                       {"name", "thread_name"},
                       {"pid", pid},
                       {"tid", tid},
                       {"args", {{"name", name}}}});
    events_.push_back({{"ph", "M"},
                       {"name", "thread_sort_index"},
                       {"pid", pid},
                       {"tid", tid},
                       {"args", {{"sort_index", tid}}}});
    return tid;
  }

  Nanos origin_;
  int next_tid_ = 0;
  json events_ = json::array();
};

constexpr int kHostPid = 1;
constexpr int kGpuPid = 2;

}  // namespace

Interval GpuWindowRecord::span() const {
  Interval s{0, 0};
  bool any = false;
  auto add = [&](Interval i) {
    if (!any) s = i;
    s.begin = std::min(s.begin, i.begin);
    s.end = std::max(s.end, i.end);
    any = true;
  };
  for (const WindowStep& w : steps) {
    add(w.host);
    if (w.gpu_timed) add(w.gpu);
  }
  return s;
}

std::string section_json(const GpuWindowRecord& w) {
  const Interval s = w.span();
  json j = {{"first_step", w.steps.empty() ? -1 : w.steps.front().step},
            {"last_step", w.steps.empty() ? -1 : w.steps.back().step},
            {"span_ms", detail::ms(s.end - s.begin)},
            {"kernels", w.kernels.size()},
            {"copies", w.copies.size()},
            {"host_syncs", w.host_syncs.size()},
            {"pm_samples", w.pm.size()}};
  return detail::dump(j);
}

std::string trace_run_id() {
  static std::atomic<int> sinks{0};
  const int n = ++sinks;
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &utc);
  std::string run = std::string(buf) + "-" + std::to_string(static_cast<long long>(getpid()));
  if (n > 1) run += "-" + std::to_string(n);
  return run;
}

std::string window_trace_file_name(const std::string& run, const GpuWindowRecord& w) {
  const long long first = w.steps.empty() ? 0 : static_cast<long long>(w.steps.front().step);
  const long long last = w.steps.empty() ? 0 : static_cast<long long>(w.steps.back().step);
  char buf[96];
  std::snprintf(buf, sizeof buf, "_window_e%lld_s%lld-%lld.json", static_cast<long long>(w.epoch),
                first, last);
  return run + buf;
}

std::string window_trace_json(const GpuWindowRecord& w, const std::vector<Advice>& advice) {
  const Interval span = w.span();
  TraceBuilder b(span.begin);
  b.process(kHostPid, "training thread", 1);
  b.process(kGpuPid, w.device.empty() ? std::string("GPU") : "GPU " + w.device, 2);

  // The training thread: steps with their phases nested inside, waits and syncs on their own.
  std::vector<TraceBuilder::Slice> steps, waits, syncs, gpu_steps, copies;
  for (const WindowStep& s : w.steps) {
    steps.push_back(
        {s.host,
         "step " + std::to_string(s.step),
         {{"step", s.step}, {"data_wait_ms", detail::ms(s.data_wait.end - s.data_wait.begin)}}});
    if (s.data_wait.end > s.data_wait.begin)
      waits.push_back({s.data_wait, "data wait", {{"step", s.step}}});
    if (s.gpu_timed) gpu_steps.push_back({s.gpu, "step " + std::to_string(s.step), {}});
  }
  for (const WindowPhase& p : w.phases) steps.push_back({p.span, p.name, {}});
  for (const WindowPhase& p : w.gpu_phases) gpu_steps.push_back({p.span, p.name, {}});
  for (const SyncRecord& s : w.host_syncs) {
    syncs.push_back(
        {{s.begin, s.end},
         s.cause.empty() ? std::string(to_string(s.api)) : s.cause,
         {{"api", to_string(s.api)}, {"phase", s.phase}, {"thread", to_string(s.thread)}}});
  }
  b.track(kHostPid, "steps and phases", std::move(steps));
  b.track(kHostPid, "data wait", std::move(waits));
  b.track(kHostPid, "host syncs", std::move(syncs));

  // The GPU: its step spans, kernels per stream, copies.
  b.track(kGpuPid, "GPU steps", std::move(gpu_steps));
  std::map<uint32_t, std::vector<TraceBuilder::Slice>> streams;
  for (const KernelRecord& k : w.kernels) {
    streams[k.stream].push_back({{k.begin, k.end},
                                 k.name,
                                 {{"blocks", k.blocks},
                                  {"block_threads", k.block_threads},
                                  {"communication", k.communication}}});
  }
  for (auto& [stream, slices] : streams) {
    b.track(kGpuPid, "stream " + std::to_string(stream), std::move(slices));
  }
  for (const CopyRecord& c : w.copies) {
    copies.push_back({{c.begin, c.end},
                      std::string(copy_kind_name(c)) + (c.pageable ? " (pageable)" : ""),
                      {{"bytes", c.bytes}, {"pageable", c.pageable}}});
  }
  b.track(kGpuPid, "copies", std::move(copies));

  // PM samples: one counter track per figure, named as everywhere else (docs/metrics.md).
  for (const PmSample& p : w.pm) {
    b.counter(kGpuPid, "counter_utilization", p.begin, p.counter_utilization);
    b.counter(kGpuPid, "sm_efficiency", p.begin, p.sm_efficiency);
    b.counter(kGpuPid, "tensor_activity", p.begin, p.tensor_activity);
    b.counter(kGpuPid, "dram_throughput", p.begin, p.dram_throughput);
    b.counter(kGpuPid, "achieved_occupancy", p.begin, p.achieved_occupancy);
  }

  for (const Advice& a : advice) {
    json evidence = json::object();
    for (const Evidence& e : a.evidence) evidence[e.name] = {{"value", e.value}, {"unit", e.unit}};
    b.instant(kHostPid, 0, "ADVICE " + a.id, span.end,
              {{"severity", to_string(a.severity)},
               {"finding", a.finding},
               {"cause", a.cause},
               {"action", a.action},
               {"expected_gain", a.expected_gain},
               {"evidence", evidence}});
  }
  json other = {{"source", "torchpilot"},
                {"epoch", w.epoch},
                {"steady_clock_origin_ns", span.begin},
                {"first_step", w.steps.empty() ? -1 : w.steps.front().step},
                {"last_step", w.steps.empty() ? -1 : w.steps.back().step}};
  return detail::dump(b.finish(std::move(other)));
}

namespace {

class TraceSink : public Sink {
 public:
  TraceSink(std::string dir, std::shared_ptr<spdlog::logger> logger)
      : dir_(std::move(dir)), run_(trace_run_id()), logger_(std::move(logger)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec || !std::filesystem::is_directory(dir_)) {
      throw ConfigError("<config>", "report.trace_dir",
                        "cannot create the directory '" + dir_ + "': " + ec.message());
    }
  }
  std::string name() const override { return "trace"; }
  void on_late_step(const LateStepRecord& r) override {
    if (const auto* w = r.get<GpuWindowRecord>()) pending_.push_back({*w, false});
  }
  void on_epoch(const EpochSummary& summary, const std::vector<Advice>& advice) override {
    if (!checked_gpu_ && logger_ != nullptr && summary.sections.get<GpuEpochStats>() == nullptr) {
      // A user who set trace_dir would otherwise find an empty folder and no reason.
      logger_->info(
          "report.trace_dir: this run observes no GPU (no GPU, or gpu.enabled false), so no trace "
          "windows are written to '{}': they record GPU activity",
          dir_);
    }
    checked_gpu_ = true;
    for (const auto& p : pending_) write(p.window, advice);
    pending_.clear();
  }
  void flush() override {
    for (auto& p : pending_) {
      if (p.written) continue;
      write(p.window, {});
      p.written = true;
    }
  }

 private:
  void write(const GpuWindowRecord& w, const std::vector<Advice>& advice) {
    const std::filesystem::path path =
        std::filesystem::path(dir_) / window_trace_file_name(run_, w);
    const std::filesystem::path tmp = path.string() + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << window_trace_json(w, advice);
      if (!out) throw std::runtime_error("cannot write '" + tmp.string() + "'");
    }
    std::filesystem::rename(tmp, path);  // a reader never sees half a file
  }
  struct Pending {
    GpuWindowRecord window;
    bool written = false;
  };
  std::string dir_;
  std::string run_;  // in every file's name: a later run never replaces this one's files
  std::shared_ptr<spdlog::logger> logger_;
  bool checked_gpu_ = false;
  std::vector<Pending> pending_;
};

}  // namespace

std::shared_ptr<Sink> make_trace_sink(const std::string& dir,
                                      std::shared_ptr<spdlog::logger> logger) {
  return std::make_shared<TraceSink>(dir, std::move(logger));
}

}  // namespace torchpilot
