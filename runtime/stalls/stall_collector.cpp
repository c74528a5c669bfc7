// The stall tracker (step_outliers.h) as a collector every Pilot has (it reads only the config).
// It comes first in the calling order, so a slow step at a known period is marked
// (StepRecord::at_period) before the GPU monitor judges it; it reads the sync probe's figures once
// every collector has added its own, and takes each step's GPU span from the GPU monitor's late
// record. The registration runs at static initialization; its anchor (anchor.h) is named on the
// link line (CMake, torchpilot_core) so that a static library does not drop this object.
#include <memory>
#include <string>

#include "torchpilot/runtime/core/anchor.h"
#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/config_section.h"
#include "torchpilot/runtime/gpu/gpu_records.h"
#include "torchpilot/runtime/stalls/step_outliers.h"

namespace torchpilot {
namespace {

class StallCollector final : public Collector {
 public:
  explicit StallCollector(double factor) : stalls_(factor) {}
  std::string name() const override { return "stalls"; }
  // Called at step ends, and given the GPU monitor's late records, only while a period is known
  // (most trainers have none: no call there, and no GPU record built for it at every step).
  unsigned step_hooks() const override { return kHookStepComplete; }
  void attach(CollectorHost* host) override { host_ = host; }
  // At the boundary only whether the step sits at the period (the GPU monitor and the sync probe
  // act on it now); the step is added to the tracker with its complete record, which short steps
  // reach in batches (Pilot: kStepBatch): a period found there counts from the next boundary.
  void on_step_end(StepRecord& record) override {
    record.at_period = stalls_.at_period(record.step);
  }
  void on_step_complete(const StepRecord& record) override {
    stalls_.add(record);
    stalls_.add_probe(record);
    const bool periodic = stalls_.period() > 0;
    if (periodic != periodic_ && host_ != nullptr) {
      periodic_ = periodic;
      if (periodic) stalls_.clear_gpu_spans();
      host_->set_step_hooks(*this, step_hooks() | (periodic ? kHookStepEnd | kHookLateStep : 0u));
    }
  }
  void on_late_step(const LateStepRecord& record) override {
    // A step's GPU span: what a periodic stall cost the GPU (OutlierStats). The stalls before
    // the period was known have none: the excess is scaled from those that have.
    if (record.record_type != GpuStepRecord::kRecordType) return;
    if (const auto* g = record.get<GpuStepRecord>(); g != nullptr && g->gpu_timed) {
      stalls_.add_gpu_span(record.step, g->gpu_end_ns - g->gpu_begin_ns);
    }
  }
  void on_epoch_complete(EpochSummary& summary) override {
    static const std::vector<std::string> none;
    summary.sections.set(stalls_.summarize(summary, host_ ? host_->phase_names() : none));
  }

 private:
  StallTracker stalls_;
  CollectorHost* host_ = nullptr;
  bool periodic_ = false;  // a period is known: on_step_end is called
};

std::unique_ptr<Collector> make_stall_collector(CollectorHost& host) {
  return std::make_unique<StallCollector>(host.config().section<OutliersConfig>().factor);
}

}  // namespace

TORCHPILOT_REGISTRATION(stalls) {
  register_config_section<OutliersConfig>(
      {config_key<OutliersConfig, &OutliersConfig::factor>("factor", 1.1, 1000.0)});
  register_default_collector("stalls", -100, &make_stall_collector, /*always=*/true);
}

}  // namespace torchpilot
