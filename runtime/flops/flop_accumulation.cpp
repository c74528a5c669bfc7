// The FLOP tallies, sums of counts, the epoch accumulator and a step's FLOP fields
// (flop_accumulation.h).
#include "torchpilot/runtime/flops/flop_accumulation.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

namespace torchpilot {

namespace {

constexpr size_t kP = static_cast<size_t>(kMathPrecisions);

size_t idx(MathPrecision p) { return static_cast<size_t>(p); }

}  // namespace

// ---- tallies ------------------------------------------------------------------------------------

void FlopTally::add(std::string_view op, OpKind kind, MathPrecision precision, double flops,
                    bool recompute, std::string_view module) {
  if (!(flops >= 0)) return;
  hardware_[idx(precision)] += flops;
  if (recompute) return;
  model_[idx(precision)] += flops;
  auto m = modules_.find(module);
  if (m == modules_.end()) m = modules_.emplace(std::string(module), Sum{}).first;
  m->second.model += flops;
  m->second.calls += 1;
  Sum& s = ops_[{std::string(op), precision}];
  s.model += flops;
  s.calls += 1;
  if (kind == OpKind::kAttention || kind == OpKind::kAttentionBackward) fused_ += flops;
}

void FlopTally::add_attention(const AttentionDelta& d) {
  attention_.unfused_flops += d.unfused_flops;
  attention_.instances += d.instances;
  attention_.math_fallback += d.math_fallback;
  attention_.traffic_bytes += d.traffic_bytes;
}

void FlopTally::clear() { *this = FlopTally(); }

StepFlops FlopTally::per_step(int64_t steps) const {
  StepFlops s;
  const double n = steps > 0 ? static_cast<double>(steps) : 1.0;
  for (size_t i = 0; i < kP; ++i) {
    s.model_by_precision[i] = model_[i] / n;
    s.hardware_by_precision[i] = hardware_[i] / n;
    s.model_flops += s.model_by_precision[i];
    s.hardware_flops += s.hardware_by_precision[i];
  }
  for (const auto& [key, sum] : ops_) {
    s.ops.push_back({key.first, key.second, sum.model / n, sum.calls / n});
  }
  for (const auto& [name, sum] : modules_) {
    s.modules.push_back({name, MathPrecision::kOther, sum.model / n, sum.calls / n});
  }
  std::stable_sort(s.modules.begin(), s.modules.end(), [](const OpFlops& a, const OpFlops& b) {
    return a.flops_per_step > b.flops_per_step;
  });
  std::stable_sort(s.ops.begin(), s.ops.end(), [](const OpFlops& a, const OpFlops& b) {
    return a.flops_per_step > b.flops_per_step;
  });
  s.unfused_attention_flops = attention_.unfused_flops / n;
  s.unfused_attention = attention_.instances / n;
  s.sdpa_math_fallback = attention_.math_fallback / n;
  s.unfused_attention_traffic_bytes = attention_.traffic_bytes / n;
  s.fused_attention_flops = fused_ / n;
  s.unparsed_calls = static_cast<int64_t>(std::ceil(static_cast<double>(unparsed_) / n));
  return s;
}

void StepFlopsSum::add(const StepFlops& s, int64_t times) {
  if (times <= 0) return;
  const auto n = static_cast<double>(times);
  steps_ += times;
  sum_.model_flops += n * s.model_flops;
  sum_.hardware_flops += n * s.hardware_flops;
  for (size_t i = 0; i < kP; ++i) {
    sum_.model_by_precision[i] += n * s.model_by_precision[i];
    sum_.hardware_by_precision[i] += n * s.hardware_by_precision[i];
  }
  sum_.unfused_attention_flops += n * s.unfused_attention_flops;
  sum_.unfused_attention += times * s.unfused_attention;
  sum_.sdpa_math_fallback += times * s.sdpa_math_fallback;
  sum_.unfused_attention_traffic_bytes += n * s.unfused_attention_traffic_bytes;
  sum_.fused_attention_flops += n * s.fused_attention_flops;
  sum_.unparsed_calls += times * s.unparsed_calls;
  if (s.id != 0) {
    Repeated& r = repeated_[s.id];
    if (r.steps == 0) {
      r.ops = s.ops;
      r.modules = s.modules;
    }
    r.steps += times;
    return;
  }
  merge(s.ops, s.modules, n, ops_, modules_);
}

void StepFlopsSum::merge(const std::vector<OpFlops>& ops, const std::vector<OpFlops>& modules,
                         double times,
                         std::map<std::pair<std::string, MathPrecision>, OpFlops>& to_ops,
                         std::map<std::string, OpFlops>& to_modules) const {
  for (const OpFlops& o : ops) {
    OpFlops& t = to_ops[{o.op, o.precision}];
    t.op = o.op;
    t.precision = o.precision;
    t.flops_per_step += times * o.flops_per_step;
    t.calls_per_step += times * o.calls_per_step;
  }
  for (const OpFlops& o : modules) {
    OpFlops& t = to_modules[o.op];
    t.op = o.op;
    t.flops_per_step += times * o.flops_per_step;
    t.calls_per_step += times * o.calls_per_step;
  }
}

StepFlops StepFlopsSum::mean() const {
  StepFlops m;
  if (steps_ == 0) return m;
  const double n = static_cast<double>(steps_);
  m.model_flops = sum_.model_flops / n;
  m.hardware_flops = sum_.hardware_flops / n;
  for (size_t i = 0; i < kP; ++i) {
    m.model_by_precision[i] = sum_.model_by_precision[i] / n;
    m.hardware_by_precision[i] = sum_.hardware_by_precision[i] / n;
  }
  m.unfused_attention_flops = sum_.unfused_attention_flops / n;
  m.unfused_attention = sum_.unfused_attention / n;
  m.sdpa_math_fallback = sum_.sdpa_math_fallback / n;
  m.unfused_attention_traffic_bytes = sum_.unfused_attention_traffic_bytes / n;
  m.fused_attention_flops = sum_.fused_attention_flops / n;
  m.unparsed_calls = static_cast<int64_t>(std::ceil(static_cast<double>(sum_.unparsed_calls) / n));
  auto ops = ops_;
  auto modules = modules_;
  for (const auto& [id, r] : repeated_) {
    merge(r.ops, r.modules, static_cast<double>(r.steps), ops, modules);
  }
  for (const auto& [key, o] : ops) {
    m.ops.push_back({o.op, o.precision, o.flops_per_step / n, o.calls_per_step / n});
  }
  std::stable_sort(m.ops.begin(), m.ops.end(), [](const OpFlops& a, const OpFlops& b) {
    return a.flops_per_step > b.flops_per_step;
  });
  for (const auto& [name, o] : modules) {
    m.modules.push_back({o.op, MathPrecision::kOther, o.flops_per_step / n, o.calls_per_step / n});
  }
  std::stable_sort(m.modules.begin(), m.modules.end(), [](const OpFlops& a, const OpFlops& b) {
    return a.flops_per_step > b.flops_per_step;
  });
  return m;
}

// ---- epoch accumulator
// ----------------------------------------------------------------------------

void FlopEpochAccumulator::add_step(const StepFlops* count, double step_seconds, bool counted) {
  if (!counted && count != nullptr && count->id != 0 && count->id == run_id_) {
    ++run_steps_;
    run_seconds_ += step_seconds;
    return;
  }
  add_run();
  run_id_ = 0;
  if (counted) ++counted_steps_;
  if (count == nullptr) return;
  if (!counted && count->id != 0) {
    // The next steps with this count only count themselves (add_run() adds them).
    run_id_ = count->id;
    run_count_ = StepFlops();
    run_count_.id = count->id;
    run_count_.model_flops = count->model_flops;
    run_count_.hardware_flops = count->hardware_flops;
    run_count_.model_by_precision = count->model_by_precision;
    run_count_.hardware_by_precision = count->hardware_by_precision;
    run_count_.unfused_attention_flops = count->unfused_attention_flops;
    run_count_.unfused_attention = count->unfused_attention;
    run_count_.sdpa_math_fallback = count->sdpa_math_fallback;
    run_count_.unfused_attention_traffic_bytes = count->unfused_attention_traffic_bytes;
    run_count_.fused_attention_flops = count->fused_attention_flops;
    run_count_.unparsed_calls = count->unparsed_calls;
  }
  known_.add(*count);
  known_seconds_ += step_seconds;
  PrecisionArray& model = counted ? window_model_ : steady_model_;
  PrecisionArray& hardware = counted ? window_hardware_ : steady_hardware_;
  for (size_t i = 0; i < kP; ++i) {
    model[i] += count->model_by_precision[i];
    hardware[i] += count->hardware_by_precision[i];
  }
  if (counted) {
    window_seconds_ += step_seconds;
  } else {
    steady_seconds_ += step_seconds;
    ++steady_steps_;
  }
}

void FlopEpochAccumulator::add_run() {
  if (run_steps_ == 0) return;
  const StepFlops& c = run_count_;  // its op lists are the sum's already (by id)
  known_.add(c, run_steps_);
  known_seconds_ += run_seconds_;
  const auto n = static_cast<double>(run_steps_);
  for (size_t i = 0; i < kP; ++i) {
    steady_model_[i] += n * c.model_by_precision[i];
    steady_hardware_[i] += n * c.hardware_by_precision[i];
  }
  steady_seconds_ += run_seconds_;
  steady_steps_ += run_steps_;
  run_steps_ = 0;
  run_seconds_ = 0;
}

FlopEpochStats FlopEpochAccumulator::summarize(const DevicePeak& peak) {
  add_run();
  FlopEpochStats f;
  f.device = peak.device;
  f.counted_steps = counted_steps_;
  f.steps_with_count = known_.steps();
  const StepFlops m = known_.mean();
  f.model_flops_per_step = m.model_flops;
  f.hardware_flops_per_step = m.hardware_flops;
  for (size_t i = 0; i < kP; ++i) {
    f.model_flops_by_precision[i] = m.model_by_precision[i];
    f.hardware_flops_by_precision[i] = m.hardware_by_precision[i];
    f.peak_flops_by_precision[i] = peak.flops_per_s[i];
    f.datasheet_flops_by_precision[i] = peak.datasheet_flops_per_s[i];
  }
  f.dram_bytes_per_s = peak.dram_bytes_per_s;
  f.achieved_flops_per_s =
      known_seconds_ > 0 ? m.model_flops * static_cast<double>(known_.steps()) / known_seconds_ : 0;
  // Counted steps carry the callbacks' cost: MFU comes from the other steps where there are any.
  if (steady_steps_ > 0) {
    f.mfu = utilization(steady_model_, peak, steady_seconds_);
    f.hfu = utilization(steady_hardware_, peak, steady_seconds_);
    f.mfu_best_peak = utilization_at_best_peak(steady_model_, peak, steady_seconds_);
  } else if (known_.steps() > 0) {
    f.mfu = utilization(window_model_, peak, window_seconds_);
    f.hfu = utilization(window_hardware_, peak, window_seconds_);
    f.mfu_best_peak = utilization_at_best_peak(window_model_, peak, window_seconds_);
  }
  f.best_peak_precision = best_dense_precision(peak);
  f.dominant_precision = dominant_precision(m.model_by_precision);
  f.peak_flops_per_s = peak.flops_per_s[idx(f.dominant_precision)];
  if (!(f.peak_flops_per_s > 0)) f.peak_flops_per_s = kNotMeasured;
  if (peak.source == "config") {
    f.peak_source = "config";
  } else if (!peak.source.empty() && f.peak_flops_per_s > 0) {
    f.peak_source = peak.source + " " + to_string(f.dominant_precision) + " dense";
  }
  f.unfused_attention_flops_per_step = m.unfused_attention_flops;
  f.unfused_attention_per_step = std::llround(m.unfused_attention);
  f.sdpa_math_fallback_per_step = m.sdpa_math_fallback;
  f.unfused_attention_traffic_bytes_per_step = m.unfused_attention_traffic_bytes;
  f.fused_attention_flops_per_step = m.fused_attention_flops;
  f.unparsed_calls = m.unparsed_calls;
  f.top_ops.assign(m.ops.begin(),
                   m.ops.begin() + static_cast<std::ptrdiff_t>(std::min(m.ops.size(), kTopOps)));
  // Module attribution only where the model named modules (not just the unnamed rest).
  if (!(m.modules.size() == 1 && m.modules.front().op.empty())) {
    f.modules.assign(m.modules.begin(), m.modules.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                                m.modules.size(), kTopModules)));
  }
  return f;
}

void fill_step_flops(StepRecord& record, const StepFlops* count, const DevicePeak& peak) {
  StepMetrics& m = record.metrics;
  if (count == nullptr) {
    for (const char* name : {"model_flops", "hardware_flops", "mfu", "hfu"}) {
      m.set("flops", name, kNotMeasured);
    }
    return;
  }
  const double seconds = static_cast<double>(record.step_ns()) / 1e9;
  m.set("flops", "model_flops", count->model_flops);
  m.set("flops", "hardware_flops", count->hardware_flops);
  m.set("flops", "mfu", utilization(count->model_by_precision, peak, seconds));
  m.set("flops", "hfu", utilization(count->hardware_by_precision, peak, seconds));
}

}  // namespace torchpilot
