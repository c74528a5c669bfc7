// The Tuner every Pilot in mode autotune drives (core/tuning.h): the trial engine over the
// Pilot's knobs with the autotune policy (the loader's settings, then the micro-batch, then
// activation offloading). The engine is made at the first step, so that knobs registered before
// it (loaders, Accumulation, GradSync) are all searched. The registration runs at static
// initialization; the anchor below is named on the link line (CMake, torchpilot_core) so that a
// static library does not drop this object.
#include <memory>
#include <optional>
#include <string>

#include "torchpilot/runtime/core/anchor.h"
#include "torchpilot/runtime/core/tuning.h"
#include "torchpilot/runtime/memory/batch_policy.h"
#include "torchpilot/runtime/tune/trial_engine.h"

namespace torchpilot {
namespace {

class EngineTuner final : public Tuner {
 public:
  explicit EngineTuner(TunerHost& host) : host_(host) {}

  void on_step(const StepRecord& record) override {
    if (!engine_) start();
    engine_->on_step(record);
    if (engine_->finished()) publish_decision();
  }
  bool finished() const override { return engine_ && engine_->finished(); }
  const std::optional<TuningDecision>& decision() const override {
    static const std::optional<TuningDecision> none;
    return engine_ ? engine_->decision() : none;
  }
  void abandon(const std::string& reason) override {
    if (engine_) engine_->abandon(reason);  // applies the best setting so far
  }
  bool fail_trial(const std::string& reason) override {
    if (!engine_ || engine_->finished()) return false;
    const bool failed = engine_->fail_current_trial(reason);
    if (engine_->finished()) publish_decision();
    return failed;
  }
  void set_memory_probe(MemoryProbe probe) override {
    memory_probe_ = std::move(probe);
    if (engine_ && !engine_->finished()) engine_->memory_probe = memory_probe_;
  }
  void set_agreement(TrialAgreement agreement) override {
    agreement_ = std::move(agreement);
    if (engine_ && !engine_->finished()) engine_->agreement = agreement_;
  }
  void knobs_changed() override {
    if (!engine_) return;
    if (!engine_->finished()) {
      engine_.reset();  // a search over other knobs means nothing now: start afresh
    } else if (engine_->decision() && !engine_->decision()->trials.empty()) {
      // Tuning is over: the new knobs get the decided setting.
      try {
        host_.knobs().apply(engine_->decision()->chosen);
      } catch (const std::exception& e) {
        host_.log(
            LogLevel::kWarn,
            std::string("could not apply the tuned loader setting to the new loader: ") + e.what());
      }
    }
  }

 private:
  void start() {
    const AutotuneConfig& config = host_.config().autotune;
    engine_ = std::make_unique<TrialEngine>(host_.knobs(), make_autotune_policy(config), config);
    engine_->agreement = agreement_;
    engine_->memory_probe = memory_probe_;
    engine_->on_trial = [this](const TrialResult& t, bool kept) { host_.publish_trial(t, kept); };
    engine_->supply_probe = [this] { return host_.supply(); };
  }
  void publish_decision() {
    const TuningDecision& d = *engine_->decision();
    if (d.trials.empty()) {
      if (!warned_nothing_to_tune_) {
        warned_nothing_to_tune_ = true;
        host_.log(LogLevel::kWarn, "autotune: nothing to tune (" + d.reason +
                                       "); attach a torchpilot::TunableLoader or a "
                                       "torchpilot::Accumulation");
      }
      return;
    }
    host_.publish_decision(d);
  }

  TunerHost& host_;
  std::unique_ptr<TrialEngine> engine_;
  TrialAgreement agreement_;
  MemoryProbe memory_probe_;
  bool warned_nothing_to_tune_ = false;
};

std::unique_ptr<Tuner> make_tuner(TunerHost& host) { return std::make_unique<EngineTuner>(host); }

}  // namespace

TORCHPILOT_REGISTRATION(tune) { register_tuner(&make_tuner); }

}  // namespace torchpilot
