// The attached loader as a collector (loader_probe.h): its counters per epoch, its knobs, and the
// production rate the tuner reads (TunerHost::supply through Pilot::set_supply).
#include <memory>
#include <string>

#include "torchpilot/runtime/core/guard.h"
#include "torchpilot/runtime/loader/loader_probe.h"

namespace torchpilot {
namespace {

class LoaderCollector final : public Collector {
 public:
  LoaderCollector(Pilot& pilot, LoaderProbe* probe)
      : pilot_(&pilot), probe_(probe), at_epoch_start_(probe->stats()) {}
  std::string name() const override { return "loader"; }
  unsigned step_hooks() const override { return 0; }
  LoaderProbe* probe() const { return probe_; }

  void attach(CollectorHost* host) override {
    if (host != nullptr) return;
    // The Pilot goes, or dropped this collector: the loader's knobs and rate go with it, and the
    // loader must stop reporting (it would detach from a Pilot that no longer holds it).
    release();
    if (const auto failed = failure_of([&] { probe_->forget_pilot(); })) {
      pilot_->log(LogLevel::kError,
                  "the attached loader failed to let go of the Pilot" + reason_suffix(*failed));
    }
  }
  void on_epoch_end(EpochSummary& summary) override {
    LoaderStats now = probe_->stats();
    summary.sections.set(loader_delta(now, at_epoch_start_));
    at_epoch_start_ = std::move(now);
  }
  void release() {
    pilot_->knobs().remove_prefix("loader.");
    pilot_->set_supply(nullptr);
  }

 private:
  Pilot* pilot_;
  LoaderProbe* probe_;
  LoaderStats at_epoch_start_;
};

}  // namespace

void attach_loader(Pilot& pilot, LoaderProbe* probe, std::vector<Knob> knobs) {
  if (pilot.mode() == Mode::kOff || probe == nullptr) return;
  if (auto* old = pilot.collector<LoaderCollector>()) {
    if (old->probe() == probe) return;
    pilot.log(LogLevel::kInfo,
              "a new loader was attached; the previous one is no longer reported or tuned");
    LoaderProbe* previous = old->probe();
    detach_loader(pilot, previous);
    if (const auto failed = failure_of([&] { previous->forget_pilot(); })) {
      pilot.log(LogLevel::kError,
                "the previous loader failed to let go of the Pilot" + reason_suffix(*failed));
    }
  }
  pilot.add_collector(std::make_shared<LoaderCollector>(pilot, probe), /*first=*/true);
  for (auto& k : knobs) pilot.knobs().add(std::move(k));
  pilot.set_supply([probe] {
    const LoaderStats s = probe->stats();
    // A stock loader's production time is its workers' elapsed time (stock_loader_meter.h): it
    // equals what the steps consumed, so it cannot cap a trial.
    if (s.production_estimated) return SupplySample{0, 0, 0};
    return SupplySample{s.produce_count, s.produce_ns, s.settings.workers};
  });
  pilot.knobs_changed();
}

void detach_loader(Pilot& pilot, LoaderProbe* probe) {
  auto* c = pilot.collector<LoaderCollector>();
  if (c == nullptr || c->probe() != probe) return;
  c->release();
  pilot.remove_collector(c);  // owned: destroyed here
}

}  // namespace torchpilot
