#include "torchpilot/runtime/analyze/kineto_trace.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "kineto_trace_internal.h"
#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/flops/attention_detector.h"
#include "torchpilot/runtime/flops/device_peaks.h"
#include "torchpilot/runtime/flops/flop_formulas.h"
#include "torchpilot/runtime/gpu/gpu_epoch_accumulator.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"

namespace torchpilot {
namespace {

using json = nlohmann::json;
using kineto_detail::count_flops;
using kineto_detail::CpuOp;

// Kineto writes times in microseconds (fractional, ns resolution).
Nanos us_to_ns(double us) { return static_cast<Nanos>(std::llround(us * 1000.0)); }

struct Span {
  Nanos begin = 0, end = 0;
  int64_t tid = 0;
  std::string name;
  const json* args = nullptr;
};

int64_t tid_of(const json& e) {
  const auto it = e.find("tid");
  if (it == e.end() || !it->is_number_integer()) return std::numeric_limits<int64_t>::min();
  return it->get<int64_t>();
}

int64_t int_arg(const json* args, const char* key, int64_t fallback) {
  if (args == nullptr) return fallback;
  const auto it = args->find(key);
  if (it == args->end() || !it->is_number()) return fallback;
  return it->get<int64_t>();
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}
bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

SyncApi sync_api(std::string_view name) {
  if (name == "cudaStreamSynchronize" || name == "cuStreamSynchronize") {
    return SyncApi::kStreamSynchronize;
  }
  if (name == "cudaEventSynchronize" || name == "cuEventSynchronize") {
    return SyncApi::kEventSynchronize;
  }
  if (name == "cudaDeviceSynchronize" || name == "cuCtxSynchronize") {
    return SyncApi::kDeviceSynchronize;
  }
  return SyncApi::kUnknown;
}

CopyKind copy_kind(std::string_view name) {
  if (contains(name, "HtoD")) return CopyKind::kHostToDevice;
  if (contains(name, "DtoH")) return CopyKind::kDeviceToHost;
  if (contains(name, "DtoD")) return CopyKind::kDeviceToDevice;
  return CopyKind::kOther;
}

int64_t dims_product(const json* args, const char* key) {
  if (args == nullptr) return 0;
  const auto it = args->find(key);
  if (it == args->end() || !it->is_array()) return 0;
  int64_t p = 1;
  for (const json& v : *it) p *= v.is_number_integer() ? v.get<int64_t>() : 1;
  return p;
}

// The phase open at `t` (innermost: the latest-starting span that holds it).
int phase_at(const std::vector<std::pair<Interval, int>>& phases, Nanos t) {
  int best = -1;
  Nanos best_begin = std::numeric_limits<Nanos>::min();
  for (const auto& [span, id] : phases) {
    if (t >= span.begin && t <= span.end && span.begin >= best_begin) {
      best = id;
      best_begin = span.begin;
    }
  }
  return best;
}

}  // namespace

std::string read_trace_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw KinetoError(path + ": cannot open: " + std::strerror(errno));
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw KinetoError(path + ": cannot read");
  if (raw.size() < 2 || static_cast<unsigned char>(raw[0]) != 0x1f ||
      static_cast<unsigned char>(raw[1]) != 0x8b) {
    return raw;
  }
  // gzip (windowBits 15 + 32: gzip or zlib header detected).
  z_stream z{};
  if (inflateInit2(&z, 15 + 32) != Z_OK) throw KinetoError(path + ": zlib cannot start");
  z.next_in = reinterpret_cast<Bytef*>(raw.data());
  z.avail_in = static_cast<uInt>(raw.size());
  std::string out;
  char buffer[1 << 16];
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    z.next_out = reinterpret_cast<Bytef*>(buffer);
    z.avail_out = sizeof buffer;
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      inflateEnd(&z);
      throw KinetoError(path + ": not a valid gzip file (" + (z.msg ? z.msg : "inflate failed") +
                        ")");
    }
    out.append(buffer, sizeof buffer - z.avail_out);
    if (rc == Z_OK && z.avail_in == 0 && z.avail_out != 0) {
      inflateEnd(&z);
      throw KinetoError(path + ": truncated gzip file");
    }
  }
  inflateEnd(&z);
  return out;
}

KinetoTrace parse_kineto_trace(std::string_view text) {
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw KinetoError("not JSON");
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array()) {
    throw KinetoError("not a Kineto trace: no \"traceEvents\" array");
  }
  KinetoTrace t;
  if (const auto props = doc.find("deviceProperties");
      props != doc.end() && props->is_array() && !props->empty()) {
    const json& d = (*props)[0];
    t.device = d.value("name", std::string());
    t.sm_count = d.value("numSms", 0);
  }
  t.shapes = doc.value("record_shapes", 0) != 0;
  if (const auto dist = doc.find("distributedInfo"); dist != doc.end() && dist->is_object()) {
    t.comm_backend = dist->value("backend", std::string());
    t.rank = dist->value("rank", 0);
    t.world_size = dist->value("world_size", 1);
  }

  const json& events = doc["traceEvents"];
  std::vector<Span> step_spans, loader_waits, annotations, runtime;
  std::vector<CpuOp> ops;
  struct Launch {
    Nanos begin = 0;
    int64_t tid = 0;
  };
  std::unordered_map<int64_t, Launch> launches;  // by correlation id
  struct GpuActivity {
    Nanos begin = 0, end = 0;
    uint32_t stream = 0;
    int64_t correlation = -1;
  };
  std::vector<GpuActivity> activities;
  std::vector<std::pair<int64_t, size_t>> kernel_correlation;  // (correlation, kernel index)
  for (const json& e : events) {
    if (!e.is_object() || e.value("ph", std::string()) != "X") continue;
    const auto cat_it = e.find("cat");
    const auto name_it = e.find("name");
    const auto ts_it = e.find("ts");
    if (cat_it == e.end() || name_it == e.end() || ts_it == e.end() || !cat_it->is_string() ||
        !name_it->is_string() || !ts_it->is_number()) {
      continue;
    }
    const std::string& cat = cat_it->get_ref<const std::string&>();
    const std::string& name = name_it->get_ref<const std::string&>();
    const double ts = ts_it->get<double>();
    const double dur = e.value("dur", 0.0);
    Span s;
    s.begin = us_to_ns(ts);
    s.end = us_to_ns(ts + dur);
    s.tid = tid_of(e);
    s.name = name;
    const auto args_it = e.find("args");
    s.args = args_it != e.end() && args_it->is_object() ? &*args_it : nullptr;
    if (cat == "user_annotation") {
      if (starts_with(name, "ProfilerStep#")) {
        step_spans.push_back(s);
      } else if (starts_with(name, "enumerate(DataLoader)")) {
        loader_waits.push_back(s);
      } else if (!starts_with(name, "nccl:") && !starts_with(name, "gloo:")) {
        annotations.push_back(s);
      }
    } else if (cat == "cpu_op") {
      ops.push_back({s.begin, s.end, s.tid, name, s.args, op_kind(name)});
      if (name == "record_param_comms" && s.args != nullptr) {
        CollectiveRecord c;
        const std::string coll = s.args->value("Collective name", std::string());
        c.op = comm_op_from_name(coll);
        c.name = coll;
        c.dtype = s.args->value("dtype", std::string());
        static const std::map<std::string, int64_t> kBytes = {
            {"Float", 4}, {"Double", 8}, {"Half", 2}, {"BFloat16", 2}, {"Int", 4},
            {"Long", 8},  {"Byte", 1},   {"Char", 1}, {"Bool", 1}};
        const auto b = kBytes.find(c.dtype);
        c.bytes = int_arg(s.args, "In msg nelems", 0) * (b != kBytes.end() ? b->second : 4);
        c.group_size = static_cast<int>(int_arg(s.args, "Group size", 0));
        c.begin_ns = s.begin;
        c.end_ns = s.end;
        c.seq = static_cast<int64_t>(t.collectives.size()) + 1;
        t.collectives.push_back(c);
      }
    } else if (cat == "cuda_runtime" || cat == "cuda_driver") {
      const int64_t corr = int_arg(s.args, "correlation", -1);
      if (corr >= 0) launches[corr] = {s.begin, s.tid};
      runtime.push_back(s);
    } else if (cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset") {
      const uint32_t stream = static_cast<uint32_t>(int_arg(s.args, "stream", 0));
      const int64_t corr = int_arg(s.args, "correlation", -1);
      activities.push_back({s.begin, s.end, stream, corr});
      if (cat == "kernel") {
        KernelRecord k;
        k.begin = s.begin;
        k.end = s.end;
        k.blocks = dims_product(s.args, "grid");
        k.block_threads = static_cast<int32_t>(dims_product(s.args, "block"));
        k.stream = stream;
        k.name = name;
        k.communication = is_communication_kernel(name);
        kernel_correlation.emplace_back(corr, t.events.kernels.size());
        t.events.kernels.push_back(std::move(k));
      } else {
        CopyRecord c;
        c.begin = s.begin;
        c.end = s.end;
        c.bytes = int_arg(s.args, "bytes", 0);
        c.memset = cat == "gpu_memset";
        c.kind = c.memset ? CopyKind::kOther : copy_kind(name);
        c.pageable = contains(name, "Pageable");
        t.events.copies.push_back(c);
      }
    }
  }
  if (step_spans.empty()) {
    throw KinetoError(
        "no profiler steps (ProfilerStep#N spans): profile with a schedule and call prof.step() "
        "once per training step");
  }
  std::sort(step_spans.begin(), step_spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  t.trainer_thread = step_spans.front().tid;
  const int64_t trainer = t.trainer_thread;

  // Phases: the user annotations (record_function) on the training thread.
  std::vector<std::pair<Interval, int>> phase_spans;
  for (const Span& a : annotations) {
    if (a.tid != trainer) continue;
    auto it = std::find(t.phases.begin(), t.phases.end(), a.name);
    int id = static_cast<int>(it - t.phases.begin());
    if (it == t.phases.end()) {
      if (t.phases.size() >= static_cast<size_t>(kMaxPhases)) continue;
      t.phases.push_back(a.name);
    }
    phase_spans.push_back({{a.begin, a.end}, id});
  }

  // The trainer's stream: where most of the kernels it launched ran (its step markers' stream).
  {
    std::map<uint32_t, int64_t> count;
    for (const auto& [corr, index] : kernel_correlation) {
      const auto l = launches.find(corr);
      if (l != launches.end() && l->second.tid == trainer) ++count[t.events.kernels[index].stream];
    }
    int64_t best = -1;
    for (const auto& [stream, n] : count) {
      if (n > best) {
        best = n;
        t.marker_stream = stream;
      }
    }
  }
  // When the GPU reaches a marker recorded at host time `at` on that stream: once the work
  // launched on it before `at` has run (never before `at` itself). Work whose launch is not in
  // the trace was launched before profiling began (the schedule's warm-up steps, still queued):
  // the first step's span starts after it.
  auto reached = [&](Nanos at) {
    Nanos r = at;
    for (const GpuActivity& a : activities) {
      if (a.stream != t.marker_stream) continue;
      const auto l = launches.find(a.correlation);
      if (l == launches.end() || l->second.begin < at) r = std::max(r, a.end);
    }
    return r;
  };

  for (size_t i = 0; i < step_spans.size(); ++i) {
    const Span& s = step_spans[i];
    KinetoStep k;
    const auto hash = s.name.find('#');
    k.number = std::strtoll(s.name.c_str() + hash + 1, nullptr, 10);
    k.spans.host = {s.begin, s.end};
    k.spans.gpu = {reached(s.begin), reached(s.end)};
    // Consecutive steps share a boundary: the GPU span starts where the previous one ended.
    if (i > 0) k.spans.gpu.begin = t.steps.back().spans.gpu.end;
    k.spans.gpu_timed = true;
    k.spans.traced = true;
    Nanos longest = -1;
    for (const Span& w : loader_waits) {
      if (w.tid != trainer || w.begin < s.begin || w.begin >= s.end) continue;
      const Nanos len = std::min(w.end, s.end) - w.begin;
      k.data_wait_ns += len;
      if (len > longest) {
        longest = len;
        k.spans.data_wait = {w.begin, std::min(w.end, s.end)};
      }
    }
    for (const auto& [span, id] : phase_spans) {
      const Nanos o = std::min(span.end, s.end) - std::max(span.begin, s.begin);
      if (o > 0) k.phase_ns[static_cast<size_t>(id)] += o;
    }
    for (const CollectiveRecord& c : t.collectives) {
      if (c.begin_ns >= s.begin && c.begin_ns < s.end) ++k.collectives;
    }
    t.steps.push_back(k);
  }

  // Host syncs: the synchronizing calls (their extent is the host's wait), with the thread that
  // made them; op scopes: the outermost ATen op around each sync and each copy to the host (the
  // live library's stack walk finds the same op).
  std::vector<const CpuOp*> aten_ops;
  for (const CpuOp& op : ops) {
    if (starts_with(op.name, "aten::")) aten_ops.push_back(&op);
  }
  auto outermost_op = [&](int64_t tid, Nanos begin, Nanos end) -> const CpuOp* {
    const CpuOp* best = nullptr;
    for (const CpuOp* op : aten_ops) {
      if (op->tid != tid || op->begin > begin || op->end < end) continue;
      if (best == nullptr || op->begin < best->begin ||
          (op->begin == best->begin && op->end > best->end)) {
        best = op;
      }
    }
    return best;
  };
  // Device-to-host copies by correlation (their runtime call is a copy to the host).
  std::set<int64_t> d2h_corr;
  for (const json& e : events) {
    if (!e.is_object() || e.value("cat", std::string()) != "gpu_memcpy") continue;
    const auto a = e.find("args");
    if (a == e.end() || !a->is_object()) continue;
    if (copy_kind(e.value("name", std::string())) == CopyKind::kDeviceToHost) {
      d2h_corr.insert(int_arg(&*a, "correlation", -1));
    }
  }
  std::unordered_map<const CpuOp*, uint64_t> call_ids;
  for (const Span& r : runtime) {
    const SyncApi api = sync_api(r.name);
    const int64_t corr = int_arg(r.args, "correlation", -1);
    const bool copy_to_host = (r.name == "cudaMemcpy" || r.name == "cudaMemcpyAsync" ||
                               r.name == "cuMemcpyDtoH" || r.name == "cuMemcpyDtoHAsync") &&
                              d2h_corr.count(corr) > 0;
    if (api == SyncApi::kUnknown && !copy_to_host) continue;
    const int phase = phase_at(phase_spans, r.begin);
    if (api != SyncApi::kUnknown) {
      SyncRecord s;
      s.begin = r.begin;
      s.end = r.end;
      s.api = api;
      s.cause = to_string(api);
      // After the last profiled step: the profiler's own synchronize at its stop, never a host
      // sync of the training loop (as the live library's own threads' syncs).
      s.thread = r.begin >= t.steps.back().spans.host.end ? SyncThread::kInternal
                 : r.tid == trainer                       ? SyncThread::kTrainer
                                                          : SyncThread::kOther;
      s.correlation_id = corr;
      if (phase >= 0) s.phase = t.phases[static_cast<size_t>(phase)];
      t.events.syncs.push_back(s);
    }
    if (const CpuOp* op = outermost_op(r.tid, r.begin, r.end)) {
      // The scope spans the op's call (the stack walk's op frame); one call id per op call.
      HostOpScope scope;
      scope.op = op->name;
      scope.always = false;
      scope.call = call_ids.emplace(op, call_ids.size() + 1).first->second;
      scope.begin = op->begin;
      scope.end = op->end;
      const int op_phase = phase_at(phase_spans, op->begin);
      if (op_phase >= 0) scope.phase = t.phases[static_cast<size_t>(op_phase)];
      t.events.scopes.push_back(scope);
    }
  }

  // FLOPs from the recorded shapes.
  if (t.shapes) {
    std::vector<FlopTally> tallies(t.steps.size());
    std::vector<CpuOp> tracked;
    for (const CpuOp& op : ops) {
      if (op.kind != OpKind::kUntracked) tracked.push_back(op);
    }
    count_flops(tracked, !t.device.empty(), t.steps, tallies);
    for (size_t i = 0; i < t.steps.size(); ++i) {
      t.steps[i].flops = tallies[i].per_step(1);
      t.steps[i].flops_known = true;
    }
  }

  t.notes.push_back(
      "PM sampling: not in a Kineto trace: SM efficiency, tensor-pipe activity, DRAM throughput "
      "and occupancy n/a (SM efficiency estimated from launch shapes)");
  t.notes.push_back("NVML: not in a Kineto trace: NVML utilization n/a");
  t.notes.push_back(
      "loader: production time, workers and CPU time are not in a Kineto trace: the data wait "
      "comes from the DataLoader's __next__ spans");
  if (!t.shapes) t.notes.push_back("FLOPs: record_shapes was off: no FLOP counts, no MFU");
  if (t.shapes) {
    t.notes.push_back(
        "FLOPs: counted from recorded shapes; whether TF32 was allowed is not in the trace: "
        "PyTorch's defaults assumed (fp32 matmuls fp32, fp32 convolutions TF32)");
  }
  t.notes.push_back(
      "steps: the samples per step are not in a Kineto trace (samples/s n/a); the profiler's own "
      "cost is in the step times");
  return t;
}
}  // namespace torchpilot
