#include "torchpilot/advisors/loader/data_starvation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "torchpilot/advisors/core/advice_text.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/advisors/core/gain_models.h"
#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/loader/loader_model.h"

namespace torchpilot {
namespace {

// Below this share of the step spent computing, the compute time is too small to size from.
constexpr double kMinComputeShare = 0.01;

using detail::num;

// The step's own work per step, ms: the median step less its wait where known, over the
// ordinary steps where a window ran (a short epoch's first step, a trace window's steps and its
// release would otherwise size the workers), else the mean step less the mean wait.
double compute_ms_of(const EpochSummary& s) { return gains::own_work_seconds(s) * 1e3; }

// The loader model's estimate for an epoch with production counters.
WorkerEstimate estimate_of(const LoaderStats& l, double compute_ms, bool compute_known) {
  const double batch_ms = static_cast<double>(l.produce_ns) / 1e6 / l.produce_count;
  const double cpu_share = fraction(l.produce_cpu_ns, l.produce_ns);
  const int cpus = std::max(1, l.max_workers);
  return estimate_workers(compute_known ? batch_ms / compute_ms : cpus, cpu_share, cpus);
}

// The count the advice names: what is needed (at most the CPUs when CPU-bound), else the current
// count when workers are not the problem.
int advised_count(const WorkerEstimate& w, int workers) {
  return w.needed > workers ? std::max(1, w.useful) : workers;
}

bool compute_known_of(const EpochSummary& s, double compute_ms) {
  const double step_ms = static_cast<double>(s.wall_ns) / 1e6 / s.steps;
  return compute_ms > kMinComputeShare * step_ms;
}

}  // namespace

int advised_workers(const EpochSummary& s) {
  const LoaderStats* l = s.sections.get<LoaderStats>();
  if (l == nullptr || l->produce_count == 0 || s.steps == 0) return 0;
  const double compute_ms = compute_ms_of(s);
  const WorkerEstimate w = estimate_of(*l, compute_ms, compute_known_of(s, compute_ms));
  return advised_count(w, l->settings.workers);
}

std::optional<gains::StarvationGain> advised_starvation_gain(const EpochSummary& s) {
  return gains::starvation_gain(s, advised_workers(s));
}

std::optional<Advice> advise_data_starvation(const EpochSummary& s, const AdvisorsConfig& config) {
  if (s.steps == 0) return std::nullopt;
  // The mean wait of the steps the step's own work is the median of.
  const double wait_ms = gains::mean_wait_seconds(s) * 1e3;
  // The share of a steady step (its median own work plus the mean wait): one slow first step (a
  // warm-up of 0.97 s in a 40-step epoch of 3.5 ms steps) or a trace window's steps otherwise
  // dilute the wait below the threshold (it did for pytorch/examples' MNIST trainer on an H200).
  // Where the GPU's step is the longer (it runs queued work through the waits), that one.
  const double starved_ms = gains::starvation_step_seconds(s) * 1e3;
  const bool gpu_longer = starved_ms > compute_ms_of(s) + wait_ms;
  const double steady_ms = s.compute_p50_ns > 0 ? starved_ms : 0.0;
  const double f = std::max(s.data_wait_fraction, steady_ms > 0 ? wait_ms / steady_ms : 0.0);
  if (f <= config.data_starvation.threshold) return std::nullopt;

  Advice a;
  a.id = "data_starvation";
  a.severity = f >= config.data_starvation.high_severity ? Severity::kHigh : Severity::kWarning;
  const double step_ms = static_cast<double>(s.wall_ns) / 1e6 / s.steps;
  // When (nearly) all of a step is waiting, the compute time is not known well enough to size
  // workers or a gain from it.
  const double compute_ms = compute_ms_of(s);
  const bool compute_known = compute_known_of(s, compute_ms);
  const bool steady_share = f > s.data_wait_fraction;
  a.finding =
      "the training thread waited for data " + num(100 * f) + "% of step time (" +
      num(steady_share ? wait_ms : static_cast<double>(s.data_wait_ns) / 1e6 / s.steps, "%.2f") +
      " ms of a " + num(steady_share ? steady_ms : step_ms, "%.2f") + " ms " +
      (!steady_share ? "step"
       : gpu_longer  ? "steady step: the GPU's median step, longer than the host's"
                     : "steady step: the median step's own work plus the mean wait") +
      "; threshold " + num(100 * config.data_starvation.threshold) + "%)";
  a.evidence = {
      {"data_wait_fraction", s.data_wait_fraction, "fraction"},
      {"data_wait_share_of_steady_step", steady_ms > 0 ? wait_ms / steady_ms : 0.0, "fraction"},
      {"data_wait_per_step", wait_ms, "ms"},
      {"step_time", step_ms, "ms"},
      {"threshold", config.data_starvation.threshold, "fraction"}};
  // Removing the wait entirely turns a step of `step` into one of `compute`.
  a.expected_gain = compute_known ? f / (1.0 - f) : 0.0;
  a.gain_estimated = true;

  const LoaderStats* counters = s.sections.get<LoaderStats>();
  if (counters == nullptr || counters->produce_count == 0) {
    const std::string tunable =
        "torchpilot::TunableLoader measures how long a batch takes to produce and, with mode: "
        "autotune, picks workers and prefetch itself";
    if (counters == nullptr || !counters->settings_known) {
      a.cause =
          "the loader's settings and production time are not visible (no loader attached, "
          "or one whose options cannot be read)";
      a.action = "check the loader's worker count against the CPUs; " + tunable;
      return a;
    }
    // A watched stock loader: its own settings, and why more workers would (or would not) help.
    const LoaderStats& l = *counters;
    const int workers = l.settings.workers;
    a.evidence.push_back({"workers", static_cast<double>(workers), "threads"});
    a.evidence.push_back({"cpus_available", static_cast<double>(l.max_workers), "cpus"});
    if (workers == 0) {
      a.cause =
          "the loader has workers 0: batches are loaded on the training thread, so the step "
          "waits for each one";
      a.action =
          "load in worker threads (DataLoaderOptions().workers(n)) so batches are produced "
          "while the step computes; " +
          tunable;
    } else {
      a.cause = "the loader has " + std::to_string(workers) + " workers" +
                (l.max_jobs >= 0 ? " and queues " + std::to_string(l.max_jobs) + " jobs ahead"
                                 : std::string()) +
                ", and still no batch was ready: producing a batch takes its workers longer than "
                "the step (how much longer is not visible from a stock loader)";
      // Without the production counters (a CPU clock that cannot be read) it is not known
      // whether the workers use the CPUs or wait on I/O: waiting workers leave cores free.
      a.action = "more workers help if producing a batch waits on I/O or has cores to spare (" +
                 std::to_string(l.max_workers) + " CPUs, " + std::to_string(workers) +
                 " workers); if the workers keep the CPUs busy, make batches cheaper to produce "
                 "(decode less, cache); " +
                 tunable;
    }
    return a;
  }
  const LoaderStats& l = *counters;
  const double batch_ms = static_cast<double>(l.produce_ns) / 1e6 / l.produce_count;
  // Share of production time spent on the CPU; the rest is waiting (disk, network, locks).
  const double cpu_share = fraction(l.produce_cpu_ns, l.produce_ns);
  const int cpus = std::max(1, l.max_workers);
  // Workers needed so that a batch is ready every compute_ms (all CPUs when that is unknown): the
  // model the loader's tuning policy sizes its first trial with (loader_model.h).
  const WorkerEstimate w = estimate_of(l, compute_ms, compute_known);
  const bool cpu_bound = w.cpu_bound;
  const int needed = w.needed;
  const int useful = w.useful;
  const int workers = l.settings.workers;
  const int advised = advised_count(w, workers);
  // A stock loader's knobs are its DataLoaderOptions; a TunableLoader's, its own.
  const bool stock = !l.tunable;
  auto workers_call = [&](int n) {
    return stock ? " (DataLoaderOptions().workers(" + std::to_string(n) + "))" : std::string();
  };
  a.evidence.push_back({"batch_produce_time", batch_ms, "ms"});
  a.evidence.push_back({"batch_produce_cpu_share", cpu_share, "fraction"});
  a.evidence.push_back({"compute_time_per_step", compute_ms, "ms"});
  a.evidence.push_back({"workers", static_cast<double>(workers), "threads"});
  a.evidence.push_back({"workers_needed_estimate", static_cast<double>(needed), "threads"});
  a.evidence.push_back({"cpus_available", static_cast<double>(cpus), "cpus"});
  const std::string tune_hint =
      s.tuned ? " (auto-tune already chose the loader settings: what remains needs more than them)"
      : l.tunable ? " (mode: autotune picks this during warm-up, starting from this count)"
                  : " (torchpilot::TunableLoader with mode: autotune picks this during warm-up)";
  // The worker count the action names (the current count when workers are not the problem).
  a.evidence.push_back({"workers_advised", static_cast<double>(advised), "threads"});
  // A stock loader with workers: the batch time is their elapsed time (they are busy while the
  // step waits) and the CPU share an upper bound (stock_loader_meter.h).
  const std::string production =
      (l.production_estimated ? "one batch takes about " : "one batch takes ") +
      num(batch_ms, "%.2f") + " ms to produce (" + (l.production_estimated ? "at most " : "") +
      num(100 * cpu_share, "%.0f") + "% of it on the CPU" +
      (l.production_estimated ? ": the process's CPU time less the training thread's" : "") + ")";
  if (workers == 0) {
    a.cause = "batches are loaded on the training thread (workers = 0): " + production +
              " and the step waits for it";
    a.action = "load in " + std::to_string(std::max(1, useful)) + " worker threads" +
               workers_call(std::max(1, useful)) + tune_hint;
  } else if (needed > workers && cpu_bound && needed > cpus) {
    a.cause = "loading is CPU-bound: " + production + ", the step computes for " +
              num(compute_ms, "%.2f") + " ms, so " + std::to_string(needed) +
              " workers would be needed but only " + std::to_string(cpus) + " CPUs are available";
    a.action = "use " + std::to_string(cpus) + " workers" + workers_call(cpus) +
               " and make loading cheaper: decode at lower resolution, cache decoded "
               "samples, or move augmentation to the GPU" +
               tune_hint;
  } else if (needed > workers) {
    a.cause = "too few workers: " + production + ", so " + std::to_string(workers) +
              " workers deliver one every " + num(batch_ms / workers, "%.2f") +
              " ms while the step computes in " + num(compute_ms, "%.2f") + " ms";
    a.action = "use about " + std::to_string(useful) + " workers" + workers_call(useful) +
               (cpu_bound ? "" : " (loading mostly waits, so more workers than CPUs can help)") +
               tune_hint;
  } else {
    a.cause = "workers keep up on average (" + std::to_string(workers) + " deliver a batch every " +
              num(batch_ms / workers, "%.2f") + " ms) but the queue still runs dry: prefetch " +
              std::to_string(l.settings.prefetch) +
              " batches per worker is too shallow for the variation in batch time";
    a.action = stock ? "queue more jobs ahead (DataLoaderOptions().max_jobs(" +
                           std::to_string(2 * std::max<int64_t>(l.max_jobs, workers)) + "))" +
                           tune_hint
                     : "prefetch deeper (e.g. " + std::to_string(l.settings.prefetch * 2) +
                           " batches per worker)" + tune_hint;
  }
  // LibTorch's intra-op teams (OpenMP) and busy workers share the cores: the training thread's
  // team waits at each parallel region for its threads the workers displaced, and each worker
  // starts a team of its own. On an H200 (16 cores, 16 intra-op threads) 2 stock workers gained
  // +23% (+35% with one intra-op thread set in each worker alone), and +338% with
  // OMP_NUM_THREADS=1, which torch::set_num_threads(1) on the training thread before the loader
  // is made amounts to (it sets the count threads started later take).
  if (stock && advised > 0 && l.intra_op_threads > 1) {
    a.action +=
        "; and call torch::set_num_threads(1) on the training thread before making the "
        "loader (or run with OMP_NUM_THREADS=1): with " +
        std::to_string(l.intra_op_threads) +
        " intra-op threads the training thread's and each worker's tensor ops run on "
        "teams of that many, " +
        std::to_string((advised + 1) * l.intra_op_threads) + " threads on " + std::to_string(cpus) +
        " CPUs";
    a.evidence.push_back({"intra_op_threads", static_cast<double>(l.intra_op_threads), "threads"});
  }
  if (cpu_bound && needed > cpus && workers == 0) {
    a.action += "; even then loading is CPU-bound: make it cheaper";
  }
  // Gain: bounded by what the machine's cores deliver (gain_models.h): every core but the
  // training thread's producing, a batch every (CPU time per batch / usable cores) at best.
  if (compute_known) {
    if (const auto m = advised_starvation_gain(s)) {
      a.expected_gain = m->gain;
      a.evidence.push_back({"usable_workers", static_cast<double>(m->usable_workers), "threads"});
      a.evidence.push_back({"workers_estimated_for", static_cast<double>(m->workers), "threads"});
      a.evidence.push_back({"fastest_delivery_per_batch", m->delivery_s * 1e3, "ms"});
      a.evidence.push_back({"predicted_step_time", m->new_step_s * 1e3, "ms"});
      a.action +=
          "; estimated: with " + std::to_string(m->workers) +
          (m->workers == 1 ? " worker" : " workers") + " on at most " +
          std::to_string(m->usable_workers) + (m->usable_workers == 1 ? " core" : " cores") +
          ", a batch is ready every " + num(m->delivery_s * 1e3, "%.2f") + " ms at best, so a " +
          num(m->step_s * 1e3, "%.2f") +
          (m->gpu_s > 0 ? " ms step (the GPU's, which runs queued work through the waits: only "
                          "its idle in them goes) becomes "
                        : " ms step (the median step's own work plus the mean wait) becomes ") +
          num(m->new_step_s * 1e3, "%.2f") + " ms";
      a.evidence.push_back({"steady_step_time", m->step_s * 1e3, "ms"});
    }
  }
  if (l.pin_memory_available && !l.settings.pin_memory) {
    a.cause += "; batches are in pageable memory, so host-to-device copies block";
    a.action += "; pin memory (loader pin_memory) so copies run asynchronously";
  }
  return a;
}

}  // namespace torchpilot
