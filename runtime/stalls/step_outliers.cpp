#include "torchpilot/runtime/stalls/step_outliers.h"

#include <algorithm>
#include <map>
#include <vector>

#include "torchpilot/runtime/core/format.h"
#include "torchpilot/runtime/core/metrics.h"

namespace torchpilot {
namespace {

// Whether `step` lies within a step of anchor + k * period.
bool near_lattice(int64_t step, int64_t anchor, int64_t period) {
  const int64_t d = ((step - anchor) % period + period) % period;
  return d <= 1 || d >= period - 1;
}

}  // namespace

StallTracker::StallTracker(double factor) : factor_(factor) { recent_.reserve(kHistory); }

bool StallTracker::add(const StepRecord& r) {
  // torchpilot's own time (a window's start, an epoch end's work) is its cost, not a stall.
  const Nanos ns = std::max<Nanos>(0, r.step_ns() - r.own_ns);
  ++steps_;
  sums_.step_ns += r.step_ns();
  sums_.data_wait_ns += r.data_wait_ns;
  sums_.own_ns += r.own_ns;
  if (r.cpu_ns >= 0) {  // measured at some steps only (Pilot::end_step)
    sums_.cpu_ns += r.cpu_ns;
    ++cpu_steps_;
  }
  for (int i = 0; i < kMaxPhases; ++i) sums_.phase_ns[i] += r.phase_ns[i];

  const bool judged = recent_.size() >= kMinHistory && median_ns_ > 0;
  const bool outlier =
      judged && static_cast<double>(ns) > factor_ * static_cast<double>(median_ns_);
  note_tail(r, ns, outlier);
  if (outlier) {
    ++count_;
    if (outliers_.size() < kMaxEpochOutliers) {
      Step s;
      s.step = r.step;
      s.step_in_epoch = r.step_in_epoch;
      s.step_ns = r.step_ns();
      s.data_wait_ns = r.data_wait_ns;
      s.own_ns = r.own_ns;
      s.cpu_ns = r.cpu_ns;
      s.phase_ns = r.phase_ns;
      outliers_.push_back(s);
    }
    // A run of slow steps is one event. An epoch's first steps are its edge (a loader
    // restarting): they never make a period, but one on a period's lattice is a point of it.
    if (r.step != last_outlier_ + 1) {
      if (r.step_in_epoch >= kEdgeSteps) {
        note_outlier_start(r.step);
      } else {
        edge_starts_.push_back(r.step);
        if (edge_starts_.size() > kRecentOutliers) edge_starts_.pop_front();
      }
    }
    last_outlier_ = r.step;
    return true;  // outliers stay out of the median
  }
  if (recent_.size() < kHistory) {
    recent_.push_back(ns);
  } else {
    recent_[recent_next_] = ns;
    recent_next_ = (recent_next_ + 1) % kHistory;
  }
  // The median moves slowly: sorting every step would only cost the step.
  if (++since_refresh_ >= kRefreshSteps || median_ns_ == 0) {
    since_refresh_ = 0;
    if (recent_.size() >= kMinHistory) median_ns_ = torchpilot::median(recent_);
  }
  return false;
}

void StallTracker::note_tail(const StepRecord& r, Nanos ns, bool outlier) {
  // An epoch's first steps carry the loader's restart: neither tail nor baseline.
  if (period_ <= 0 || r.step_in_epoch < kEdgeSteps) return;
  const bool at = at_period(r.step);
  if (at && outlier) {
    since_stall_ = 0;  // a stall (or its second step): the tail counts from here
    return;
  }
  if (since_stall_ < 0) return;
  const int64_t d = ++since_stall_;
  const int64_t reach = std::min(kTailSteps, period_ / 2);
  if (d <= reach) {
    // Every step at this distance, slow or not: a slow step after a stall is part of its cost.
    after_ns_[static_cast<size_t>(d)] += ns;
    ++after_count_[static_cast<size_t>(d)];
  } else if (!outlier && !at) {
    far_ns_ += ns;
    ++far_count_;
  }
}

void StallTracker::add_probe(const StepRecord& r) {
  // The probe covers the steps at the period and the one after them: skip the rest cheaply.
  const bool look = r.at_period || after_period_;
  after_period_ = r.at_period;
  if (!look) return;
  const double probed = r.metrics.get("sync", "probed");
  if (!(probed > 0)) return;
  const double ms = r.metrics.get("sync", "ms");
  if (!measured(ms)) return;
  const auto sync_ns = static_cast<Nanos>(ms * 1e6);
  if (!outliers_.empty() && outliers_.back().step == r.step) {
    Step& s = outliers_.back();
    s.sync_ns = sync_ns;
    const double ops = r.metrics.get("sync", "ops");
    const double mb = r.metrics.get("sync", "d2h_mb");
    s.syncs = measured(ops) ? ops : 0;
    s.d2h_bytes = measured(mb) ? mb * 1e6 : 0;
  } else if (last_outlier_ != r.step) {
    ++probed_steps_;
    probed_sync_ns_ += sync_ns;
  }
}

void StallTracker::note_outlier_start(int64_t step) {
  starts_.push_back(step);
  if (starts_.size() > kRecentOutliers) starts_.pop_front();
  // The period: a lattice anchor + k * P (within a step) through the most recent events that
  // holds three of them at least, its own points between its first and last event (all of them
  // for three events, three quarters for more: a stall that recurs, not one that happened to
  // line up), and a good share of all recent events (half for three, 40% for more); the most
  // events wins, then the shorter period. Unrelated slow steps between the periodic ones (noise,
  // a trace window) do not hide the period; three random ones lining up among many do not make
  // one. A single slow step makes no period. Slow steps at an epoch's edge fill the lattice (a
  // stall every 40 steps whose every third one falls on an epoch's first step is every 40, not
  // every 120) but count neither as its three events nor in the share: the edges are periodic
  // themselves when every epoch's first step is slow.
  int64_t best_period = 0, best_anchor = 0, best_hits = 0;
  const auto n = static_cast<int64_t>(starts_.size());
  for (size_t i = 0; i < starts_.size(); ++i) {
    for (size_t j = i + 1; j < starts_.size(); ++j) {
      const int64_t p = starts_[j] - starts_[i];
      if (p <= 1) continue;
      const int64_t anchor = starts_[i];
      int64_t hits = 0, first = 0, last = 0;
      for (int64_t s : starts_) {
        if (!near_lattice(s, anchor, p)) continue;
        if (hits == 0) first = s;
        last = s;
        ++hits;
      }
      int64_t edge_hits = 0;
      for (int64_t s : edge_starts_) {
        if (s > first && s < last && near_lattice(s, anchor, p)) ++edge_hits;
      }
      const int64_t points = (last - first + p / 2) / p + 1;
      // Three events must fill their lattice; four or more may miss a quarter of it (a stall
      // that once stayed under the outlier factor). Three must be half the recent events.
      const int64_t on = hits + edge_hits;
      const bool filled = on >= points || (hits >= 4 && 4 * on >= 3 * points);
      const bool share = hits >= 4 ? 5 * hits >= 2 * n : 2 * hits >= n;
      const bool holds = hits >= 3 && filled && share;
      if (holds && (hits > best_hits || (hits == best_hits && p < best_period))) {
        best_hits = hits;
        best_period = p;
        best_anchor = anchor + (last - anchor + p / 2) / p * p;  // the lattice point, not `last`
      }
    }
  }
  // A rhythm of a few steps is no period (kMinPeriod), nor is a multiple of it: the finer lattice
  // beats it by holding more of the events, and where the gaps alternate (8, 9, 8, ...: a loader
  // whose batch takes a fraction of steps) and no fine lattice holds, the recent events' median
  // gap tells.
  std::vector<int64_t> gaps;
  for (size_t i = 1; i < starts_.size(); ++i) gaps.push_back(starts_[i] - starts_[i - 1]);
  const bool dense = !gaps.empty() && torchpilot::median(std::move(gaps)) < kMinPeriod;
  const bool rhythm = best_period > 0 && (best_period < kMinPeriod || dense);
  period_ = rhythm ? 0 : best_period;
  anchor_ = rhythm ? 0 : best_anchor;
}

void StallTracker::add_gpu_span(int64_t step, Nanos gpu_ns) {
  if (gpu_ns <= 0) return;
  for (auto it = outliers_.rbegin(); it != outliers_.rend(); ++it) {
    if (it->step == step) {
      it->gpu_ns = gpu_ns;
      return;
    }
    if (it->step < step) break;  // outliers_ is in step order
  }
  // Steps beside a stall are ordinary on the host but not on the GPU (the queue drains and
  // refills around it): left out of the ordinary spans.
  if (step == last_outlier_ + 1 || at_period(step)) return;
  if (gpu_recent_.size() < kHistory) {
    gpu_recent_.push_back(gpu_ns);
  } else {
    gpu_recent_[gpu_next_] = gpu_ns;
    gpu_next_ = (gpu_next_ + 1) % kHistory;
  }
}

bool StallTracker::at_period(int64_t step) const {
  return period_ > 0 && near_lattice(step, anchor_, period_);
}

OutlierStats StallTracker::summarize(const EpochSummary& e,
                                     const std::vector<std::string>& phase_names) {
  OutlierStats o;
  o.factor = factor_;
  o.median_ns = median_ns_;
  o.count = count_;
  o.period = period_;
  Step periodic;  // sums over the outliers analysed (the periodic ones, else the non-edge ones)
  int64_t analysed = 0;
  // Outliers at the period next to one another (a stall and the slow step after it, while the
  // GPU's queue refills) are one stall: counted once, their excess together.
  auto one_stall = [](int64_t& last, int64_t step) {
    const bool next = last >= 0 && step - last <= 2;
    last = step;
    return next;
  };
  int64_t last = -1;
  for (const Step& s : outliers_) {
    const Nanos excess = std::max<Nanos>(0, s.step_ns - s.own_ns - median_ns_);
    o.time_ns += s.step_ns;
    o.excess_ns += excess;
    if (s.step_in_epoch < kEdgeSteps) ++o.edge_count;
    if (o.steps.size() < OutlierStats::kListed) o.steps.push_back(s.step);
    const bool is_periodic = at_period(s.step) && s.step_in_epoch >= kEdgeSteps;
    if (is_periodic) {
      if (!one_stall(last, s.step)) ++o.periodic_count;
      o.periodic_excess_ns += excess;
    }
  }
  bool periodic_cpu_missing = false;
  for (const Step& s : outliers_) {
    const bool take = period_ > 0 ? at_period(s.step) && s.step_in_epoch >= kEdgeSteps
                                  : s.step_in_epoch >= kEdgeSteps;
    if (!take) continue;
    ++analysed;
    periodic.step_ns += s.step_ns;
    periodic.data_wait_ns += s.data_wait_ns;
    periodic.own_ns += s.own_ns;
    periodic.cpu_ns += std::max<Nanos>(0, s.cpu_ns);
    periodic_cpu_missing = periodic_cpu_missing || s.cpu_ns < 0;
    for (int i = 0; i < kMaxPhases; ++i) periodic.phase_ns[i] += s.phase_ns[i];
  }
  // The same excess in GPU time, from the periodic outliers whose GPU span has come.
  if (o.periodic_count > 0 && gpu_recent_.size() >= kMinHistory) {
    std::vector<Nanos> spans = gpu_recent_;
    std::nth_element(spans.begin(), spans.begin() + static_cast<std::ptrdiff_t>(spans.size() / 2),
                     spans.end());
    o.gpu_median_ns = spans[spans.size() / 2];
    Nanos gpu_excess = 0;
    last = -1;
    for (const Step& s : outliers_) {
      if (!at_period(s.step) || s.step_in_epoch < kEdgeSteps || s.gpu_ns < 0) continue;
      if (!one_stall(last, s.step)) ++o.gpu_timed;
      gpu_excess += std::max<Nanos>(0, s.gpu_ns - o.gpu_median_ns);
    }
    if (o.gpu_timed > 0) {
      o.periodic_gpu_excess_ns = static_cast<Nanos>(static_cast<double>(gpu_excess) *
                                                    static_cast<double>(o.periodic_count) /
                                                    static_cast<double>(o.gpu_timed));
    }
  }
  // The tail: distances after a stall whose mean step is above the far steps' mean.
  if (o.periodic_count > 0 && far_count_ >= kMinFarSteps) {
    const double baseline = static_cast<double>(far_ns_) / static_cast<double>(far_count_);
    o.tail_baseline_ns = static_cast<Nanos>(baseline);
    double per_stall = 0;
    for (size_t d = 1; d < after_ns_.size() && after_count_[d] > 0; ++d) {
      const double above =
          static_cast<double>(after_ns_[d]) / static_cast<double>(after_count_[d]) - baseline;
      if (above <= kTailMargin * baseline) break;  // back to the baseline
      per_stall += above;
      o.tail_steps = static_cast<int64_t>(d);
    }
    o.periodic_tail_excess_ns =
        static_cast<Nanos>(per_stall * static_cast<double>(o.periodic_count));
  }
  const Nanos wall = std::max<Nanos>(1, e.wall_ns);
  o.share = fraction(o.time_ns, wall);
  o.excess_share = fraction(o.excess_ns, wall);
  o.periodic_share = fraction(o.periodic_excess_ns, wall);

  // Excess over what the same number of the epoch's other steps take, part by part.
  const int64_t others = steps_ - count_;
  if (analysed > 0 && others > 0) {
    auto excess_of = [&](Nanos outliers_sum, Nanos all_sum, Nanos all_outliers_sum) {
      const double normal = static_cast<double>(all_sum - all_outliers_sum) / others;
      return static_cast<double>(outliers_sum) - normal * analysed;
    };
    Step all_outliers;
    int64_t cpu_outliers = 0;
    for (const Step& s : outliers_) {
      all_outliers.step_ns += s.step_ns;
      all_outliers.data_wait_ns += s.data_wait_ns;
      all_outliers.own_ns += s.own_ns;
      all_outliers.cpu_ns += std::max<Nanos>(0, s.cpu_ns);
      cpu_outliers += s.cpu_ns >= 0 ? 1 : 0;
      for (int i = 0; i < kMaxPhases; ++i) all_outliers.phase_ns[i] += s.phase_ns[i];
    }
    const double excess = excess_of(periodic.step_ns, sums_.step_ns, all_outliers.step_ns);
    if (excess > 0) {
      o.data_wait_share = std::clamp(
          excess_of(periodic.data_wait_ns, sums_.data_wait_ns, all_outliers.data_wait_ns) / excess,
          0.0, 1.0);
      o.own_share = std::clamp(
          excess_of(periodic.own_ns, sums_.own_ns, all_outliers.own_ns) / excess, 0.0, 1.0);
      double best = 0;
      for (size_t i = 0; i < phase_names.size() && i < static_cast<size_t>(kMaxPhases); ++i) {
        const double p =
            excess_of(periodic.phase_ns[i], sums_.phase_ns[i], all_outliers.phase_ns[i]) / excess;
        if (p > best) {
          best = p;
          o.phase = phase_names[i];
        }
      }
      if (!o.phase.empty()) o.phase_share = std::min(1.0, best);
      // The excess outside data waits: on the CPU, or blocked (I/O, a GPU sync, a lock)?
      const double waited = std::max(
          0.0, excess_of(periodic.data_wait_ns, sums_.data_wait_ns, all_outliers.data_wait_ns));
      // CPU time is measured at some steps (every stall at a known period, every step of a
      // slow trainer, a sample of the rest): the ordinary steps' mean is over those measured.
      const int64_t cpu_others = cpu_steps_ - cpu_outliers;
      if (!periodic_cpu_missing && cpu_others > 0 && excess - waited > 0) {
        const double normal = static_cast<double>(sums_.cpu_ns - all_outliers.cpu_ns) /
                              static_cast<double>(cpu_others);
        const double cpu_excess = static_cast<double>(periodic.cpu_ns) - normal * analysed;
        o.cpu_share = std::clamp(cpu_excess / (excess - waited), 0.0, 1.0);
      }
    }
  }
  // The probed stalls: their time in ops that wait for the GPU or copy to the host, above what
  // the ordinary steps probed beside them spend there.
  {
    const double baseline =
        probed_steps_ > 0 ? static_cast<double>(probed_sync_ns_) / probed_steps_ : 0.0;
    double sync = 0, excess = 0, syncs = 0, bytes = 0;
    last = -1;
    for (const Step& s : outliers_) {
      const bool take = period_ > 0 ? at_period(s.step) && s.step_in_epoch >= kEdgeSteps
                                    : s.step_in_epoch >= kEdgeSteps;
      if (!take || s.sync_ns < 0) continue;
      if (!one_stall(last, s.step)) ++o.probed;
      sync += static_cast<double>(s.sync_ns) - baseline;
      excess += static_cast<double>(std::max<Nanos>(0, s.step_ns - s.own_ns - median_ns_));
      syncs += s.syncs;
      bytes += s.d2h_bytes;
    }
    if (o.probed > 0) {
      if (excess > 0) o.sync_share = std::clamp(sync / excess, 0.0, 1.0);
      o.syncs_per_stall = syncs / static_cast<double>(o.probed);
      o.d2h_mb_per_stall = bytes / 1e6 / static_cast<double>(o.probed);
    }
  }
  outliers_.clear();
  count_ = 0;
  sums_ = Step();
  probed_steps_ = 0;
  probed_sync_ns_ = 0;
  after_ns_.fill(0);
  after_count_.fill(0);
  far_ns_ = 0;
  far_count_ = 0;
  steps_ = 0;
  cpu_steps_ = 0;
  return o;
}

std::string section_json(const OutlierStats& o) {
  using namespace detail;
  return dump(
      json{{"factor", o.factor},
           {"median_ms", ms(o.median_ns)},
           {"count", o.count},
           {"edge_count", o.edge_count},
           {"time_ms", ms(o.time_ns)},
           {"excess_ms", ms(o.excess_ns)},
           {"share", o.share},
           {"excess_share", o.excess_share},
           {"period", o.period},
           {"periodic_count", o.periodic_count},
           {"periodic_excess_ms", ms(o.periodic_excess_ns)},
           {"periodic_share", o.periodic_share},
           {"data_wait_share", number(o.data_wait_share)},
           {"own_share", number(o.own_share)},
           {"phase", o.phase},
           {"phase_share", number(o.phase_share)},
           {"cpu_share", number(o.cpu_share)},
           {"probed", o.probed},
           {"sync_share", number(o.sync_share)},
           {"syncs_per_stall", number(o.syncs_per_stall)},
           {"d2h_mb_per_stall", number(o.d2h_mb_per_stall)},
           {"gpu_timed", o.gpu_timed},
           {"gpu_median_ms", o.gpu_median_ns >= 0 ? json(ms(o.gpu_median_ns)) : json()},
           {"periodic_gpu_excess_ms",
            o.periodic_gpu_excess_ns >= 0 ? json(ms(o.periodic_gpu_excess_ns)) : json()},
           {"tail_steps", o.tail_steps},
           {"tail_baseline_ms", o.tail_baseline_ns >= 0 ? json(ms(o.tail_baseline_ns)) : json()},
           {"periodic_tail_excess_ms", ms(o.periodic_tail_excess_ns)},
           {"steps", o.steps}});
}

void section_text(const OutlierStats& o, const EpochSummary&, std::vector<std::string>& lines) {
  using namespace detail;
  if (o.count == 0) return;
  std::string line = "  outliers (> " + fmt_num(o.factor) + "x the median " + fmt_ms(o.median_ns) +
                     "): " + std::to_string(o.count) + " steps, " + fmt_pct(o.share) +
                     " of the epoch (" + fmt_pct(o.excess_share) + " above the median)";
  if (o.edge_count > 0) line += ", " + std::to_string(o.edge_count) + " at the epoch's start";
  if (o.period > 0) {
    line += "; every " + std::to_string(o.period) + " steps: " + std::to_string(o.periodic_count) +
            " this epoch, " + fmt_pct(o.periodic_share) + " of it";
  }
  if (o.probed > 0 && measured(o.sync_share)) {
    line += "; " + fmt_pct(o.sync_share) + " of their extra time waits for the GPU or copies to " +
            "the host (" + fmt_num(o.d2h_mb_per_stall) + " MB device-to-host per stall, " +
            std::to_string(o.probed) + " probed)";
  }
  if (o.periodic_gpu_excess_ns >= 0 && o.periodic_count > 0) {
    line += "; on the GPU " + fmt_ms(o.periodic_gpu_excess_ns / o.periodic_count) +
            " per stall above its median step " + fmt_ms(o.gpu_median_ns) + " (" +
            std::to_string(o.gpu_timed) + " timed)";
  }
  if (o.tail_steps > 0 && o.periodic_count > 0) {
    line += "; the " + std::to_string(o.tail_steps) + " steps after each run " +
            fmt_ms(o.periodic_tail_excess_ns / o.periodic_count) +
            " in all above the steps far from them (" + fmt_ms(o.tail_baseline_ns) + ")";
  }
  lines.push_back(line);
}

}  // namespace torchpilot
