// Collectors: every source of records (the GPU monitor, the FLOP counter, the loader's counters,
// and whatever comes next) plugs into the Pilot through this one interface, in the spirit of
// kineto's IActivityProfiler. A collector hears step, phase and epoch boundaries and window
// requests, may add named figures to each step record (StepRecord::metrics), publish late step
// records (CollectorHost::publish), and adds its section to each epoch summary
// (EpochSummary::sections). Sinks format sections generically, so a new collector touches its own
// files, its config rows and its docs, nothing else (docs/architecture.md has the checklist).
//
// Registration: a program adds collectors with Pilot::add_collector (or PilotOptions::collectors);
// a subsystem (the GPU collectors, the stall tracker, the run journal, ...) registers a factory
// with register_default_collector, and every Pilot then creates one from it at construction.
//
// Thread-safety: the Pilot calls collectors on the training thread, in the order they were added
// (the loader's first, then the default ones, then the program's). Failure behaviour: the Pilot
// catches anything a collector throws, logs it once with the collector's name and drops it; the
// training loop never sees it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/logging.h"
#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/core/section.h"

namespace torchpilot {

class Collector;

// What a collector may use of the Pilot it is attached to.
class CollectorHost {
 public:
  virtual ~CollectorHost() = default;
  virtual const Config& config() const = 0;
  virtual Clock& clock() = 0;
  // The host runs on the steady clock, which vendor timestamps are converted to.
  virtual bool steady_clock() const = 0;
  virtual void log(LogLevel level, const std::string& message) = 0;
  // The advisory log itself, for vendor code that logs with spdlog (never from a LibTorch
  // translation unit: use log()).
  virtual spdlog::logger& logger() = 0;
  // Auto-tune trials are running: optional measurements (trace windows) wait until they end.
  virtual bool tuning() const = 0;
  // A step's figures that became known after the step (sent to every sink's on_late_step).
  virtual void publish(const LateStepRecord& record) = 0;
  // Whether a late step record published now would reach anyone (a sink that wants them, a
  // collector with kHookLateStep): a collector skips building those nobody reads.
  virtual bool late_steps_wanted() const { return true; }
  // The cost budget (cost.h): would optional work costing `estimate_ns` of the training thread
  // fit now? Work that does not fit is deferred or skipped and reported with cost_deferred().
  virtual bool cost_allows(Nanos /*estimate_ns*/) const { return true; }
  virtual void cost_deferred(const std::string& /*what*/, Nanos /*estimate_ns*/) {}
  // What the collector cost the training thread outside its own callbacks (a trace window's
  // slower launches); the host times the callbacks itself.
  virtual void charge_cost(Nanos /*ns*/) {}
  // Called from on_step_end: the step ending now is taken at once (with the steps waiting before
  // it) instead of in a batch, for a collector whose next step depends on this one's
  // on_step_record (a trace or counting window that opens or closes).
  virtual void take_step_now() {}
  // From now on the host calls only `hooks` (StepHook bits) of `who`'s per-step callbacks: a
  // collector with nothing to do at most boundaries (a probe waiting for a stall's period, a
  // counter between its windows) is not called there at all. Cheap, but not for every step.
  virtual void set_step_hooks(const Collector& /*who*/, unsigned /*hooks*/) {}
  // torchpilot's time on the training thread in the open epoch so far (its step calls, windows).
  virtual Nanos epoch_cost_ns() const { return 0; }
  // The phases' names by id (Pilot::phase_id).
  virtual const std::vector<std::string>& phase_names() const {
    static const std::vector<std::string> none;
    return none;
  }
};

// The per-step callbacks a collector implements (Collector::step_hooks): the Pilot calls only
// those at every step. A call to an empty default costs a trainer whose work evicted it from the
// caches a fraction of a microsecond, several of them a step.
enum StepHook : unsigned {
  kHookStepBegin = 1u << 0,     // on_step_begin
  kHookPhase = 1u << 1,         // on_phase_begin, on_phase_end
  kHookStepEnd = 1u << 2,       // on_step_end
  kHookStepComplete = 1u << 3,  // on_step_complete
  kHookLateStep = 1u << 4,      // on_late_step
  kHookStepRecord = 1u << 5,    // on_step_record
  // on_step_end only at the steps an earlier collector's on_step_end marked at_period (the stall
  // tracker, first in the calling order) or probe_syncs: a collector that acts around a recurring
  // stall, or on a few steps another collector asks for, only.
  kHookPeriodStepEnd = 1u << 6,
  kAllStepHooks = (1u << 7) - 1,
};

class Collector {
 public:
  virtual ~Collector() = default;
  virtual std::string name() const = 0;
  // Which per-step callbacks this collector overrides (StepHook bits), read once when it is
  // added; the others are not called. Default: all (a collector that does not say is called).
  // A collector changes them later with CollectorHost::set_step_hooks.
  virtual unsigned step_hooks() const { return kAllStepHooks; }
  // Called once when added to a host, and with nullptr when the host goes away (or drops the
  // collector): from then on the collector must not use it.
  virtual void attach(CollectorHost* /*host*/) {}
  // A step scope opened at `now` (step numbers from 0).
  virtual void on_step_begin(int64_t /*step*/, Nanos /*now*/) {}
  virtual void on_phase_begin(int /*phase_id*/, const std::string& /*phase_name*/) {}
  virtual void on_phase_end(int /*phase_id*/) {}
  // The step ended (called at the boundary): what must happen at that moment (a marker behind
  // the step's launches, closing a window); the collector may add its metrics to the record.
  virtual void on_step_end(StepRecord& /*record*/) {}
  // The rest of a step's bookkeeping, which needs nothing of the boundary's moment (planners,
  // queues, figures added to the record): called for each step in order, after every collector's
  // on_step_end of it and before any on_step_complete of it. Steps shorter than 5 ms come here
  // in the Pilot's batches (many steps over warm code and data, where a call at every boundary
  // finds both evicted by the trainer's work); a collector whose next step must see this one done
  // asks for CollectorHost::take_step_now() in on_step_end.
  virtual void on_step_record(StepRecord& /*record*/) {}
  // Every collector's on_step_end and on_step_record of it have run: the record as sinks will see
  // it. Steps shorter than 5 ms come here (and to the sinks) in batches, in order, one collector
  // over the whole batch at a time (Pilot::kStepBatch); before a late record is published, the
  // steps before it have come.
  virtual void on_step_complete(const StepRecord& /*record*/) {}
  // The epoch ended; the collector adds its section before advisors run.
  virtual void on_epoch_end(EpochSummary& /*summary*/) {}
  // Every collector's on_epoch_end has run: a figure over the others' sections is added here.
  virtual void on_epoch_complete(EpochSummary& /*summary*/) {}
  // A collector published a late step record (CollectorHost::publish); sinks get it next.
  virtual void on_late_step(const LateStepRecord& /*record*/) {}
  // The trainer saved a checkpoint at its step `step` (Pilot::checkpoint_saved).
  virtual void on_checkpoint(int64_t /*step*/) {}
  // The run ends (the Pilot goes): publish what is still held back (late step records).
  virtual void on_close() {}
  // Someone asked for a detailed measurement window of `steps` steps from the next step.
  virtual void on_window_request(int /*steps*/) {}
};

// A factory a subsystem registers; it may return null (with a log line through the host) when its
// collector cannot run here. A factory that throws ConfigError fails the Pilot's construction (a
// bad path in the config); anything else it throws is logged and the collector left out.
using CollectorFactory = std::unique_ptr<Collector> (*)(CollectorHost& host);
struct DefaultCollector {
  std::string name;  // the collector's name() (docs/architecture.md lists every one)
  CollectorFactory factory = nullptr;
  int order = 0;  // calling order among the default collectors: lower first, then registration's
  // Made even when PilotOptions::default_collectors is off: pure collectors that read only the
  // config (the stall tracker, the run journal), not devices or LibTorch.
  bool always = false;
};
// Thread-safe; usually called during static initialization of the registering library.
void register_default_collector(std::string name, int order, CollectorFactory factory,
                                bool always = false);
std::vector<DefaultCollector> default_collectors();  // by order

// Settings a subsystem resolves once, before any collector is made (the gpu subsystem: which GPU
// gpu.device auto observes). `probe_devices` is false when the default collectors are off.
using ConfigResolver = void (*)(Config& config, spdlog::logger& logger, bool probe_devices);
void register_config_resolver(ConfigResolver resolver);
std::vector<ConfigResolver> config_resolvers();

}  // namespace torchpilot
