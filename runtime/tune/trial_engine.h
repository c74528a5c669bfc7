// Auto-tune: the trial engine runs the warm-up protocol (docs/architecture.md, "Auto-tune") over
// registered knobs. Each trial applies a setting at a step boundary, lets it settle, measures a
// window of steps (at least measure_steps and min_window_ms) and compares its throughput (samples
// over the window's time) with the incumbent's; the candidate must win by noise_margin, raised to
// the windows' combined relative standard error (capped at 10%) when the steps vary more. When the
// policy has nothing more to try, or the next trial would exceed the warm-up budget (warmup_steps
// or warmup_seconds, whichever is larger), the best setting is applied and the decision recorded.
// Confirmation: before that, the best few settings (autotune.confirm_settings, those within 15%
// of the best) are measured again in autotune.confirm_rounds interleaved rounds, each round in a
// rotated order, while the budget allows (the search stops early enough to leave room for one
// round), and the best median of each setting's measurements wins. Windows vary by +-10% run to run
// on a busy machine, and the best of many single windows is mostly the luckiest (winner's curse);
// re-measuring the finalists alike reduces that bias. Thread-safety: training thread only (it calls
// knob setters between steps). Failure behaviour: a knob setter that throws fails that trial; the
// incumbent is restored. A hook that sees a trial's setting fail while it runs (an out-of-memory
// error in a step: hooks/ accumulation.h) fails it with fail_current_trial(). A trial whose memory
// peak (memory_probe) exceeds autotune.memory_headroom of the device's capacity fails at its
// window's end.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/knobs.h"
#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/core/tuning.h"

namespace torchpilot {

class TrialEngine {
 public:
  TrialEngine(KnobRegistry& knobs, std::unique_ptr<TuningPolicy> policy, AutotuneConfig config);

  // Called with each finished step, in order.
  void on_step(const StepRecord& record);

  bool finished() const { return decision_.has_value(); }
  // Ends the search now with the best setting so far applied (used after an internal error).
  void abandon(const std::string& reason) {
    if (!finished()) conclude(reason);
  }
  // A trial's setting is on (from the first step after knobs were found until the decision).
  bool trial_running() const { return started_ && !finished(); }
  // The running trial's setting failed while it ran (out of memory in a step). Alone: the trial
  // is recorded as failed now, the incumbent is restored (its setter is called before this
  // returns, so the caller can redo its work under it) and the next trial starts once that step
  // has ended (the rerun is not measured; a failure within it is not a trial's); when the failed
  // trial is the incumbent itself (the baseline), the policy's next proposal is applied instead.
  // With an agreement: this rank goes back to the incumbent for the rest of the window and the
  // trial fails on every rank when the windows are combined (the same as a setter failure).
  // Returns false when no trial is running (nothing was changed).
  bool fail_current_trial(const std::string& reason);
  const std::optional<TuningDecision>& decision() const { return decision_; }
  const std::vector<TrialResult>& trials() const { return trials_; }

  // Called after each trial is measured (for logging); `kept` says whether it became incumbent.
  std::function<void(const TrialResult& trial, bool kept)> on_trial;
  // Optional: the producer's cumulative counters (a loader's batches), read at the start and end
  // of each measured window to measure its capacity (TrialResult::supply_capacity).
  using SupplySample = torchpilot::SupplySample;
  std::function<SupplySample()> supply_probe;
  // Optional: several ranks tune together (rank_exchange.h). Each window then ends after a count
  // of steps (measure_steps, extended by agreed rounds while the slowest rank's window is shorter
  // than min_window_ms), the ranks' windows are combined (the slowest rank governs), the time
  // budget is the slowest rank's, and a setter that throws fails the trial on every rank after
  // its window. No agreement (a rank missing): the starting settings are kept.
  TrialAgreement agreement;
  // Optional: the device memory each trial used (its peak, from the allocator). Without it, or
  // when it reads nothing, trials are judged by throughput alone.
  MemoryProbe memory_probe;

 private:
  void next_trial();
  void read_memory_peak(TrialResult& t);
  void start_trial(const Setting& setting, bool confirmation = false);
  void begin_settling(int extra = 0);
  // `like`: the trial whose step time the next one will have (a confirmation re-measures a known
  // setting); otherwise the last measured trial's. `reserved`: trials of that cost to leave room
  // for after it.
  bool budget_allows_another_trial(const TrialResult* like = nullptr, int reserved = 0) const;
  std::string budget_reason() const;
  // Confirmation (see the top of this file).
  bool begin_confirmation(const std::string& reason);  // false: fewer than 2 finalists, or no room
  void next_confirmation();
  void drop_finalist(const Setting& setting);  // its re-measurement failed
  size_t safe_trial_excluding(const Setting& setting) const;
  size_t latest_measured(const Setting& setting) const;  // its last non-failed trial
  // The median of its non-failed trials; rounds >= 0: of its re-measurements, only those of the
  // first `rounds` rounds.
  double score_of(const Setting& setting, int rounds = -1) const;
  void decide_confirmation();
  bool ever_failed(const Setting& setting) const;  // one of its trials failed
  size_t confirmations_started() const;            // re-measurements begun (failed ones too)
  void begin_window();
  void finish_trial();
  void conclude(const std::string& reason);
  bool agree_on(TrialResult& t);  // false: the window goes on, or the search ended
  bool better(const TrialResult& candidate, const TrialResult& incumbent) const;

  static constexpr double kMaxNoiseMargin = 0.10;
  static constexpr int64_t kMaxRounds = 8;       // window extensions per trial, with an agreement
  static constexpr int64_t kMinSupplyUnits = 3;  // fewer units produced: capacity not measurable

  KnobRegistry& knobs_;
  std::unique_ptr<TuningPolicy> policy_;
  AutotuneConfig config_;
  bool started_ = false;
  int64_t steps_without_knobs_ = 0;
  bool samples_reported_ = false;
  int64_t first_step_ = 0;
  int64_t last_step_ = 0;
  int settle_left_ = 0;
  bool resume_after_step_ = false;  // a trial failed mid-step: the next trial waits for its end
  std::vector<Nanos> window_ns_;
  Nanos window_wait_ns_ = 0;
  Nanos window_total_ns_ = 0;
  Nanos first_begin_ns_ = 0;
  Nanos last_end_ns_ = 0;
  std::optional<SupplySample> window_supply_start_;
  std::vector<int64_t> window_samples_;
  Setting current_;
  std::vector<TrialResult> trials_;
  size_t incumbent_ = 0;
  std::optional<TuningDecision> decision_;
  // With an agreement: the window's length in steps, its extension round, this rank's setter
  // failure in the current trial, the agreed elapsed time.
  int64_t window_target_ = 0;
  int64_t round_ = 0;
  std::string local_failure_;
  Nanos agreed_elapsed_ns_ = -1;
  // Confirmation: the finalists still in (by rank; a failed re-measurement drops one), how many
  // there were, the re-measurements in order (rounds, each rotated) and the next one, whether the
  // budget cut them short, why the search ended, the winner's score.
  bool confirming_ = false;
  std::vector<Setting> finalists_;
  size_t confirm_k_ = 0;
  std::vector<Setting> confirm_queue_;
  size_t confirm_next_ = 0;
  bool confirm_budget_cut_ = false;
  std::string search_end_reason_;
  std::optional<double> chosen_score_;
  std::map<size_t, int> confirm_round_;  // a re-measurement's trial index -> its round
};

}  // namespace torchpilot
