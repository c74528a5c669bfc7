#include "torchpilot/runtime/analyze/kineto_trace.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "kineto_trace_internal.h"
#include "torchpilot/runtime/core/file_kind.h"
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

// The bounds of a believable value. Times: Kineto's steady clock or the Unix epoch in µs, kept
// well inside int64 nanoseconds (their sums and differences too). No profiled event lasts a day.
constexpr double kMaxTimeUs = 4e15;
constexpr double kMaxDurationUs = 86400e6;
constexpr double kMaxCount = 1125899906842624.0;  // 2^50: bytes, elements of a message
// FLOP/s a step's recorded shapes may count: 1000 PFLOP/s, over 100 times any GPU's dense peak.
constexpr double kMaxFlopRate = 1e18;

std::string number_text(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

// What a JSON value is, for messages ("is a string: expected a number").
const char* kind_of(const json& v) {
  switch (v.type()) {
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::null:
      return "null";
    default:
      return "a number";
  }
}

[[noreturn]] void wrong_type(const std::string& where, const json& v, const std::string& expected) {
  throw KinetoError(where + " is " + kind_of(v) + ": expected " + expected);
}

std::string event_at(size_t i) { return "traceEvents[" + std::to_string(i) + "]"; }

// obj.key as a string: nullptr when absent; a KinetoError naming it when not a string.
const std::string* string_field(const json& obj, const char* key, const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end()) return nullptr;
  if (!it->is_string()) wrong_type(where + "." + key, *it, "a string");
  return &it->get_ref<const std::string&>();
}

// A number in [lo, hi], or a KinetoError naming it, its value and the range (`unit`: "a time",
// "a duration").
double number_in(const json& v, const std::string& where, double lo, double hi,
                 const std::string& what) {
  if (!v.is_number()) wrong_type(where, v, "a number (microseconds)");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    throw KinetoError(where + " is " + number_text(x) + ": expected " + what + " of " +
                      number_text(lo) + " to " + number_text(hi) + " µs");
  }
  return x;
}

// An integer in [lo, hi] (an integral float too), or a KinetoError naming it.
int64_t integer_in(const json& v, const std::string& where, int64_t lo, int64_t hi) {
  const std::string range =
      "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!v.is_number()) wrong_type(where, v, range);
  int64_t n = 0;
  bool ok = false;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    ok = u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    n = ok ? static_cast<int64_t>(u) : 0;
  } else if (v.is_number_integer()) {
    n = v.get<int64_t>();
    ok = true;
  } else {
    // An integral float (7.0) within 2^53, where doubles hold integers exactly.
    const double x = v.get<double>();
    ok = x == std::floor(x) && std::fabs(x) <= 9007199254740992.0;
    n = ok ? static_cast<int64_t>(x) : 0;
  }
  if (!ok || n < lo || n > hi) {
    throw KinetoError(where + " is " +
                      (v.is_number_integer() ? v.dump() : number_text(v.get<double>())) +
                      ": expected " + range);
  }
  return n;
}

struct Span {
  Nanos begin = 0, end = 0;
  int64_t tid = 0;
  std::string name;
  const json* args = nullptr;
  size_t event = 0;  // its index in traceEvents (messages)
};

int64_t tid_of(const json& e) {
  const auto it = e.find("tid");
  if (it == e.end() || !it->is_number_integer()) return std::numeric_limits<int64_t>::min();
  return it->get<int64_t>();
}

// args.key of event `event` as an integer in [lo, hi]; `fallback` when absent.
int64_t int_arg(const json* args, size_t event, const char* key, int64_t fallback, int64_t lo,
                int64_t hi) {
  if (args == nullptr) return fallback;
  const auto it = args->find(key);
  if (it == args->end()) return fallback;
  return integer_in(*it, event_at(event) + ".args." + key, lo, hi);
}

// A launch's grid or block: the product of its dimensions (0 when absent).
int64_t dims_product(const json* args, size_t event, const char* key, int64_t max) {
  if (args == nullptr) return 0;
  const auto it = args->find(key);
  if (it == args->end()) return 0;
  const std::string where = event_at(event) + ".args." + key;
  if (!it->is_array()) wrong_type(where, *it, "an array of dimensions");
  double p = 1;
  for (size_t i = 0; i < it->size(); ++i) {
    p *= static_cast<double>(
        integer_in((*it)[i], where + "[" + std::to_string(i) + "]", 0, int64_t{1} << 31));
  }
  if (p > static_cast<double>(max)) {
    throw KinetoError(where + " has " + number_text(p) + " in all: expected at most " +
                      number_text(static_cast<double>(max)));
  }
  return static_cast<int64_t>(p);
}

// The innermost span (the latest-starting one, the last listed among equals) that holds each
// time, by a sweep over the times in order: -1 where none does.
std::vector<int> innermost_at(const std::vector<std::pair<Interval, int>>& spans,
                              const std::vector<Nanos>& times) {
  std::vector<size_t> by_begin(spans.size()), by_time(times.size());
  std::iota(by_begin.begin(), by_begin.end(), size_t{0});
  std::iota(by_time.begin(), by_time.end(), size_t{0});
  std::stable_sort(by_begin.begin(), by_begin.end(),
                   [&](size_t a, size_t b) { return spans[a].first.begin < spans[b].first.begin; });
  std::sort(by_time.begin(), by_time.end(),
            [&](size_t a, size_t b) { return times[a] < times[b]; });
  std::set<std::pair<Nanos, size_t>> open_by_begin, open_by_end;
  std::vector<int> out(times.size(), -1);
  size_t next = 0;
  for (size_t q : by_time) {
    const Nanos t = times[q];
    for (; next < by_begin.size() && spans[by_begin[next]].first.begin <= t; ++next) {
      const size_t i = by_begin[next];
      open_by_begin.insert({spans[i].first.begin, i});
      open_by_end.insert({spans[i].first.end, i});
    }
    while (!open_by_end.empty() && open_by_end.begin()->first < t) {
      const size_t i = open_by_end.begin()->second;
      open_by_begin.erase({spans[i].first.begin, i});
      open_by_end.erase(open_by_end.begin());
    }
    if (!open_by_begin.empty()) out[q] = spans[open_by_begin.rbegin()->second].second;
  }
  return out;
}

// The outermost op of each thread around a host interval: on one thread, the ops that no
// earlier-starting op contains (the top-level ones) start and end in increasing order, so the
// outermost op holding [b, e] is the first top-level one that starts at or before b and ends at
// or after e (a binary search).
class OutermostOps {
 public:
  explicit OutermostOps(const std::vector<const CpuOp*>& ops) {
    for (const CpuOp* op : ops) by_thread_[op->tid].push_back(op);
    for (auto& [tid, list] : by_thread_) {
      std::stable_sort(list.begin(), list.end(), [](const CpuOp* a, const CpuOp* b) {
        return a->begin != b->begin ? a->begin < b->begin : a->end > b->end;
      });
      std::vector<const CpuOp*> top;
      for (const CpuOp* op : list) {
        if (top.empty() || op->end > top.back()->end) top.push_back(op);
      }
      list = std::move(top);
    }
  }
  const CpuOp* around(int64_t tid, Nanos begin, Nanos end) const {
    const auto t = by_thread_.find(tid);
    if (t == by_thread_.end()) return nullptr;
    const auto& top = t->second;
    // Those starting at or before `begin`: a prefix; of them, those ending at or after `end`: a
    // suffix of it (ends increase).
    const auto last = std::upper_bound(top.begin(), top.end(), begin,
                                       [](Nanos b, const CpuOp* op) { return b < op->begin; });
    const auto first = std::lower_bound(top.begin(), last, end,
                                        [](const CpuOp* op, Nanos e) { return op->end < e; });
    return first == last ? nullptr : *first;
  }

 private:
  std::unordered_map<int64_t, std::vector<const CpuOp*>> by_thread_;
};

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

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  char hex[8];
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) {
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else if (c == 0xc2 && i + 1 < text.size() &&
               static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      // U+0080..U+009F in UTF-8: C1 controls (U+009B is CSI, as ESC [ is).
      std::snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned char>(text[++i]));
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

namespace {

std::string megabytes(int64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20); }

// Reads at most `limit` bytes of a regular file. stat first, then open without blocking (a FIFO
// swapped in between opens at once and is refused by fstat), as tar and rsync do.
std::string read_regular_file(const std::string& path, int64_t limit) {
  const std::string name = printable(path);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw KinetoError(name + ": cannot open: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    throw KinetoError(name + ": not a regular file (" + file_kind(st.st_mode) +
                      "): expected a trace file");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw KinetoError(name + ": cannot open: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    throw KinetoError(name + ": not a regular file: expected a trace file");
  }
  const auto too_big = [&](int64_t size) {
    return KinetoError(name + ": is " + megabytes(size) + " MB, above --max-input-mb " +
                       std::to_string(limit >> 20));
  };
  if (st.st_size > limit) throw too_big(st.st_size);
  std::string raw;
  raw.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  for (;;) {
    if (got == raw.size()) {
      // A file that grows while it is read: read on, up to the limit.
      if (static_cast<int64_t>(raw.size()) > limit) throw too_big(static_cast<int64_t>(raw.size()));
      raw.resize(raw.size() + (1 << 16));
    }
    const ssize_t n = ::read(fd, raw.data() + got, raw.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw KinetoError(name + ": cannot read: " + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  raw.resize(got);
  return raw;
}

}  // namespace

std::string read_trace_file(const std::string& path, const KinetoLimits& limits) {
  const std::string raw = read_regular_file(path, limits.max_input_bytes);
  const std::string name = printable(path);
  if (raw.size() < 2 || static_cast<unsigned char>(raw[0]) != 0x1f ||
      static_cast<unsigned char>(raw[1]) != 0x8b) {
    return raw;
  }
  // gzip (windowBits 15 + 32: gzip or zlib header detected). The text is capped as the file is:
  // a few MB of gzip can inflate to gigabytes.
  z_stream z{};
  if (inflateInit2(&z, 15 + 32) != Z_OK) throw KinetoError(name + ": zlib cannot start");
  struct Ender {
    z_stream* z;
    ~Ender() { inflateEnd(z); }
  } ender{&z};
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  z.avail_in = static_cast<uInt>(raw.size());
  std::string out;
  char buffer[1 << 16];
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    z.next_out = reinterpret_cast<Bytef*>(buffer);
    z.avail_out = sizeof buffer;
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      throw KinetoError(name + ": not a valid gzip file (" + (z.msg ? z.msg : "inflate failed") +
                        ")");
    }
    out.append(buffer, sizeof buffer - z.avail_out);
    if (static_cast<int64_t>(out.size()) > limits.max_input_bytes) {
      throw KinetoError(name + ": decompresses to more than " +
                        std::to_string(limits.max_input_bytes >> 20) + " MB (--max-input-mb)");
    }
    if (rc == Z_OK && z.avail_in == 0 && z.avail_out != 0) {
      throw KinetoError(name + ": truncated gzip file");
    }
  }
  return out;
}

namespace {

// nlohmann's DOM builder with the limits applied while the text is read: at most `max_events`
// entries of "traceEvents" and 64 levels of nesting (a deep array costs memory for nothing).
// Not the parser callback: its end_object searches the whole enclosing array, quadratic in the
// events.
class LimitedDom : public nlohmann::detail::json_sax_dom_parser<json> {
  using Base = nlohmann::detail::json_sax_dom_parser<json>;

 public:
  LimitedDom(json& out, const KinetoLimits& limits) : Base(out, true), limits_(limits) {}
  bool start_object(std::size_t n) {
    enter();
    return Base::start_object(n);
  }
  bool end_object() {
    --depth_;
    return Base::end_object();
  }
  bool start_array(std::size_t n) {
    enter();
    return Base::start_array(n);
  }
  bool end_array() {
    --depth_;
    return Base::end_array();
  }
  bool key(json::string_t& k) {
    if (depth_ == 1) in_events_ = k == "traceEvents";
    return Base::key(k);
  }
  bool null() { return entry(), Base::null(); }
  bool boolean(bool v) { return entry(), Base::boolean(v); }
  bool number_integer(json::number_integer_t v) { return entry(), Base::number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return entry(), Base::number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) {
    return entry(), Base::number_float(v, s);
  }
  bool string(json::string_t& v) { return entry(), Base::string(v); }

 private:
  static constexpr int kMaxDepth = 64;
  void enter() {
    entry();
    if (++depth_ > kMaxDepth) {
      throw KinetoError("nested deeper than " + std::to_string(kMaxDepth) +
                        " levels: expected a Kineto trace");
    }
  }
  // A value inside "traceEvents" (the document, then the array): one event.
  void entry() {
    if (in_events_ && depth_ == 2 && ++events_ > limits_.max_events) {
      throw KinetoError("more than " + std::to_string(limits_.max_events) +
                        " events (--max-events " + std::to_string(limits_.max_events) + ")");
    }
  }
  const KinetoLimits& limits_;
  int depth_ = 0;
  bool in_events_ = false;
  int64_t events_ = 0;
};

// JSON errors name the line and column, or say that the text ended early.
json parse_json(std::string_view text, const KinetoLimits& limits) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    throw KinetoError("empty file: expected a Kineto trace (a JSON object with \"traceEvents\")");
  }
  json doc;
  LimitedDom sax(doc, limits);
  try {
    json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const json::parse_error& e) {
    if (e.byte >= text.size()) {
      throw KinetoError("truncated JSON: the text ends inside a value (at byte " +
                        std::to_string(text.size()) + ")");
    }
    const std::string_view before = text.substr(0, e.byte > 0 ? e.byte - 1 : 0);
    const size_t line = 1 + static_cast<size_t>(std::count(before.begin(), before.end(), '\n'));
    const size_t newline = before.rfind('\n');
    const size_t column = before.size() - (newline == std::string_view::npos ? 0 : newline + 1) + 1;
    throw KinetoError("not JSON: syntax error at line " + std::to_string(line) + ", column " +
                      std::to_string(column));
  }
  return doc;
}

}  // namespace

namespace {

// Marks only Python's torch.profiler leaves (the first found is the evidence): its process's name,
// the record_function scopes of torch.optim and torch.utils.data, python_function events.
void note_python_process(const json& e, KinetoTrace& t) {
  if (e.value("name", std::string()) != "process_name") return;
  const auto args = e.find("args");
  if (args == e.end() || !args->is_object()) return;
  const auto name = args->find("name");
  if (name == args->end() || !name->is_string()) return;
  const std::string n = name->get<std::string>();
  if (starts_with(n, "python") || starts_with(n, "Python")) {
    t.frontend = "python";
    t.frontend_evidence = "process " + printable(n);
  }
}

void note_python_mark(const std::string& cat, const std::string& name, KinetoTrace& t) {
  for (const char* mark : {"Optimizer.step#", "Optimizer.zero_grad#", "enumerate(DataLoader)#"}) {
    if (starts_with(name, mark)) {
      t.frontend = "python";
      t.frontend_evidence = name;
      return;
    }
  }
  if (cat == "python_function") {
    t.frontend = "python";
    t.frontend_evidence = "python_function events";
  }
}

}  // namespace

KinetoTrace parse_kineto_trace(std::string_view text, const KinetoLimits& limits) {
  const json doc = parse_json(text, limits);
  const std::string expected = "a JSON object with a \"traceEvents\" array";
  if (!doc.is_object()) {
    throw KinetoError("not a Kineto trace: expected " + expected + ", got " + kind_of(doc));
  }
  const auto events_it = doc.find("traceEvents");
  if (events_it == doc.end()) {
    throw KinetoError("not a Kineto trace: no \"traceEvents\" key: expected " + expected);
  }
  if (!events_it->is_array()) {
    throw KinetoError(std::string("not a Kineto trace: \"traceEvents\" is ") + kind_of(*events_it) +
                      ": expected an array of events");
  }
  KinetoTrace t;
  if (const auto props = doc.find("deviceProperties"); props != doc.end()) {
    if (!props->is_array()) wrong_type("deviceProperties", *props, "an array of devices");
    if (!props->empty()) {
      const json& d = (*props)[0];
      if (!d.is_object()) wrong_type("deviceProperties[0]", d, "an object");
      if (const std::string* name = string_field(d, "name", "deviceProperties[0]")) {
        t.device = printable(*name);
      }
      if (const auto sms = d.find("numSms"); sms != d.end()) {
        t.sm_count = static_cast<int>(integer_in(*sms, "deviceProperties[0].numSms", 0, 100000));
      }
    }
  }
  if (const auto shapes = doc.find("record_shapes"); shapes != doc.end()) {
    if (shapes->is_boolean()) {
      t.shapes = shapes->get<bool>();
    } else {
      t.shapes = integer_in(*shapes, "record_shapes", 0, 1) != 0;
    }
  }
  if (const auto dist = doc.find("distributedInfo"); dist != doc.end()) {
    if (!dist->is_object()) wrong_type("distributedInfo", *dist, "an object");
    if (const std::string* b = string_field(*dist, "backend", "distributedInfo")) {
      t.comm_backend = printable(*b);
    }
    constexpr int64_t kMaxRanks = int64_t{1} << 24;
    if (const auto w = dist->find("world_size"); w != dist->end()) {
      t.world_size = static_cast<int>(integer_in(*w, "distributedInfo.world_size", 1, kMaxRanks));
    }
    if (const auto r = dist->find("rank"); r != dist->end()) {
      t.rank = static_cast<int>(integer_in(*r, "distributedInfo.rank", 0, t.world_size - 1));
    }
  }

  const json& events = *events_it;
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
  std::set<int64_t> d2h_corr;  // device-to-host copies (their runtime call is a copy to the host)
  constexpr int64_t kMaxId = std::numeric_limits<int64_t>::max();
  for (size_t index = 0; index < events.size(); ++index) {
    const json& e = events[index];
    const std::string where = event_at(index);
    if (!e.is_object()) wrong_type(where, e, "an event (a JSON object)");
    const std::string* ph = string_field(e, "ph", where);
    if (ph != nullptr && *ph == "M" && t.frontend_evidence.empty()) note_python_process(e, t);
    if (ph == nullptr || *ph != "X") continue;
    const std::string* cat_p = string_field(e, "cat", where);
    const std::string* name_p = string_field(e, "name", where);
    const auto ts_it = e.find("ts");
    if (cat_p == nullptr || name_p == nullptr || ts_it == e.end()) continue;
    const std::string& cat = *cat_p;
    const std::string name = printable(*name_p);
    const double ts = number_in(*ts_it, where + ".ts", 0, kMaxTimeUs, "a time");
    const auto dur_it = e.find("dur");
    const double dur = dur_it == e.end()
                           ? 0.0
                           : number_in(*dur_it, where + ".dur", 0, kMaxDurationUs, "a duration");
    Span s;
    s.begin = us_to_ns(ts);
    s.end = us_to_ns(ts + dur);
    s.tid = tid_of(e);
    s.name = name;
    s.event = index;
    if (const auto args_it = e.find("args"); args_it != e.end()) {
      if (!args_it->is_object()) wrong_type(where + ".args", *args_it, "an object");
      s.args = &*args_it;
    }
    if (t.frontend_evidence.empty()) note_python_mark(cat, name, t);
    if (cat == "user_annotation") {
      if (starts_with(name, "ProfilerStep#")) {
        step_spans.push_back(s);
      } else if (starts_with(name, "enumerate(DataLoader)")) {
        loader_waits.push_back(s);
      } else if (!starts_with(name, "nccl:") && !starts_with(name, "gloo:")) {
        annotations.push_back(s);
      }
    } else if (cat == "cpu_op") {
      ops.push_back({s.begin, s.end, s.tid, name, s.args, op_kind(name), index});
      if (name == "record_param_comms" && s.args != nullptr) {
        CollectiveRecord c;
        const std::string* coll = string_field(*s.args, "Collective name", where + ".args");
        c.name = coll != nullptr ? printable(*coll) : std::string();
        c.op = comm_op_from_name(c.name);
        const std::string* dtype = string_field(*s.args, "dtype", where + ".args");
        c.dtype = dtype != nullptr ? printable(*dtype) : std::string();
        static const std::map<std::string, int64_t> kBytes = {
            {"Float", 4}, {"Double", 8}, {"Half", 2}, {"BFloat16", 2}, {"Int", 4},
            {"Long", 8},  {"Byte", 1},   {"Char", 1}, {"Bool", 1}};
        const auto b = kBytes.find(c.dtype);
        c.bytes = int_arg(s.args, index, "In msg nelems", 0, 0, static_cast<int64_t>(kMaxCount)) *
                  (b != kBytes.end() ? b->second : 4);
        c.group_size = static_cast<int>(int_arg(s.args, index, "Group size", 0, 0, 1 << 24));
        c.begin_ns = s.begin;
        c.end_ns = s.end;
        c.seq = static_cast<int64_t>(t.collectives.size()) + 1;
        t.collectives.push_back(c);
      }
    } else if (cat == "cuda_runtime" || cat == "cuda_driver") {
      const int64_t corr = int_arg(s.args, index, "correlation", -1, -1, kMaxId);
      if (corr >= 0) launches[corr] = {s.begin, s.tid};
      runtime.push_back(s);
    } else if (cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset") {
      const auto stream = static_cast<uint32_t>(
          int_arg(s.args, index, "stream", 0, 0, std::numeric_limits<uint32_t>::max()));
      const int64_t corr = int_arg(s.args, index, "correlation", -1, -1, kMaxId);
      activities.push_back({s.begin, s.end, stream, corr});
      if (cat == "kernel") {
        KernelRecord k;
        k.begin = s.begin;
        k.end = s.end;
        k.blocks = dims_product(s.args, index, "grid", int64_t{1} << 62);
        k.block_threads =
            static_cast<int32_t>(dims_product(s.args, index, "block", (int64_t{1} << 31) - 1));
        k.stream = stream;
        k.name = name;
        k.communication = is_communication_kernel(name);
        kernel_correlation.emplace_back(corr, t.events.kernels.size());
        t.events.kernels.push_back(std::move(k));
      } else {
        CopyRecord c;
        c.begin = s.begin;
        c.end = s.end;
        c.bytes = int_arg(s.args, index, "bytes", 0, 0, static_cast<int64_t>(kMaxCount));
        c.memset = cat == "gpu_memset";
        c.kind = c.memset ? CopyKind::kOther : copy_kind(name);
        c.pageable = contains(name, "Pageable");
        t.events.copies.push_back(c);
        if (!c.memset && c.kind == CopyKind::kDeviceToHost) d2h_corr.insert(corr);
      }
    }
  }
  if (step_spans.empty()) {
    throw KinetoError(
        "no profiler steps (ProfilerStep#N spans): profile with a schedule and call prof.step() "
        "once per training step");
  }
  std::stable_sort(step_spans.begin(), step_spans.end(),
                   [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < step_spans.size(); ++i) {
    const Span& a = step_spans[i - 1];
    const Span& b = step_spans[i];
    if (b.begin < a.end) {
      throw KinetoError(b.name + " (" + event_at(b.event) + ") starts before " + a.name + " (" +
                        event_at(a.event) + ") ends: expected one profiler step after another");
    }
  }
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
  // the first step's span starts after it. The stream's work by launch time, with the latest
  // end of all launched up to each: one binary search per boundary.
  std::vector<std::pair<Nanos, Nanos>> launched;  // (launch time, latest end so far)
  for (const GpuActivity& a : activities) {
    if (a.stream != t.marker_stream) continue;
    const auto l = launches.find(a.correlation);
    launched.push_back(
        {l == launches.end() ? std::numeric_limits<Nanos>::min() : l->second.begin, a.end});
  }
  std::sort(launched.begin(), launched.end());
  for (size_t i = 1; i < launched.size(); ++i) {
    launched[i].second = std::max(launched[i].second, launched[i - 1].second);
  }
  auto reached = [&](Nanos at) {
    const auto before =
        std::lower_bound(launched.begin(), launched.end(), at,
                         [](const std::pair<Nanos, Nanos>& l, Nanos t) { return l.first < t; });
    return before == launched.begin() ? at : std::max(at, std::prev(before)->second);
  };

  // Per step: its loader waits (starting in it), phases (overlapping it), collectives (starting
  // in it), each found by a binary search or a sweep (steps are in order, never overlapping).
  std::vector<Span> waits;
  for (const Span& w : loader_waits) {
    if (w.tid == trainer) waits.push_back(w);
  }
  std::stable_sort(waits.begin(), waits.end(),
                   [](const Span& a, const Span& b) { return a.begin < b.begin; });
  std::vector<Nanos> collective_begins;
  for (const CollectiveRecord& c : t.collectives) collective_begins.push_back(c.begin_ns);
  std::sort(collective_begins.begin(), collective_begins.end());
  kineto_detail::Overlaps phases_in(
      phase_spans.size(), [&](size_t i) { return phase_spans[i].first.begin; },
      [&](size_t i) { return phase_spans[i].first.end; });
  std::vector<size_t> found;
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
    const auto first_wait = std::lower_bound(waits.begin(), waits.end(), s.begin,
                                             [](const Span& w, Nanos b) { return w.begin < b; });
    for (auto w = first_wait; w != waits.end() && w->begin < s.end; ++w) {
      const Nanos len = std::min(w->end, s.end) - w->begin;
      k.data_wait_ns += len;
      if (len > longest) {
        longest = len;
        k.spans.data_wait = {w->begin, std::min(w->end, s.end)};
      }
    }
    phases_in.find(s.begin, s.end, found);
    for (size_t p : found) {
      const auto& [span, id] = phase_spans[p];
      const Nanos o = std::min(span.end, s.end) - std::max(span.begin, s.begin);
      if (o > 0) k.phase_ns[static_cast<size_t>(id)] += o;
    }
    k.collectives = std::lower_bound(collective_begins.begin(), collective_begins.end(), s.end) -
                    std::lower_bound(collective_begins.begin(), collective_begins.end(), s.begin);
    t.steps.push_back(k);
  }

  // Host syncs: the synchronizing calls (their extent is the host's wait), with the thread that
  // made them; op scopes: the outermost ATen op around each sync and each copy to the host (the
  // live library's stack walk finds the same op).
  std::vector<const CpuOp*> aten_ops;
  for (const CpuOp& op : ops) {
    if (starts_with(op.name, "aten::")) aten_ops.push_back(&op);
  }
  const OutermostOps outermost(aten_ops);
  struct HostCall {
    const Span* call;
    SyncApi api;
    const CpuOp* op;
  };
  std::vector<HostCall> calls;
  std::vector<Nanos> phase_queries;  // each call's begin, then its op's
  for (const Span& r : runtime) {
    const SyncApi api = sync_api(r.name);
    const int64_t corr = int_arg(r.args, r.event, "correlation", -1, -1, kMaxId);
    const bool copy_to_host = (r.name == "cudaMemcpy" || r.name == "cudaMemcpyAsync" ||
                               r.name == "cuMemcpyDtoH" || r.name == "cuMemcpyDtoHAsync") &&
                              d2h_corr.count(corr) > 0;
    if (api == SyncApi::kUnknown && !copy_to_host) continue;
    const CpuOp* op = outermost.around(r.tid, r.begin, r.end);
    calls.push_back({&r, api, op});
    phase_queries.push_back(r.begin);
    phase_queries.push_back(op != nullptr ? op->begin : r.begin);
  }
  const std::vector<int> phase_of = innermost_at(phase_spans, phase_queries);
  std::unordered_map<const CpuOp*, uint64_t> call_ids;
  for (size_t c = 0; c < calls.size(); ++c) {
    const Span& r = *calls[c].call;
    const int phase = phase_of[2 * c];
    if (calls[c].api != SyncApi::kUnknown) {
      SyncRecord s;
      s.begin = r.begin;
      s.end = r.end;
      s.api = calls[c].api;
      s.cause = to_string(calls[c].api);
      // After the last profiled step: the profiler's own synchronize at its stop, never a host
      // sync of the training loop (as the live library's own threads' syncs).
      s.thread = r.begin >= t.steps.back().spans.host.end ? SyncThread::kInternal
                 : r.tid == trainer                       ? SyncThread::kTrainer
                                                          : SyncThread::kOther;
      s.correlation_id = int_arg(r.args, r.event, "correlation", -1, -1, kMaxId);
      if (phase >= 0) s.phase = t.phases[static_cast<size_t>(phase)];
      t.events.syncs.push_back(s);
    }
    if (const CpuOp* op = calls[c].op) {
      // The scope spans the op's call (the stack walk's op frame); one call id per op call.
      HostOpScope scope;
      scope.op = op->name;
      scope.always = false;
      scope.call = call_ids.emplace(op, call_ids.size() + 1).first->second;
      scope.begin = op->begin;
      scope.end = op->end;
      const int op_phase = phase_of[2 * c + 1];
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
      KinetoStep& k = t.steps[i];
      k.flops = tallies[i].per_step(1);
      k.flops_known = true;
      // Shapes no GPU runs in the time: refused, never an MFU of 10^30.
      const double seconds =
          static_cast<double>(k.spans.figures().end - k.spans.figures().begin) / 1e9;
      const double rate = seconds > 0 ? k.flops.hardware_flops / seconds : 0;
      if (rate > kMaxFlopRate) {
        throw KinetoError(step_spans[i].name + " (" + event_at(step_spans[i].event) + ") counts " +
                          number_text(k.flops.hardware_flops) + " FLOPs in " +
                          number_text(seconds) + " s (" + number_text(rate) + " FLOP/s): above " +
                          number_text(kMaxFlopRate) +
                          " FLOP/s, more than any GPU runs: the recorded shapes are wrong");
      }
    }
  }
  // By start, as the GPU monitor holds them: the kernel index's binary searches need it.
  std::stable_sort(t.events.kernels.begin(), t.events.kernels.end(),
                   [](const KernelRecord& a, const KernelRecord& b) { return a.begin < b.begin; });

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
