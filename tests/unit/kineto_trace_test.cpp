// The Kineto trace analyzer (runtime/analyze/kineto_trace.cpp, docs/analyze.md): hand-made traces
// with hand-computed figures, then the real fixtures (tests/fixtures/kineto) against the advice
// their planted trainers must produce.
#include "torchpilot/runtime/analyze/kineto_trace.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/analyze/frontend_actions.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/reports/sinks.h"

namespace torchpilot {
namespace {

using json = nlohmann::json;
constexpr Nanos kUs = 1000;

// A trace of hand-made events (times in µs, as Kineto writes them).
class TraceBuilder {
 public:
  TraceBuilder() {
    doc_ = {{"schemaVersion", 1},
            {"record_shapes", 1},
            {"deviceProperties",
             json::array({{{"id", 0}, {"name", "NVIDIA H100 80GB HBM3"}, {"numSms", 132}}})},
            {"traceEvents", json::array()}};
  }
  TraceBuilder& span(const std::string& cat, const std::string& name, double ts, double dur,
                     json args = json::object(), int64_t tid = 1) {
    doc_["traceEvents"].push_back({{"ph", "X"},
                                   {"cat", cat},
                                   {"name", name},
                                   {"pid", 1},
                                   {"tid", tid},
                                   {"ts", ts},
                                   {"dur", dur},
                                   {"args", args}});
    return *this;
  }
  TraceBuilder& step(int n, double ts, double dur) {
    return span("user_annotation", "ProfilerStep#" + std::to_string(n), ts, dur);
  }
  // A kernel launched from the host at `launch` (cudaLaunchKernel, 5 µs), run on stream 7.
  TraceBuilder& kernel(const std::string& name, double launch, double ts, double dur,
                       int64_t blocks = 132) {
    const int64_t corr = next_corr_++;
    span("cuda_runtime", "cudaLaunchKernel", launch, 5, {{"correlation", corr}});
    return span(
        "kernel", name, ts, dur,
        {{"correlation", corr}, {"stream", 7}, {"grid", {blocks, 1, 1}}, {"block", {128, 1, 1}}},
        /*tid=*/7);
  }
  std::string text() const { return doc_.dump(); }
  json& doc() { return doc_; }

 private:
  json doc_;
  int64_t next_corr_ = 1;
};

TEST(KinetoTrace, StepSpansDataWaitAndIdlePartition) {
  TraceBuilder b;
  b.step(3, 1000, 1000).step(4, 2000, 1000);
  b.span("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 1000,
         300);
  b.kernel("void at::native::vectorized_elementwise_kernel<4>", 1400, 1500, 300);
  b.kernel("void at::native::vectorized_elementwise_kernel<4>", 2100, 2200, 300);
  const KinetoTrace t = parse_kineto_trace(b.text());
  ASSERT_EQ(t.steps.size(), 2u);
  EXPECT_EQ(t.device, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(t.sm_count, 132);
  EXPECT_EQ(t.steps[0].number, 3);
  EXPECT_EQ(t.steps[0].spans.host.begin, 1000 * kUs);
  EXPECT_EQ(t.steps[0].spans.host.end, 2000 * kUs);
  // The GPU had run everything launched in the step by its end: the span is the host's.
  EXPECT_EQ(t.steps[0].spans.gpu.end, 2000 * kUs);
  EXPECT_EQ(t.steps[0].data_wait_ns, 300 * kUs);
  EXPECT_EQ(t.steps[1].data_wait_ns, 0);

  const EpochSummary s = kineto_epoch_summary(t);
  EXPECT_EQ(s.steps, 2);
  EXPECT_EQ(s.wall_ns, 2000 * kUs);
  EXPECT_EQ(s.data_wait_ns, 300 * kUs);
  EXPECT_DOUBLE_EQ(s.data_wait_fraction, 0.15);
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->traced_steps, 2);
  EXPECT_EQ(gpu->stats.kernels, 2);
  EXPECT_EQ(gpu->stats.traced_ns, 2000 * kUs);
  EXPECT_DOUBLE_EQ(gpu->stats.gpu_utilization, 0.3);
  // Idle 1.4 ms: step 3's wait for its batch (0.3 ms), the rest before/after the kernels.
  EXPECT_EQ(gpu->stats.idle_data_wait_ns, 300 * kUs);
  EXPECT_EQ(gpu->stats.idle_host_sync_ns, 0);
  EXPECT_EQ(gpu->stats.idle_launch_gap_ns, 0);
  EXPECT_EQ(gpu->stats.idle_other_ns, 1100 * kUs);
  EXPECT_FALSE(measured(gpu->stats.sm_efficiency));  // no PM sampling in a trace
}

TEST(KinetoTrace, OverlappingKernelsAndLaunchGaps) {
  TraceBuilder b;
  b.step(1, 0, 1000);
  b.kernel("ampere_sgemm_128x64_nn", 10, 100, 200);          // [100, 300]
  b.kernel("void at::native::reduce_kernel", 20, 200, 200);  // [200, 400]: overlaps
  b.kernel("void at::native::reduce_kernel", 30, 600, 100);  // [600, 700]: a 200 µs gap
  const EpochSummary s = kineto_epoch_summary(parse_kineto_trace(b.text()));
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  ASSERT_NE(gpu, nullptr);
  EXPECT_DOUBLE_EQ(gpu->stats.gpu_utilization, 0.4);  // union 400 µs of 1 ms
  EXPECT_EQ(gpu->stats.idle_launch_gap_ns, 200 * kUs);
  EXPECT_EQ(gpu->stats.idle_other_ns, 400 * kUs);  // [0, 100] and [700, 1000]
  const KernelClassStats& k = gpu->kernel_classes;
  // [200, 300] is shared by two kernels: half to each class.
  EXPECT_DOUBLE_EQ(k.ns[static_cast<size_t>(KernelClass::kSimtGemm)], 150.0 * kUs);
  EXPECT_DOUBLE_EQ(k.ns[static_cast<size_t>(KernelClass::kElementwise)], 250.0 * kUs);
  EXPECT_DOUBLE_EQ(k.idle_ns, 600.0 * kUs);
}

// Two NCCL ranks: a compute kernel [100, 500] µs on the trainer's stream, the all-reduce's NCCL
// kernel [400, 800] on its own stream: 400 µs of communication, 300 of them exposed.
TEST(KinetoTrace, NcclKernelsGiveCommunicationAndItsExposedPart) {
  TraceBuilder b;
  b.doc()["distributedInfo"] = {{"backend", "nccl"}, {"rank", 0}, {"world_size", 2}};
  b.step(1, 0, 1000);
  b.span("cpu_op", "record_param_comms", 40, 20,
         {{"Collective name", "allreduce"},
          {"In msg nelems", 1 << 20},
          {"dtype", "Float"},
          {"Group size", 2}});
  b.kernel("ampere_sgemm_128x64_nn", 10, 100, 400);
  b.span("cuda_runtime", "cudaLaunchKernel", 50, 5, {{"correlation", 900}});
  b.span("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 400, 400,
         {{"correlation", 900}, {"stream", 20}, {"grid", {2, 1, 1}}, {"block", {512, 1, 1}}},
         /*tid=*/20);
  const EpochSummary s = kineto_epoch_summary(parse_kineto_trace(b.text()));
  const CommEpochStats* c = s.sections.get<CommEpochStats>();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->backend, "nccl");
  EXPECT_EQ(c->world_size, 2);
  EXPECT_EQ(c->stats.collectives, 1);
  EXPECT_EQ(c->stats.bytes, 4 << 20);
  EXPECT_EQ(c->stats.comm_ns, 400 * kUs);
  EXPECT_EQ(c->stats.exposed_ns, 300 * kUs);
  // All-reduce bus bandwidth, nccl-tests' convention: 4 MiB in 400 µs x 2(n-1)/n.
  ASSERT_EQ(c->ops.size(), 1u);
  EXPECT_NEAR(c->ops[0].busbw, (4 << 20) / 400e-6 * 1.0, 1e3);
  const std::vector<Advice> advice = run_advisors(s, Config{});
  const bool exposed = std::any_of(advice.begin(), advice.end(),
                                   [](const Advice& a) { return a.id == "exposed_communication"; });
  EXPECT_TRUE(exposed) << "300 of a 1 ms step exposed";
}

TEST(KinetoTrace, SyncThenIdleIsHostSyncIdleNamedByItsOp) {
  TraceBuilder b;
  b.step(1, 0, 1000);
  b.kernel("void at::native::vectorized_elementwise_kernel<4>", 10, 20, 480);  // [20, 500]
  b.span("cpu_op", "aten::item", 90, 415);
  b.span("cpu_op", "aten::_local_scalar_dense", 95, 405);
  b.span("cuda_runtime", "cudaStreamSynchronize", 100, 400, {{"correlation", 100}});
  b.kernel("void at::native::vectorized_elementwise_kernel<4>", 700, 710, 90);  // [710, 800]
  b.kernel("void at::native::vectorized_elementwise_kernel<4>", 890, 900, 50);  // [900, 950]
  // The profiler's own synchronize at its stop, after the last step: no host sync.
  b.span("cuda_runtime", "cudaDeviceSynchronize", 1100, 50, {{"correlation", 101}});
  const EpochSummary s = kineto_epoch_summary(parse_kineto_trace(b.text()));
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->stats.host_syncs, 1);
  EXPECT_EQ(gpu->stats.host_sync_ns, 415 * kUs);  // the op's extent: the host's wait
  // The drain until the next kernel ([500, 710] of GPU idle), then the later gaps between kernels
  // up to the wait's length less the drain (415 - 205 = 210 µs): [800, 900].
  EXPECT_EQ(gpu->stats.idle_host_sync_ns, 310 * kUs);
  EXPECT_EQ(gpu->stats.idle_launch_gap_ns, 0);
  EXPECT_EQ(gpu->stats.idle_other_ns, 70 * kUs);  // [0, 20] and [950, 1000]
  ASSERT_EQ(gpu->top_sync_sites.size(), 1u);
  EXPECT_EQ(gpu->top_sync_sites[0].cause, "aten::item");
  EXPECT_EQ(gpu->top_sync_sites[0].count, 1);
  EXPECT_EQ(gpu->top_sync_sites[0].trainer_calls, 1);
  EXPECT_EQ(gpu->top_sync_sites[0].idle_ns, 310 * kUs);
}

TEST(KinetoTrace, FlopsFromRecordedShapesLeafOpsOnly) {
  TraceBuilder b;
  b.step(1, 0, 1000);
  const json mm_args = {{"Input Dims", {{64, 128}, {128, 32}}},
                        {"Input type", {"float", "float"}},
                        {"Concrete Inputs", {"", ""}}};
  // aten::linear has no formula; the addmm inside counts; a matmul around an mm counts once.
  b.span("cpu_op", "aten::linear", 100, 100);
  b.span("cpu_op", "aten::addmm", 110, 50,
         {{"Input Dims", {{32}, {64, 128}, {128, 32}, {}, {}}},
          {"Input type", {"float", "float", "float", "Scalar", "Scalar"}},
          {"Concrete Inputs", {"", "", "", "1", "1"}}});
  b.span("cpu_op", "aten::mm", 300, 50, mm_args);
  b.span("cpu_op", "aten::mm", 310, 20, mm_args);  // nested: the outer one is not a leaf
  b.kernel("ampere_sgemm_128x64_nn", 120, 130, 400);
  const KinetoTrace t = parse_kineto_trace(b.text());
  ASSERT_EQ(t.steps.size(), 1u);
  const double one = 2.0 * 64 * 128 * 32;
  EXPECT_DOUBLE_EQ(t.steps[0].flops.model_flops, 2 * one);
  const EpochSummary s = kineto_epoch_summary(t);
  const FlopEpochStats* f = s.sections.get<FlopEpochStats>();
  ASSERT_NE(f, nullptr);
  EXPECT_DOUBLE_EQ(f->model_flops_per_step, 2 * one);
  EXPECT_EQ(f->dominant_precision, MathPrecision::kFp32);
  // MFU against the H100 SXM's fp32 peak (67 TFLOP/s) over the 1 ms step.
  EXPECT_NEAR(f->mfu, 2 * one / 1e-3 / 67e12, 1e-12);
  // --peak-tflops replaces it.
  KinetoOptions o;
  o.peak_tflops = 100;
  const EpochSummary with_peak = kineto_epoch_summary(t, o);  // the section lives in it
  const FlopEpochStats* g = with_peak.sections.get<FlopEpochStats>();
  ASSERT_NE(g, nullptr);
  EXPECT_NEAR(g->mfu, 2 * one / 1e-3 / 100e12, 1e-12);
}

TEST(KinetoTrace, RejectsWhatIsNotAKinetoTrace) {
  EXPECT_THROW(parse_kineto_trace("not json"), KinetoError);
  EXPECT_THROW(parse_kineto_trace(R"({"a": 1})"), KinetoError);
  EXPECT_THROW(parse_kineto_trace(R"([1, 2])"), KinetoError);
  // A trace without profiler steps: nothing to call a step.
  EXPECT_THROW(parse_kineto_trace(R"({"traceEvents": []})"), KinetoError);
  EXPECT_THROW(read_trace_file("/nonexistent/trace.json"), KinetoError);
}

// ---- hostile input (docs/analyze.md, "Limits and refusals") ------------------------------------

// The message of the KinetoError `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const KinetoError& e) {
    return e.what();
  }
  return "";
}

class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/kineto_test_XXXXXX";
    path_ = ::mkdtemp(name) != nullptr ? name : "";
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

TEST(KinetoTrace, RefusesWhatIsNotARegularFileWithoutReadingIt) {
  TempDir dir;
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  // Opening a FIFO with no writer blocks; refused from stat, it is never opened.
  EXPECT_NE(error_of([&] {
              read_trace_file(dir.file("fifo"));
            }).find("fifo: not a regular file (a FIFO)"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              read_trace_file("/dev/zero");
            }).find("/dev/zero: not a regular file (a character device)"),
            std::string::npos);
}

TEST(KinetoTrace, CapsTheFileAndItsDecompressedText) {
  TempDir dir;
  // 8 MB of spaces, gzip-compressed: a few kB on disk.
  const std::string text(8 << 20, ' ');
  gzFile gz = gzopen(dir.file("bomb.json.gz").c_str(), "wb9");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  gzclose(gz);
  KinetoLimits limits;
  limits.max_input_bytes = 4 << 20;
  EXPECT_NE(error_of([&] {
              read_trace_file(dir.file("bomb.json.gz"), limits);
            }).find("decompresses to more than 4 MB (--max-input-mb)"),
            std::string::npos);
  {
    std::ofstream plain(dir.file("big.json"));
    plain << text;
  }
  EXPECT_NE(error_of([&] {
              read_trace_file(dir.file("big.json"), limits);
            }).find("big.json: is 8 MB, above --max-input-mb 4"),
            std::string::npos);
  limits.max_input_bytes = 16 << 20;
  EXPECT_EQ(read_trace_file(dir.file("bomb.json.gz"), limits).size(), text.size());
}

TEST(KinetoTrace, CapsTheEventsAndTheNesting) {
  TraceBuilder b;
  b.step(1, 1000, 1000).step(2, 2000, 1000).step(3, 3000, 1000);
  KinetoLimits limits;
  limits.max_events = 2;
  EXPECT_EQ(error_of([&] { parse_kineto_trace(b.text(), limits); }),
            "more than 2 events (--max-events 2)");
  limits.max_events = 3;
  EXPECT_EQ(parse_kineto_trace(b.text(), limits).steps.size(), 3u);
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  EXPECT_EQ(error_of([&] { parse_kineto_trace(deep); }),
            "nested deeper than 64 levels: expected a Kineto trace");
}

TEST(KinetoTrace, RefusesImpossibleValuesNamingTheEvent) {
  {
    TraceBuilder b;
    b.step(1, 1000, 1000);
    b.kernel("k", 1100, 1200, -300);  // events 1 (launch) and 2 (kernel)
    EXPECT_EQ(error_of([&] { parse_kineto_trace(b.text()); }),
              "traceEvents[2].dur is -300: expected a duration of 0 to 8.64e+10 µs");
  }
  {
    TraceBuilder b;
    b.step(1, 1000, 1000).step(2, 1500, 1000);
    EXPECT_EQ(error_of([&] { parse_kineto_trace(b.text()); }),
              "ProfilerStep#2 (traceEvents[1]) starts before ProfilerStep#1 (traceEvents[0]) "
              "ends: expected one profiler step after another");
  }
  const auto mm = [](json dims) {
    TraceBuilder b;
    b.step(1, 1000, 1000);
    b.span("cpu_op", "aten::mm", 1100, 10,
           {{"Input Dims", dims}, {"Input type", {"float", "float"}}});
    return error_of([&] { parse_kineto_trace(b.text()); });
  };
  EXPECT_EQ(mm({{64, -64}, {64, 64}}),
            "traceEvents[1].args.\"Input Dims\"[0][1] is -64: expected a size of 0 or more");
  EXPECT_EQ(mm({{100000000, 100000000}, {100000000, 100000000}}),
            "traceEvents[1].args.\"Input Dims\"[0] has 1e+16 elements: expected at most "
            "1.09951e+12 (2^40)");
  // Shapes a GPU holds, but a step no GPU runs: 2e18 FLOPs in 1 ms.
  EXPECT_NE(mm({{1000000, 1000000}, {1000000, 1000000}})
                .find("ProfilerStep#1 (traceEvents[0]) counts 2e+18 FLOPs in 0.001 s"),
            std::string::npos);
  EXPECT_EQ(mm({{64, 64}, {64, 64}}), "");
}

TEST(KinetoTrace, NamesAreKeptPrintable) {
  EXPECT_EQ(printable("a\x1b[2Jb\x07\x7f"), "a\\x1b[2Jb\\x07\\x7f");
  EXPECT_EQ(printable("csi \xc2\x9b"
                      "31m, \xc3\xa9 stays"),
            "csi \\u009b31m, \xc3\xa9 stays");
  TraceBuilder b;
  b.doc()["deviceProperties"][0]["name"] = "GPU\x1b]0;owned\x07";
  b.step(1, 1000, 1000);
  b.kernel("evil\x1b[2J", 1100, 1200, 100);
  const KinetoTrace t = parse_kineto_trace(b.text());
  EXPECT_EQ(t.device, "GPU\\x1b]0;owned\\x07");
  ASSERT_EQ(t.events.kernels.size(), 1u);
  EXPECT_EQ(t.events.kernels[0].name, "evil\\x1b[2J");
}

TEST(KinetoTrace, MessagesSayWhatWasExpectedAndWhere) {
  const std::string step =
      R"({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 1000, "dur": 10})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty file: expected a Kineto trace (a JSON object with \"traceEvents\")"},
      {"[1, 2]",
       "not a Kineto trace: expected a JSON object with a \"traceEvents\" array, got an array"},
      {R"({"a": 1})",
       "not a Kineto trace: no \"traceEvents\" key: expected a JSON object with a "
       "\"traceEvents\" array"},
      {R"({"traceEvents": {}})",
       "not a Kineto trace: \"traceEvents\" is an object: expected an array of events"},
      {R"({"traceEvents": [)" + step + ", 5]}",
       "traceEvents[1] is a number: expected an event (a JSON object)"},
      {R"({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": "1"}]})",
       "traceEvents[0].ts is a string: expected a number (microseconds)"},
      {R"({"traceEvents": [{"ph": 1}]})", "traceEvents[0].ph is a number: expected a string"},
      {R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "args": []}]})",
       "traceEvents[0].args is an array: expected an object"},
      {R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1,)"
       R"( "args": {"stream": "7"}}]})",
       "traceEvents[0].args.stream is a string: expected an integer in [0, 4294967295]"},
      {R"({"distributedInfo": {"world_size": 0}, "traceEvents": []})",
       "distributedInfo.world_size is 0: expected an integer in [1, 16777216]"},
      {R"({"distributedInfo": {"world_size": 2, "rank": 2}, "traceEvents": []})",
       "distributedInfo.rank is 2: expected an integer in [0, 1]"},
      {R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1,)"
       R"( "args": {"stream": 1.5}}]})",
       "traceEvents[0].args.stream is 1.5: expected an integer in [0, 4294967295]"},
      {R"({"deviceProperties": [{"name": 5}], "traceEvents": []})",
       "deviceProperties[0].name is a number: expected a string"},
      {R"({"traceEvents": [)" + step, "truncated JSON: the text ends inside a value (at byte 103)"},
      {"{\n\"traceEvents\": [x]}", "not JSON: syntax error at line 2, column 17"},
  };
  for (const auto& [text, message] : cases) {
    EXPECT_EQ(error_of([&] { parse_kineto_trace(text); }), message) << text;
  }
}

// ---- the fixtures: real traces of planted trainers (scripts/make_kineto_fixtures.py)
// -------------

struct Analysis {
  KinetoTrace trace;
  EpochSummary summary;
  std::vector<Advice> advice;
  const Advice* find(const std::string& id) const {
    for (const Advice& a : advice) {
      if (a.id == id) return &a;
    }
    return nullptr;
  }
  template <class S>
  const S* section() const {
    return summary.sections.get<S>();
  }
};

Analysis analyze(const std::string& name) {
  Analysis a;
  a.trace = parse_kineto_trace(
      read_trace_file(std::string(TORCHPILOT_SOURCE_DIR) + "/tests/fixtures/kineto/" + name));
  a.summary = kineto_epoch_summary(a.trace);
  a.advice = run_advisors(a.summary, Config{});
  return a;
}

TEST(KinetoFixtures, DataWaitIsDataStarvation) {
  const Analysis a = analyze("data_wait.json.gz");
  EXPECT_EQ(a.summary.steps, 5);
  EXPECT_GT(a.summary.data_wait_fraction, 0.5);  // a worker sleeping 0.5 ms per sample, 64/batch
  const Advice* d = a.find("data_starvation");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->severity, Severity::kHigh);
  EXPECT_EQ(a.find("host_sync"), nullptr);
}

TEST(KinetoFixtures, HostSyncIsNamedItem) {
  const Analysis a = analyze("host_sync.json.gz");
  ASSERT_NE(a.find("host_sync"), nullptr);
  const GpuEpochStats* gpu = a.section<GpuEpochStats>();
  ASSERT_NE(gpu, nullptr);
  ASSERT_FALSE(gpu->top_sync_sites.empty());
  EXPECT_EQ(gpu->top_sync_sites[0].cause, "aten::item");
  EXPECT_EQ(gpu->stats.host_syncs, 5);  // one loss.item() per step
  EXPECT_EQ(a.find("data_starvation"), nullptr);
}

TEST(KinetoFixtures, PageableCopiesArePageable) {
  const Analysis a = analyze("pageable_copies.json.gz");
  ASSERT_NE(a.find("pageable_copies"), nullptr);
  const GpuEpochStats* gpu = a.section<GpuEpochStats>();
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->stats.h2d_pageable_bytes, gpu->stats.h2d_bytes);
  EXPECT_EQ(gpu->stats.h2d_bytes, 5LL * 256 * 3 * 64 * 64 * 4);  // the batch, every step
  EXPECT_EQ(gpu->stats.host_syncs, 0);                           // the profiler's stop is not one
}

TEST(KinetoFixtures, LaunchBoundIsLaunchBound) {
  const Analysis a = analyze("launch_bound.json.gz");
  const Advice* l = a.find("launch_bound");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->severity, Severity::kHigh);
}

TEST(KinetoFixtures, Fp32MatmulIsThePrecisionAdvice) {
  const Analysis a = analyze("fp32_matmul.json.gz");
  const Advice* p = a.find("fp32_matmul");
  ASSERT_NE(p, nullptr);
  EXPECT_GT(p->expected_gain, 0.5);
  const FlopEpochStats* f = a.summary.sections.get<FlopEpochStats>();
  ASSERT_NE(f, nullptr);
  // 3 matmuls per linear (forward, two gradients; the first layer's input gradient is skipped by
  // autograd: x needs none), 2 layers of 2048 x 4096 x 4096: 5 x 2 x 2048 x 4096 x 4096.
  EXPECT_DOUBLE_EQ(f->model_flops_per_step, 5.0 * 2 * 2048 * 4096 * 4096);
  EXPECT_EQ(f->dominant_precision, MathPrecision::kFp32);
}

TEST(KinetoFixtures, NcclWithOneRankRunsNoKernelSoNothingIsExposed) {
  // World size 1: NCCL's in-place all-reduce with one rank launches no kernel (the trace has
  // none), so there is no communication time and exposed_communication stays quiet.
  const Analysis a = analyze("nccl_allreduce.json.gz");
  const CommEpochStats* c = a.summary.sections.get<CommEpochStats>();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->backend, "nccl");
  EXPECT_EQ(c->world_size, 1);
  EXPECT_EQ(c->stats.collectives, 20);  // 4 parameters x 5 steps
  EXPECT_EQ(c->stats.comm_ns, 0);
  EXPECT_EQ(a.find("exposed_communication"), nullptr);
}

TEST(KinetoFixtures, HealthyHasNoPlantedProblem) {
  // The conv net on data already on the GPU: no data wait, no sync, no copies, no plain fp32
  // convolutions (cuDNN's TF32 default). It is still launch-bound on an H100 (about 0.43 ms of
  // kernels in a 1.76 ms step without the profiler): launch_bound and host_bound say so.
  const Analysis a = analyze("healthy.json.gz");
  for (const char* id : {"data_starvation", "host_sync", "pageable_copies", "fp32_matmul",
                         "exposed_communication", "busy_inefficient"}) {
    EXPECT_EQ(a.find(id), nullptr) << id;
  }
}

// The headline MFU is against the peak the advice means: an fp32 model's MFU at the fp32 peak
// (73%) said it ran near the device's limit while fp32_matmul says bf16 would be several times
// faster; the line leads with the bf16 dense peak (5.0%) and gives the fp32 one beside it.
TEST(KinetoFixtures, TheHeadlineMfuIsAgainstTheBestDensePeak) {
  const Analysis a = analyze("fp32_matmul.json.gz");
  const FlopEpochStats* f = a.summary.sections.get<FlopEpochStats>();
  ASSERT_NE(f, nullptr);
  ASSERT_TRUE(measured(f->mfu));
  ASSERT_TRUE(measured(f->mfu_best_peak));
  EXPECT_EQ(f->best_peak_precision, MathPrecision::kBf16);
  // H100 SXM: bf16 dense 989.5 against fp32 67 TFLOP/s.
  EXPECT_NEAR(f->mfu_best_peak, f->mfu * 67.0 / 989.5, 0.01 * f->mfu);
  std::string gpu_line;
  for (const std::string& line : format_epoch(a.summary, a.advice)) {
    if (line.find("MFU") != std::string::npos) gpu_line = line;
  }
  EXPECT_NE(gpu_line.find("MFU 5.0% of the bf16 dense peak"), std::string::npos) << gpu_line;
  EXPECT_NE(gpu_line.find("73.1% of the fp32 peak"), std::string::npos) << gpu_line;
}

// torch.profiler in Python leaves its marks: the process python3, Optimizer.step#..., the
// DataLoader's enumerate(DataLoader)#... scopes.
TEST(KinetoFixtures, PythonMadeTracesAreTold) {
  for (const char* name : {"healthy.json.gz", "data_wait.json.gz", "fp32_matmul.json.gz"}) {
    const Analysis a = analyze(name);
    EXPECT_EQ(a.trace.frontend, "python") << name;
    EXPECT_FALSE(a.trace.frontend_evidence.empty()) << name;
  }
}

// A Python-made trace's advice speaks Python (DataLoader, torch.autocast, ...) and keeps the
// advisor's estimate; a C++-made one keeps the C++ and torchpilot actions.
TEST(KinetoFixtures, PythonTracesGetPythonActionsWithTheSameEstimates) {
  for (const char* name : {"data_wait.json.gz", "host_sync.json.gz", "pageable_copies.json.gz",
                           "launch_bound.json.gz", "fp32_matmul.json.gz", "healthy.json.gz"}) {
    Analysis a = analyze(name);
    std::vector<Advice> cxx = a.advice;
    use_frontend_actions("cxx", cxx);
    use_frontend_actions(a.trace.frontend, a.advice);
    ASSERT_EQ(a.advice.size(), cxx.size());
    for (size_t i = 0; i < cxx.size(); ++i) {
      SCOPED_TRACE(std::string(name) + " " + a.advice[i].id);
      EXPECT_EQ(cxx[i].action, run_advisors(a.summary, Config{})[i].action) << "cxx: unchanged";
      for (const char* cxx_only : {"torchpilot::", "at::", "TunableLoader", "LibTorch"}) {
        EXPECT_EQ(a.advice[i].action.find(cxx_only), std::string::npos) << a.advice[i].action;
      }
      EXPECT_EQ(a.advice[i].expected_gain, cxx[i].expected_gain);
      // The estimate closes each action: the Python one ends as the C++ one does.
      const std::string& c = cxx[i].action;
      if (c.find("stimated") != std::string::npos && c.size() > 60) {
        const std::string tail = c.substr(c.size() - 60);
        EXPECT_EQ(a.advice[i].action.rfind(tail), a.advice[i].action.size() - 60)
            << "the estimate kept: " << a.advice[i].action;
      }
    }
  }
  const Analysis d = analyze("data_wait.json.gz");
  std::vector<Advice> py = d.advice;
  use_frontend_actions("python", py);
  bool loader = false;
  for (const Advice& a : py) loader |= a.action.find("DataLoader(") != std::string::npos;
  EXPECT_TRUE(loader);
}

// A trace LibTorch's C++ profiler made (tests/fixtures/kineto/make_cxx_trace.cpp: an MLP on CUDA
// with loss.item() every step) has none of Python's marks: C++ actions, host_sync named.
TEST(KinetoFixtures, ACxxMadeTraceKeepsTheCxxActions) {
  Analysis a = analyze("cxx_host_sync.json.gz");
  EXPECT_EQ(a.trace.frontend, "cxx");
  EXPECT_TRUE(a.trace.frontend_evidence.empty());
  ASSERT_NE(a.find("host_sync"), nullptr);
  const std::vector<Advice> before = a.advice;
  use_frontend_actions(a.trace.frontend, a.advice);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(a.advice[i].action, before[i].action);
  bool cxx = false;
  for (const Advice& x : a.advice) cxx |= x.action.find("torchpilot::") != std::string::npos;
  EXPECT_TRUE(cxx) << "the C++ trainer's actions name torchpilot's API";
}

}  // namespace
}  // namespace torchpilot
