// Fault injection: every place where the Pilot calls code it does not control (knob setters,
// loader probes, collectors, sinks, the GPU backend) is driven with implementations that throw,
// std exceptions and other types alike. The training loop never sees an exception after
// start-up, nothing terminates the process, the failing piece is named in one log line, and the
// run goes on.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fakes/autotune_config.h"
#include "fakes/pilot_parts.h"
#include "fakes/string_logger.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"
#include "torchpilot/runtime/loader/loader_probe.h"

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1'000'000;

// How a fake throws: nothing, a std exception, or a type that is not one.
enum class Throw { kNothing, kStd, kOther };
void maybe_throw(Throw t, const char* what) {
  if (t == Throw::kStd) throw std::runtime_error(what);
  if (t == Throw::kOther) throw 42;
}
const Throw kBoth[] = {Throw::kStd, Throw::kOther};

struct Harness : test::PilotParts {
  explicit Harness(Config c = {}, std::vector<std::shared_ptr<Collector>> collectors = {},
                   std::vector<std::shared_ptr<Sink>> sinks = {}) {
    PilotOptions o = options("fault");
    for (auto& s : sinks) o.sinks.push_back(s);
    o.collectors = std::move(collectors);
    pilot = std::make_unique<Pilot>(std::move(c), std::move(o));
  }
  void steps(int n, int64_t samples = 8) {
    for (int i = 0; i < n; ++i) {
      auto s = pilot->step(samples);
      clock->advance(10 * kMs);
    }
  }
  // Occurrences of `text` in the log.
  int count(const std::string& text) const {
    const std::string l = log.str();
    int n = 0;
    for (size_t at = l.find(text); at != std::string::npos; at = l.find(text, at + 1)) ++n;
    return n;
  }
};

// A loader probe with one knob whose setter throws on a chosen value.
class FaultyLoader final : public LoaderProbe {
 public:
  LoaderStats stats() const override {
    maybe_throw(stats_throws, "stats failed");
    LoaderStats s;
    s.name = "faulty";
    s.tunable = true;
    s.settings.workers = workers;
    s.produce_count = produced;
    s.produce_ns = produced * 5 * kMs;
    return s;
  }
  void forget_pilot() override { maybe_throw(forget_throws, "forget failed"); }
  std::vector<Knob> knobs() {
    return {{"loader.workers",
             {0, 1, 2, 4, 8},
             [this] { return int64_t{workers}; },
             [this](int64_t v) {
               if (v == bad_value) maybe_throw(setter_throws, "setter failed");
               workers = static_cast<int>(v);
             }}};
  }
  int workers = 0;
  int64_t produced = 0;
  int64_t bad_value = 1;
  Throw stats_throws = Throw::kNothing;
  Throw forget_throws = Throw::kNothing;
  Throw setter_throws = Throw::kNothing;
};

Config autotune_config() {
  Config c = test::short_autotune_config();
  c.gpu.enabled = false;
  return c;
}

TEST(FaultInjection, AKnobSetterThatThrowsFailsItsTrialNotTheStep) {
  for (Throw t : kBoth) {
    Harness h(autotune_config());
    FaultyLoader loader;
    loader.setter_throws = t;
    attach_loader(*h.pilot, &loader, loader.knobs());
    for (int i = 0; i < 80 && !h.pilot->tuning_finished(); ++i) {
      loader.produced += 1;
      EXPECT_NO_THROW(h.steps(1));
    }
    ASSERT_TRUE(h.pilot->tuning_finished());
    const auto& d = *h.pilot->tuning_decision();
    bool failed_trial = false;
    for (const auto& trial : d.trials) {
      if (trial.setting.at("loader.workers") == 1) {
        EXPECT_TRUE(trial.failed);
        EXPECT_NE(trial.note.find("applying the setting failed"), std::string::npos) << trial.note;
        failed_trial = true;
      }
    }
    EXPECT_TRUE(failed_trial) << "the search never tried the throwing value";
    EXPECT_NE(d.chosen.at("loader.workers"), 1);
    detach_loader(*h.pilot, &loader);
  }
}

TEST(FaultInjection, ALoaderProbeThatThrowsNeverReachesTheLoop) {
  for (Throw t : kBoth) {
    // advise: at the epoch's end (the loader's section).
    {
      Harness h;
      FaultyLoader loader;
      attach_loader(*h.pilot, &loader, {});
      h.steps(3);
      loader.stats_throws = t;
      EXPECT_NO_THROW(h.pilot->end_epoch());
      EXPECT_EQ(h.count("collector 'loader' failed in on_epoch_end and is removed"), 1)
          << h.log.str();
      ASSERT_EQ(h.sink->epochs.size(), 1u) << "the epoch is still summarized";
      h.steps(3);
      EXPECT_NO_THROW(h.pilot->end_epoch());
      EXPECT_EQ(h.sink->epochs.size(), 2u);
      detach_loader(*h.pilot, &loader);
    }
    // autotune: the engine reads the probe for the loader's capacity.
    {
      Harness h(autotune_config());
      FaultyLoader loader;
      attach_loader(*h.pilot, &loader, loader.knobs());
      loader.stats_throws = t;
      EXPECT_NO_THROW(h.steps(20));
      EXPECT_EQ(h.count("autotune stopped after an internal error"), 1) << h.log.str();
      EXPECT_EQ(h.pilot->mode(), Mode::kAdvise);
      EXPECT_NO_THROW(h.pilot->end_epoch());
      detach_loader(*h.pilot, &loader);
    }
  }
}

TEST(FaultInjection, APilotOutlivedByAThrowingLoaderStillGoesQuietly) {
  for (Throw t : kBoth) {
    FaultyLoader loader;
    {
      Harness h;
      attach_loader(*h.pilot, &loader, {});
      h.steps(2);
      loader.forget_throws = t;
      h.pilot.reset();  // ~Pilot tells the loader to forget it: that throws, and must not escape
      EXPECT_EQ(h.count("the attached loader failed to let go of the Pilot"), 1) << h.log.str();
    }
  }
}

// A collector that throws from one chosen callback.
class ThrowingCollector final : public Collector {
 public:
  ThrowingCollector(std::string where, Throw t) : where_(std::move(where)), throw_(t) {}
  std::string name() const override { return "faulty-" + where_; }
  void attach(CollectorHost* host) override {
    attached = host != nullptr;
    if (where_ == "attach" && host != nullptr) maybe_throw(throw_, "attach");
  }
  void on_step_begin(int64_t, Nanos) override { hit("on_step_begin"); }
  void on_phase_begin(int, const std::string&) override { hit("on_phase_begin"); }
  void on_phase_end(int) override { hit("on_phase_end"); }
  void on_step_end(StepRecord&) override { hit("on_step_end"); }
  void on_epoch_end(EpochSummary&) override { hit("on_epoch_end"); }
  void on_window_request(int) override { hit("on_window_request"); }
  bool attached = false;

 private:
  void hit(const char* where) {
    if (where_ == where) maybe_throw(throw_, where);
  }
  std::string where_;
  Throw throw_;
};

TEST(FaultInjection, ACollectorThatThrowsAnywhereIsDroppedWithOneLine) {
  const char* callbacks[] = {"attach",      "on_step_begin", "on_phase_begin",   "on_phase_end",
                             "on_step_end", "on_epoch_end",  "on_window_request"};
  for (Throw t : kBoth) {
    for (const char* where : callbacks) {
      auto c = std::make_shared<ThrowingCollector>(where, t);
      Harness h({}, {c});
      for (int epoch = 0; epoch < 2; ++epoch) {
        for (int i = 0; i < 3; ++i) {
          auto s = h.pilot->step(8);
          { auto p = h.pilot->phase("forward"); }
          h.clock->advance(10 * kMs);
        }
        EXPECT_NO_THROW(h.pilot->request_window(2));
        EXPECT_NO_THROW(h.pilot->end_epoch());
      }
      const std::string name = std::string("collector 'faulty-") + where + "'";
      EXPECT_EQ(h.count(name), 1) << where << "\n" << h.log.str();
      EXPECT_FALSE(c->attached) << where << ": a dropped collector is detached";
      EXPECT_EQ(h.sink->epochs.size(), 2u) << where;
      EXPECT_EQ(h.sink->steps.size(), 6u) << where;
    }
  }
}

class ThrowingSink final : public Sink {
 public:
  explicit ThrowingSink(Throw t) : throw_(t) {}
  std::string name() const override { return "faulty-sink"; }
  void on_step(const StepRecord&, const std::vector<std::string>&) override {
    maybe_throw(throw_, "sink");
  }

 private:
  Throw throw_;
};

TEST(FaultInjection, ASinkThatThrowsIsDisabledWithOneLine) {
  for (Throw t : kBoth) {
    Harness h({}, {}, {std::make_shared<ThrowingSink>(t)});
    EXPECT_NO_THROW(h.steps(5));
    EXPECT_NO_THROW(h.pilot->end_epoch());
    EXPECT_EQ(h.count("sink 'faulty-sink' failed in on_step and is disabled"), 1) << h.log.str();
    EXPECT_EQ(h.sink->steps.size(), 5u) << "the other sinks still get every step";
  }
}

// A GPU backend whose every call may throw: vendor code, reached from the monitor's callbacks
// and from its destructor.
class ThrowingBackend final : public GpuBackend {
 public:
  explicit ThrowingBackend(Throw t) : t_(t) {}
  GpuDeviceInfo device() const override { return {0, "Fake GPU", "GH100", 132}; }
  std::vector<CollectorStatus> status() const override {
    return {{kPmSamplingCollector, true, ""},
            {kActivityCollector, true, ""},
            {kNvmlCollector, true, ""},
            {kNvtxCollector, true, ""}};
  }
  void start() override {}
  bool start_trace() override { return true; }
  void stop_trace() override { maybe_throw(t_, "stop_trace"); }
  void release_trace() override { maybe_throw(t_, "release_trace"); }
  void flush() override {}
  void drain(GpuEventBatch&) override {
    maybe_throw(throw_in_drain ? t_ : Throw::kNothing, "drain");
  }
  void stop() override { maybe_throw(t_, "stop"); }
  void range_push(const char*) override {}
  void range_pop() override {}
  bool throw_in_drain = false;

 private:
  Throw t_;
};

TEST(FaultInjection, AThrowingGpuBackendNeverTerminatesTheProgram) {
  for (Throw t : kBoth) {
    Config c;
    c.gpu.trace_first_step = 1;
    c.gpu.trace_steps = 100;  // a window still open when the Pilot goes
    auto backend = std::make_shared<ThrowingBackend>(t);
    std::ostringstream out;
    auto logger = test::string_logger("gpu-fault", out);
    {
      Harness h(c, {make_gpu_monitor(c.gpu, backend, *logger)});
      h.steps(4);
      // Destroying the Pilot destroys the monitor, which stops the trace and the backend: both
      // throw, in a destructor.
    }
    // In a step: the monitor is dropped, the loop goes on.
    auto backend2 = std::make_shared<ThrowingBackend>(t);
    backend2->throw_in_drain = true;
    Harness h(c, {make_gpu_monitor(c.gpu, backend2, *logger)});
    EXPECT_NO_THROW(h.steps(3));
    EXPECT_EQ(h.count("collector 'gpu' failed in on_step_record and is removed"), 1) << h.log.str();
    EXPECT_NO_THROW(h.pilot->end_epoch());
  }
}

TEST(FaultInjection, ASecondPilotKeepsTheFirstOnesLogLevel) {
  Config debug;
  debug.log.level = "debug";
  debug.gpu.enabled = false;
  Pilot first(debug);
  EXPECT_EQ(first.logger().level(), spdlog::level::debug);
  Config quiet;
  quiet.log.level = "error";
  quiet.gpu.enabled = false;
  Pilot second(quiet);
  EXPECT_EQ(second.logger().level(), spdlog::level::err);
  EXPECT_EQ(first.logger().level(), spdlog::level::debug) << "the second Pilot changed it";
}

}  // namespace
}  // namespace torchpilot
