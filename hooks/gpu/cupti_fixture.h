// The CUPTI fixture format: what hooks/gpu/cupti_capture.cpp records on a GPU machine and
// tests/unit/cupti_replay_test.cpp replays anywhere (tests/fixtures/cupti/README.md). Captured at
// the inputs of the pure converters, so replaying needs no GPU:
//   activity.jsonl   one activity record per line, as cuptiActivityGetNextRecord handed it to the
//                    collector (the input of convert_record): {"kind": 10, "hex": "<the record's
//                    bytes>", "name": "<kernel name>"}; the name only for kernels (the record
//                    holds a pointer to it).
//   pm_samples.jsonl one PM sample per line as the decoder sees it before to_pm_sample: CUPTI's
//                    start/end timestamps and the evaluated values by metric name (null: NaN);
//                    "first": true on the first sample after start (the sampler discards it).
//   capture.json     CaptureInfo: device, CUPTI version, record sizes, the TimeBase offset, the
//                    workload's steps on the steady clock and what each step copied.
// Header-only (nlohmann_json, the CUPTI headers); for the capture tool and the tests.
#pragma once

#include <cupti_activity.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace torchpilot {
namespace detail {
namespace cupti_fixture {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kCaptureFile = "capture.json";
inline constexpr const char* kActivityFile = "activity.jsonl";
inline constexpr const char* kPmFile = "pm_samples.jsonl";

// The record layout convert_record reads for each captured kind; 0 for other kinds.
inline size_t activity_record_size(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      return sizeof(CUpti_ActivityKernel10);
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      return sizeof(CUpti_ActivityMemcpy6);
    case CUPTI_ACTIVITY_KIND_MEMSET:
      return sizeof(CUpti_ActivityMemset4);
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
      return sizeof(CUpti_ActivitySynchronization2);
    case CUPTI_ACTIVITY_KIND_OVERHEAD:  // the collector's debug account, not a converted kind
      return sizeof(CUpti_ActivityOverhead3);
    default:
      return 0;
  }
}

inline std::map<std::string, size_t> record_struct_sizes() {
  return {{"CUpti_ActivityKernel10", sizeof(CUpti_ActivityKernel10)},
          {"CUpti_ActivityMemcpy6", sizeof(CUpti_ActivityMemcpy6)},
          {"CUpti_ActivityMemset4", sizeof(CUpti_ActivityMemset4)},
          {"CUpti_ActivitySynchronization2", sizeof(CUpti_ActivitySynchronization2)}};
}

inline std::string to_hex(const uint8_t* bytes, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kDigits[bytes[i] >> 4];
    s[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return s;
}

inline bool from_hex(const std::string& s, std::vector<uint8_t>* out) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (s.size() % 2 != 0) return false;
  out->resize(s.size() / 2);
  for (size_t i = 0; i < out->size(); ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

// One activity.jsonl line for `record`; empty for kinds that are not captured.
inline std::string activity_line(const CUpti_Activity& record) {
  const size_t size = activity_record_size(record.kind);
  if (size == 0) return {};
  nlohmann::json j;
  j["kind"] = static_cast<int>(record.kind);
  j["hex"] = to_hex(reinterpret_cast<const uint8_t*>(&record), size);
  if (record.kind == CUPTI_ACTIVITY_KIND_KERNEL ||
      record.kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
    const char* name =
        static_cast<const CUpti_ActivityKernel10*>(static_cast<const void*>(&record))->name;
    j["name"] = name != nullptr ? name : "";
  }
  return j.dump();
}

// A record read back. Its pointers are made safe each time record() is asked for: a kernel's name
// points at the stored name; the other pointers (addresses in the capturing process, never read
// by the converters) are cleared.
class ReplayRecord {
 public:
  ReplayRecord(CUpti_ActivityKind kind, const std::vector<uint8_t>& bytes, std::string name)
      : kind_(kind), storage_((bytes.size() + 7) / 8), name_(std::move(name)) {
    std::memcpy(storage_.data(), bytes.data(), bytes.size());
  }
  CUpti_ActivityKind kind() const { return kind_; }
  const std::string& name() const { return name_; }
  const CUpti_Activity& record() const {
    void* p = storage_.data();
    switch (kind_) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = static_cast<CUpti_ActivityKernel10*>(p);
        k->name = name_.c_str();
        k->reserved0 = nullptr;
        k->pAccessPolicyWindow = nullptr;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY:
        static_cast<CUpti_ActivityMemcpy6*>(p)->reserved0 = nullptr;
        break;
      case CUPTI_ACTIVITY_KIND_MEMSET:
        static_cast<CUpti_ActivityMemset4*>(p)->reserved0 = nullptr;
        break;
      default:
        break;
    }
    return *static_cast<const CUpti_Activity*>(p);
  }
  // The record as its own type (T must be the layout of kind()).
  template <class T>
  const T& as() const {
    return *static_cast<const T*>(static_cast<const void*>(&record()));
  }

 private:
  CUpti_ActivityKind kind_;
  mutable std::vector<uint64_t> storage_;  // 8-byte aligned, as CUPTI's buffers
  std::string name_;
};

// Parses one activity.jsonl line. False (with `error`) on malformed lines, kinds that are not
// captured, and records whose size differs from this build's layout (other CUPTI headers).
inline bool parse_activity_line(const std::string& line, std::vector<ReplayRecord>* out,
                                std::string* error) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("kind") || !j.contains("hex")) {
    *error = "not an activity record: " + line.substr(0, 80);
    return false;
  }
  const auto kind = static_cast<CUpti_ActivityKind>(j["kind"].get<int>());
  const size_t size = activity_record_size(kind);
  std::vector<uint8_t> bytes;
  if (size == 0) {
    *error = "activity kind " + std::to_string(static_cast<int>(kind)) + " is not captured";
    return false;
  }
  if (!from_hex(j["hex"].get<std::string>(), &bytes) || bytes.size() != size) {
    *error = "activity kind " + std::to_string(static_cast<int>(kind)) + ": " +
             std::to_string(bytes.size()) + " bytes where this build's record has " +
             std::to_string(size) + " (captured with other CUPTI headers?)";
    return false;
  }
  out->emplace_back(kind, bytes, j.value("name", std::string()));
  return true;
}

// One PM sample before conversion. values: metric name -> evaluated value (NaN: not measured).
struct PmLine {
  uint64_t start = 0, end = 0;
  bool first = false;  // the first sample after start (discarded by the sampler)
  std::vector<std::pair<std::string, double>> values;
};

inline std::string pm_line(const PmLine& s) {
  nlohmann::json j;
  j["start"] = s.start;
  j["end"] = s.end;
  if (s.first) j["first"] = true;
  nlohmann::json values = nlohmann::json::object();
  for (const auto& [name, v] : s.values) {
    values[name] = std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v);
  }
  j["values"] = values;
  return j.dump();
}

inline bool parse_pm_line(const std::string& line, PmLine* out, std::string* error) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("start") || !j.contains("end") ||
      !j.contains("values") || !j["values"].is_object()) {
    *error = "not a PM sample: " + line.substr(0, 80);
    return false;
  }
  out->start = j["start"].get<uint64_t>();
  out->end = j["end"].get<uint64_t>();
  out->first = j.value("first", false);
  out->values.clear();
  for (const auto& el : j["values"].items()) {
    const auto& v = el.value();
    out->values.emplace_back(el.key(), v.is_number() ? v.get<double>() : std::nan(""));
  }
  return true;
}

// A step of the captured workload, on the steady clock (std::chrono::steady_clock ns).
struct StepSpan {
  int64_t step = 0;
  int64_t begin = 0, end = 0;
  bool traced = false;  // inside the activity-trace window
};

struct CaptureInfo {
  int format = kFormatVersion;
  std::string device, chip;
  int sm_count = 0;
  uint32_t cupti_version = 0;
  std::map<std::string, size_t> struct_sizes = record_struct_sizes();
  // TimeBase::offset_ns (CUPTI clock minus steady clock) measured before the workload, and again
  // after it (the drift between the two clocks over the capture).
  int64_t time_base_offset_ns = 0;
  int64_t time_base_offset_after_ns = 0;
  double pm_interval_ms = 0;
  std::vector<std::string> pm_metrics;  // the metric set in use
  // What every step did besides kernels.
  int64_t h2d_pageable_bytes = 0;  // one host-to-device copy from pageable memory
  int64_t d2h_item_bytes = 0;      // one .item(): a device-to-host copy and a sync
  std::vector<StepSpan> steps;
  int64_t trace_from = 0;  // the trace started here (steady clock)
  // Counts: written, left out by the caps, other kinds seen, and CUPTI's dropped records.
  int64_t activity_records = 0, activity_capped = 0, activity_other_kinds = 0;
  int64_t activity_dropped = 0;
  int64_t pm_samples = 0, pm_capped = 0;
  std::string notes;
};

inline nlohmann::json to_json(const CaptureInfo& c) {
  nlohmann::json steps = nlohmann::json::array();
  for (const StepSpan& s : c.steps) {
    steps.push_back({{"step", s.step}, {"begin", s.begin}, {"end", s.end}, {"traced", s.traced}});
  }
  return {{"format", c.format},
          {"device", c.device},
          {"chip", c.chip},
          {"sm_count", c.sm_count},
          {"cupti_version", c.cupti_version},
          {"struct_sizes", c.struct_sizes},
          {"time_base_offset_ns", c.time_base_offset_ns},
          {"time_base_offset_after_ns", c.time_base_offset_after_ns},
          {"pm_interval_ms", c.pm_interval_ms},
          {"pm_metrics", c.pm_metrics},
          {"h2d_pageable_bytes", c.h2d_pageable_bytes},
          {"d2h_item_bytes", c.d2h_item_bytes},
          {"steps", steps},
          {"trace_from", c.trace_from},
          {"activity_records", c.activity_records},
          {"activity_capped", c.activity_capped},
          {"activity_other_kinds", c.activity_other_kinds},
          {"activity_dropped", c.activity_dropped},
          {"pm_samples", c.pm_samples},
          {"pm_capped", c.pm_capped},
          {"notes", c.notes}};
}

inline bool from_json(const nlohmann::json& j, CaptureInfo* c, std::string* error) {
  try {
    c->format = j.at("format").get<int>();
    if (c->format != kFormatVersion) {
      *error = "fixture format " + std::to_string(c->format) + ", this build reads " +
               std::to_string(kFormatVersion);
      return false;
    }
    c->device = j.at("device").get<std::string>();
    c->chip = j.at("chip").get<std::string>();
    c->sm_count = j.at("sm_count").get<int>();
    c->cupti_version = j.at("cupti_version").get<uint32_t>();
    c->struct_sizes = j.at("struct_sizes").get<std::map<std::string, size_t>>();
    c->time_base_offset_ns = j.at("time_base_offset_ns").get<int64_t>();
    c->time_base_offset_after_ns = j.at("time_base_offset_after_ns").get<int64_t>();
    c->pm_interval_ms = j.at("pm_interval_ms").get<double>();
    c->pm_metrics = j.at("pm_metrics").get<std::vector<std::string>>();
    c->h2d_pageable_bytes = j.at("h2d_pageable_bytes").get<int64_t>();
    c->d2h_item_bytes = j.at("d2h_item_bytes").get<int64_t>();
    c->steps.clear();
    for (const auto& s : j.at("steps")) {
      c->steps.push_back({s.at("step").get<int64_t>(), s.at("begin").get<int64_t>(),
                          s.at("end").get<int64_t>(), s.at("traced").get<bool>()});
    }
    c->trace_from = j.at("trace_from").get<int64_t>();
    c->activity_records = j.at("activity_records").get<int64_t>();
    c->activity_capped = j.at("activity_capped").get<int64_t>();
    c->activity_other_kinds = j.at("activity_other_kinds").get<int64_t>();
    c->activity_dropped = j.at("activity_dropped").get<int64_t>();
    c->pm_samples = j.at("pm_samples").get<int64_t>();
    c->pm_capped = j.at("pm_capped").get<int64_t>();
    c->notes = j.value("notes", std::string());
  } catch (const nlohmann::json::exception& e) {
    *error = std::string(kCaptureFile) + ": " + e.what();
    return false;
  }
  return true;
}

// A fixture read back.
struct Fixture {
  CaptureInfo info;
  std::vector<ReplayRecord> records;
  std::vector<PmLine> pm;
};

inline std::string join(const std::string& dir, const char* file) { return dir + "/" + file; }

// Whether `dir` holds a fixture (all three files).
inline bool fixture_present(const std::string& dir) {
  for (const char* f : {kCaptureFile, kActivityFile, kPmFile}) {
    if (!std::ifstream(join(dir, f)).good()) return false;
  }
  return true;
}

inline bool write_fixture(const std::string& dir, const CaptureInfo& info,
                          const std::vector<std::string>& activity_lines,
                          const std::vector<std::string>& pm_lines, std::string* error) {
  std::ofstream capture(join(dir, kCaptureFile)), activity(join(dir, kActivityFile)),
      pm(join(dir, kPmFile));
  if (!capture || !activity || !pm) {
    *error = "cannot write the fixture files in " + dir;
    return false;
  }
  capture << to_json(info).dump(2) << "\n";
  for (const auto& l : activity_lines) activity << l << "\n";
  for (const auto& l : pm_lines) pm << l << "\n";
  if (!capture.flush() || !activity.flush() || !pm.flush()) {
    *error = "writing the fixture files in " + dir + " failed";
    return false;
  }
  return true;
}

// Reads and checks a fixture: every line must parse and every record must have this build's
// layout (struct_sizes as here).
inline bool read_fixture(const std::string& dir, Fixture* out, std::string* error) {
  std::ifstream capture(join(dir, kCaptureFile));
  const nlohmann::json j = nlohmann::json::parse(capture, nullptr, false);
  if (j.is_discarded()) {
    *error = join(dir, kCaptureFile) + " is not JSON";
    return false;
  }
  if (!from_json(j, &out->info, error)) return false;
  if (out->info.struct_sizes != record_struct_sizes()) {
    *error = "the fixture's record sizes differ from this build's CUPTI headers (" +
             nlohmann::json(out->info.struct_sizes).dump() + " vs " +
             nlohmann::json(record_struct_sizes()).dump() + ")";
    return false;
  }
  std::ifstream activity(join(dir, kActivityFile));
  std::string line;
  size_t n = 0;
  while (std::getline(activity, line)) {
    ++n;
    if (line.empty()) continue;
    if (!parse_activity_line(line, &out->records, error)) {
      *error = std::string(kActivityFile) + ":" + std::to_string(n) + ": " + *error;
      return false;
    }
  }
  std::ifstream pm(join(dir, kPmFile));
  n = 0;
  while (std::getline(pm, line)) {
    ++n;
    if (line.empty()) continue;
    PmLine s;
    if (!parse_pm_line(line, &s, error)) {
      *error = std::string(kPmFile) + ":" + std::to_string(n) + ": " + *error;
      return false;
    }
    out->pm.push_back(std::move(s));
  }
  return true;
}

}  // namespace cupti_fixture
}  // namespace detail
}  // namespace torchpilot
