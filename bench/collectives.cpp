// collectives: what observing collectives costs a data-parallel trainer, and what the always-on
// measure says of overlap (issue 11). The GPT example data-parallel (gpt_dist.h): --world-size
// ranks on this host, Gloo on the CPU or NCCL on CUDA (one GPU per rank), gradients averaged by
// torchpilot::GradSync.
//
// Configurations, each with a fresh Pilot per round (a Pilot's mode is fixed at construction):
//   off     - mode off: no Pilot work and no collective observer (torchpilot::Collectives with a
//             Pilot in mode off observes nothing);
//   advise  - the default configuration, windows only on request (none here), with
//             torchpilot::Collectives observing every collective and joining the ranks' summaries.
// Rounds alternate their order (off, advise; advise, off; ...); every rank runs the same sequence
// (their collectives must match). In a round a configuration runs --warmup steps, then --steps
// measured steps, the device synchronized at the window's edges; its figure is the mean step time.
// Reported by rank 0: the median per configuration over rounds, advise/off − 1 with the spread of
// the per-round ratios, and the advise runs' communication figures (communication, exposed,
// overlap per step, from the always-on measure). With --no-overlap the same for GradSync's
// all-reduce after backward. Written to --out (bench/runs/collectives-<machine>.json; baseline
// bench/baselines/collectives/<machine>.json).
//
// --suite full adds, in the same ranks and process (the two-GPU run, issue 12; "suite" in the
// JSON):
//   overlap   - interleaved rounds of GradSync's overlap on and off (advise mode): step time and
//   the
//               always-on communication figures, exposed_communication's estimated gain in the
//               no-overlap runs against the measured gain of overlap; then one run of each with a
//               detailed window over the measured steps (the window's communication and
//               exposed time from the NCCL kernels, beside the always-on figures of the same
//               steps); --suite overlap runs this part alone;
//   buckets   - interleaved rounds over --buckets (MiB): step time and the all-reduce's bus
//   bandwidth
//               against the link's peak;
//   autotune  - mode autotune from --autotune-start MiB with the bucket knob: every rank's decision
//               (step, setting) and the chosen size's throughput against the best of the grid;
//   straggler - rank --straggler-rank runs --straggler-ms of host work per step, every rank reading
//               its loss each step (as trainers that log it do): rank 0's straggler advice (rank,
//               cause) and the other ranks' wait per step against the planted delay.
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpt_cli.h"
#include "gpt_dist.h"
#include "gpt_trainer.h"
#include "harness.h"
#include "torchpilot/runtime/comm/comm_records.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/cost/cost.h"
#include "torchpilot/runtime/gpu/gpu_records.h"

namespace {

using bench::median;

using bench::Clock;
using nlohmann::json;

struct Args {
  gpt_example::TrainOptions train;
  int world = 2;
  int rounds = 9;
  int steps = 30;
  int warmup = 5;
  bool no_overlap = false;
  bool compare_observer = false;   // a third configuration: advise with comm.observe_nccl_ops
  std::string suite = "overhead";  // or "full"
  std::vector<int> buckets{4, 25, 100};
  int autotune_start = 25;
  int autotune_warmup = 120;
  int straggler_rank = 1;
  double straggler_ms = 20;
  bench::RunFlags run;  // --machine, --commit, --out
};

struct Run {
  double step_s = 0;
  double comm_ms = -1, exposed_ms = -1, overlap = -1;
  double busbw_gbps = -1, link_peak_gbps = -1;
  std::string link, method;
  int64_t gpu_timed_syncs = 0;
  // From a detailed window (the NCCL kernels), per traced step.
  int64_t traced_steps = 0;
  double window_comm_ms = -1, window_exposed_ms = -1;
  json advice = json::array();  // id, expected_gain
  json cost;                    // torchpilot's own cost (section "cost") of the measured epoch
  json ranks;                   // rank 0's section "ranks"
  json decision;                // autotune
};

struct RunOptions {
  torchpilot::Mode mode = torchpilot::Mode::kAdvise;
  int steps = 0;
  // A detailed window over every measured step: the always-on figures and the kernels' then cover
  // the same steps (a shorter window's end, a stall on one rank, inflates the other rank's
  // collectives in the steps after it, which only the always-on figures would count).
  bool window = false;
  bool read_loss_each_step = false;
  bool observe_nccl_ops = false;  // the RecordFunction observer on NCCL too (comm.observe_nccl_ops)
};

// Untraced steps after a window, in which its steps finish.
constexpr int kFinishSteps = 20;

// One Pilot over --warmup + steps steps; the figures of the measured steps' epoch.
Run run(gpt_example::Trainer& trainer, const Args& a, const RunOptions& o) {
  // The defaults; TORCHPILOT_* variables isolate a part's cost (e.g.
  // TORCHPILOT_COMM_ENABLED=false).
  torchpilot::Config c = torchpilot::Config::load();
  c.mode = o.mode;
  c.log.level = "warn";
  c.gpu.trace_first_step = 1000000000;  // no window: the always-on cost
  c.gpu.trace_anomaly_factor = 0;
  if (o.observe_nccl_ops) c.comm.observe_nccl_ops = true;
  if (o.window) {
    c.gpu.trace_first_step = a.warmup;
    c.gpu.trace_steps = o.steps > 0 ? o.steps : a.steps;
    c.gpu.trace_every_epochs = 0;  // no window in the steps that finish this one
    c.cost.budget = 1;             // the window is what is measured here
  }
  if (o.mode == torchpilot::Mode::kAutotune) {
    c.autotune.warmup_steps = a.autotune_warmup;
    c.autotune.warmup_seconds = 0;
  }
  const int steps = o.steps > 0 ? o.steps : a.steps;
  Run r;
  {
    torchpilot::Pilot pilot(c);
    auto train = [&](int n) {
      if (!o.read_loss_each_step) return trainer.train(pilot, n);
      for (int i = 0; i < n; ++i) {
        trainer.train(pilot, 1);
        (void)trainer.take_mean_loss();
      }
    };
    train(a.warmup);
    trainer.synchronize();
    pilot.end_epoch();  // the measured steps get an epoch of their own
    const auto t0 = Clock::now();
    train(steps);
    trainer.synchronize();
    r.step_s = bench::seconds_since(t0) / steps;
    pilot.end_epoch();
    int64_t window_comm_ns = 0, window_exposed_ns = 0;
    if (!pilot.epoch_summaries().empty()) {
      const torchpilot::EpochSummary& e = pilot.epoch_summaries().back();
      if (const auto* comm = e.sections.get<torchpilot::CommEpochStats>()) {
        if (comm->steps > 0) {
          r.comm_ms = static_cast<double>(comm->stats.comm_ns) / 1e6 / comm->steps;
          r.exposed_ms = static_cast<double>(comm->stats.exposed_ns) / 1e6 / comm->steps;
          r.overlap = comm->stats.comm_ns > 0 ? 1 - static_cast<double>(comm->stats.exposed_ns) /
                                                        static_cast<double>(comm->stats.comm_ns)
                                              : -1;
        }
        r.busbw_gbps = comm->busbw / 1e9;
        if (comm->link_peak > 0) r.link_peak_gbps = comm->link_peak / 1e9;
        r.link = comm->link;
        r.method = comm->method;
        r.gpu_timed_syncs = comm->gpu_timed_syncs;
      }
      if (const auto* gpu = e.sections.get<torchpilot::GpuEpochStats>()) {
        r.traced_steps = gpu->traced_steps;
        window_comm_ns = gpu->stats.comm_ns;
        window_exposed_ns = gpu->stats.exposed_comm_ns;
      }
      if (const auto* cost = e.sections.get<torchpilot::CostStats>()) {
        r.cost = json::parse(torchpilot::section_json(*cost));
      }
      if (const auto* ranks = e.sections.get<torchpilot::RankEpochStats>()) {
        r.ranks = json::parse(torchpilot::section_json(*ranks));
      }
    }
    for (const torchpilot::Advice& adv : pilot.last_advice()) {
      r.advice.push_back({{"advice", adv.id}, {"expected_gain", adv.expected_gain}});
    }
    if (const auto& d = pilot.tuning_decision()) {
      r.decision = {{"decided_at_step", d->decided_at_step},
                    {"chosen", torchpilot::to_string(d->chosen)},
                    {"baseline", torchpilot::to_string(d->baseline)},
                    {"chosen_throughput", d->chosen_throughput},
                    {"baseline_throughput", d->baseline_throughput},
                    {"unit", d->unit},
                    {"trials", d->trials.size()},
                    {"reason", d->reason}};
    }
    // A window's steps still unfinished at the epoch's end count in the next epoch: an epoch of
    // untraced steps finishes them (at least two per step call), so that the window covers the
    // steps the always-on figures do (its advice and decision are read above). The same number
    // of steps on every rank: they all-reduce.
    if (o.window) {
      train(kFinishSteps);
      trainer.synchronize();
      const size_t epochs = pilot.epoch_summaries().size();
      pilot.end_epoch();
      int64_t carried = 0;
      const auto* gpu =
          pilot.epoch_summaries().size() > epochs
              ? pilot.epoch_summaries().back().sections.get<torchpilot::GpuEpochStats>()
              : nullptr;
      if (gpu != nullptr) {
        r.traced_steps += gpu->traced_steps;
        window_comm_ns += gpu->stats.comm_ns;
        window_exposed_ns += gpu->stats.exposed_comm_ns;
        carried = gpu->carried_steps;
      }
      if (carried > 0)
        std::fprintf(stderr, "window: %lld steps still unfinished\n", (long long)carried);
    }
    if (r.traced_steps > 0) {
      r.window_comm_ms = static_cast<double>(window_comm_ns) / 1e6 / r.traced_steps;
      r.window_exposed_ms = static_cast<double>(window_exposed_ns) / 1e6 / r.traced_steps;
    }
    trainer.detach_pilot();  // before this Pilot goes
  }
  return r;
}

Run run(gpt_example::Trainer& trainer, const Args& a, bool advise) {
  RunOptions o;
  o.mode = advise ? torchpilot::Mode::kAdvise : torchpilot::Mode::kOff;
  return run(trainer, a, o);
}

json run_json(const Run& r) {
  return {{"step_ms", 1e3 * r.step_s},
          {"comm_ms_per_step", r.comm_ms},
          {"exposed_ms_per_step", r.exposed_ms},
          {"overlap", r.overlap},
          {"busbw_gbps", r.busbw_gbps},
          {"link_peak_gbps", r.link_peak_gbps},
          {"link", r.link},
          {"method", r.method},
          {"gpu_timed_syncs", r.gpu_timed_syncs},
          {"traced_steps", r.traced_steps},
          {"window_comm_ms_per_step", r.window_comm_ms},
          {"window_exposed_ms_per_step", r.window_exposed_ms},
          {"advice", r.advice}};
}

double gain_of(const Run& r, const std::string& id) {
  for (const auto& a : r.advice) {
    if (a["advice"] == id) return a["expected_gain"].get<double>();
  }
  return 0;
}

// The parts of --suite full (the header says what each measures). Every rank runs the same
// sequence; rank 0's figures are returned, and each rank's autotune decision is written beside
// --out (<out>.rank<r>.json) to compare them.
json full_suite(gpt_example::Trainer& trainer, const Args& a, int rank) {
  json suite;
  const bool all = a.suite == "full";  // else "straggler" or "overlap": that part alone
  const double start_mb = a.train.bucket_mb;
  auto say = [&](const char* part, const Run& r) {
    if (rank != 0) return;
    std::printf(
        "%s: %.3f ms/step; comm %.2f ms, exposed %.2f ms, overlap %.2f, busbw %.1f GB/s "
        "(link %s %.0f GB/s), %lld GPU-timed syncs; window: %lld steps, comm %.2f ms, "
        "exposed %.2f ms; advice %s\n",
        part, 1e3 * r.step_s, r.comm_ms, r.exposed_ms, r.overlap, r.busbw_gbps, r.link.c_str(),
        r.link_peak_gbps, static_cast<long long>(r.gpu_timed_syncs),
        static_cast<long long>(r.traced_steps), r.window_comm_ms, r.window_exposed_ms,
        r.advice.dump().c_str());
    std::fflush(stdout);
  };

  // Overlap on and off, interleaved, always-on figures.
  if (all || a.suite == "overlap") {
    std::vector<double> on_s, off_s, gains, measured;
    json rounds = json::array();
    for (int k = 0; k < a.rounds; ++k) {
      Run on, off;
      for (int i = 0; i < 2; ++i) {
        const bool overlap = (i == 0) == (k % 2 == 0);
        trainer.set_grad_sync(overlap, start_mb);
        (overlap ? on : off) = run(trainer, a, RunOptions{});
      }
      on_s.push_back(on.step_s);
      off_s.push_back(off.step_s);
      gains.push_back(gain_of(off, "exposed_communication"));
      measured.push_back(off.step_s / on.step_s - 1);
      rounds.push_back({{"overlap", run_json(on)}, {"no_overlap", run_json(off)}});
      say("overlap on", on);
      say("overlap off", off);
    }
    RunOptions w;
    w.window = true;
    trainer.set_grad_sync(true, start_mb);
    const Run on_w = run(trainer, a, w);
    say("overlap on, window", on_w);
    trainer.set_grad_sync(false, start_mb);
    const Run off_w = run(trainer, a, w);
    say("overlap off, window", off_w);
    trainer.set_grad_sync(true, start_mb);
    const double est = median(gains), meas = median(measured);
    suite["overlap"] = {{"bucket_mb", start_mb},
                        {"overlap_step_ms_median", 1e3 * median(on_s)},
                        {"no_overlap_step_ms_median", 1e3 * median(off_s)},
                        {"exposed_communication_estimated_gain", est},
                        {"measured_gain_of_overlap", meas},
                        {"ratio", meas > 0 ? est / meas : 0.0},
                        {"window_overlap", run_json(on_w)},
                        {"window_no_overlap", run_json(off_w)},
                        {"rounds", rounds}};
  }
  // Bucket sizes, interleaved.
  if (all) {
    std::vector<std::vector<double>> step(a.buckets.size()), busbw(a.buckets.size());
    json per = json::array();
    double peak = -1;
    std::string link;
    for (int k = 0; k < a.rounds; ++k) {
      for (size_t j = 0; j < a.buckets.size(); ++j) {
        const size_t i = k % 2 == 0 ? j : a.buckets.size() - 1 - j;
        trainer.set_grad_sync(true, a.buckets[i]);
        const Run r = run(trainer, a, RunOptions{});
        step[i].push_back(r.step_s);
        busbw[i].push_back(r.busbw_gbps);
        peak = r.link_peak_gbps;
        link = r.link;
        if (k == 0) say(("bucket " + std::to_string(a.buckets[i]) + " MiB").c_str(), r);
      }
    }
    for (size_t i = 0; i < a.buckets.size(); ++i) {
      per.push_back({{"bucket_mb", a.buckets[i]},
                     {"step_ms_median", 1e3 * median(step[i])},
                     {"busbw_gbps_median", median(busbw[i])},
                     {"busbw_over_link_peak", peak > 0 ? json(median(busbw[i]) / peak) : json()}});
    }
    suite["buckets"] = {{"link", link}, {"link_peak_gbps", peak}, {"sizes", per}};
  }
  // Autotune of the bucket size from --autotune-start; then the chosen size against the grid.
  if (all) {
    trainer.set_grad_sync(true, a.autotune_start);
    RunOptions t;
    t.mode = torchpilot::Mode::kAutotune;
    t.steps = a.autotune_warmup + a.steps;
    const Run r = run(trainer, a, t);
    if (!a.run.out.empty()) {
      std::ofstream(a.run.out + ".rank" + std::to_string(rank) + ".json")
          << json{{"rank", rank}, {"decision", r.decision}}.dump(1) << "\n";
    }
    double best_ms = 0;
    int best_mb = 0;
    for (const auto& b : suite["buckets"]["sizes"]) {
      const double ms = b["step_ms_median"].get<double>();
      if (best_ms == 0 || ms < best_ms) {
        best_ms = ms;
        best_mb = b["bucket_mb"].get<int>();
      }
    }
    suite["autotune"] = {{"start_mb", a.autotune_start},
                         {"decision", r.decision},
                         {"grid_best_mb", best_mb},
                         {"grid_best_step_ms", best_ms}};
    if (rank == 0) std::printf("autotune: %s\n", r.decision.dump().c_str());
    trainer.set_grad_sync(true, start_mb);
  }
  // The overlap's measured gain at the best bucket of the grid too (the advice leaves the bucket
  // size to autotune).
  if (all) {
    double best_ms = 0;
    for (const auto& b : suite["buckets"]["sizes"]) {
      const double ms = b["step_ms_median"].get<double>();
      if (best_ms == 0 || ms < best_ms) best_ms = ms;
    }
    const double off_ms = suite["overlap"]["no_overlap_step_ms_median"].get<double>();
    const double meas = off_ms / best_ms - 1;
    const double est = suite["overlap"]["exposed_communication_estimated_gain"].get<double>();
    suite["overlap"]["measured_gain_at_best_bucket"] = meas;
    suite["overlap"]["ratio_at_best_bucket"] = meas > 0 ? est / meas : 0.0;
  }
  // A planted straggler.
  if (all || a.suite == "straggler") {
    trainer.set_host_ms(rank == a.straggler_rank ? a.straggler_ms : 0);
    RunOptions s;
    s.read_loss_each_step = true;
    const Run r = run(trainer, a, s);
    trainer.set_host_ms(0);
    const Run base = run(trainer, a, s);
    say("straggler", r);
    say("no straggler", base);
    auto table = [&](const char* part, const Run& x) {
      if (rank != 0 || !x.ranks.is_object()) return;
      std::printf("%s: stragglers %s; waits for others (ms):", part,
                  x.ranks.value("stragglers", json::array()).dump().c_str());
      for (const auto& w : x.ranks.value("ranks", json::array())) {
        const json v = w.value("wait_ns", json());
        std::printf(" rank %d %s", w.value("rank", -1),
                    v.is_number() ? std::to_string(v.get<double>() / 1e6).c_str() : "n/a");
      }
      std::printf("\n");
      std::fflush(stdout);
    };
    table("straggler", r);
    suite["straggler"] = {{"rank", a.straggler_rank},   {"planted_ms", a.straggler_ms},
                          {"run", run_json(r)},         {"ranks", r.ranks},
                          {"baseline", run_json(base)}, {"baseline_ranks", base.ranks}};
    // The same with the all-reduce after backward: no NCCL kernel waits for the straggler beside
    // the other rank's backward (an overlapped one, spinning, slows it), so its wait is exposed.
    trainer.set_grad_sync(false, start_mb);
    trainer.set_host_ms(rank == a.straggler_rank ? a.straggler_ms : 0);
    const Run r2 = run(trainer, a, s);
    trainer.set_host_ms(0);
    const Run base2 = run(trainer, a, s);
    trainer.set_grad_sync(true, start_mb);
    say("straggler, no overlap", r2);
    say("no straggler, no overlap", base2);
    table("straggler, no overlap", r2);
    suite["straggler_no_overlap"] = {{"run", run_json(r2)},
                                     {"ranks", r2.ranks},
                                     {"baseline", run_json(base2)},
                                     {"baseline_ranks", base2.ranks}};
  }
  return suite;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  a.train.d_model = 128;
  a.train.layers = 2;
  a.train.heads = 4;
  a.train.seq = 64;
  a.train.batch = 8;
  CLI::App app(
      "collectives: torchpilot's cost on a data-parallel GPT trainer (off vs advise, interleaved "
      "rounds) and the always-on communication figures (bench/README.md).",
      "collectives");
  example_cli::last_wins(app);
  bench::int_flag(app, "--world-size", a.world, 1, 64,
                  "ranks on this host (1: one rank, still through a process group)");
  bench::int_flag(app, "--rounds", a.rounds, 1, 1000, "rounds");
  bench::int_flag(app, "--steps", a.steps, 1, 1000000, "measured steps per round");
  bench::int_flag(app, "--warmup", a.warmup, 0, 1000000, "steps before the measured ones");
  gpt_example::add_shape_flags(app, a.train, "batch per rank");
  app.add_option("--device", a.train.device, "cpu, cuda; default cuda when available")
      ->check(example_cli::Device());
  app.add_flag("--no-overlap", a.no_overlap, "all-reduce after backward (GradSync overlap off)");
  app.add_flag("--compare-observer", a.compare_observer,
               "also advise with the RecordFunction observer on NCCL (comm.observe_nccl_ops)");
  app.add_option("--suite", a.suite,
                 "overhead, or full: also overlap, buckets, autotune, straggler; or overlap or "
                 "straggler: overhead and that part alone")
      ->check(CLI::IsMember({"overhead", "full", "overlap", "straggler"}))
      ->capture_default_str();
  app.add_option("--buckets", a.buckets, "bucket sizes (MiB) for the buckets part")
      ->capture_default_str();
  bench::int_flag(app, "--autotune-start", a.autotune_start, 0, 1 << 20,
                  "starting bucket size (MiB) of the autotune part");
  bench::int_flag(app, "--autotune-warmup", a.autotune_warmup, 10, 1000000,
                  "autotune warm-up steps");
  bench::int_flag(app, "--straggler-rank", a.straggler_rank, 0, 1 << 20,
                  "the planted straggler's rank");
  app.add_option("--straggler-ms", a.straggler_ms, "its host work per step, ms")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  bench::add_run_flags(app, a.run, "JSON results file (rank 0)", false);
  example_cli::parse_or_exit(app, argc, argv);
  if (a.train.d_model % a.train.heads != 0) {
    example_cli::fail(app, "--heads", "--d-model is not a multiple of --heads");
  }

  std::vector<int> ranks;
  try {
    if (std::getenv("RANK") == nullptr) ranks = gpt_example::launch_ranks(a.world, argv);
    const gpt_example::DistRank dist = gpt_example::dist_rank_from_env();
    a.train.rank = dist.rank;
    a.train.world_size = dist.world;
    a.train.local_rank = dist.local_rank;
    a.train.distributed = true;
    a.train.grad_overlap = !a.no_overlap;
    const bool cpu =
        a.train.device == "cpu" || (a.train.device.empty() && !gpt_example::cuda_available());
    if (cpu) {
      a.train.precision = gpt_example::Precision::kFp32;
      gpt_example::set_intra_op_threads(1);  // ranks share the host's cores
    }
    gpt_example::Trainer trainer(a.train);
    {
      torchpilot::Config off;
      off.mode = torchpilot::Mode::kOff;
      torchpilot::Pilot prime(off);
      trainer.train(prime, a.warmup);  // allocator, kernels, the group's first collectives
      trainer.synchronize();
      trainer.detach_pilot();
    }
    std::vector<double> off_s, advise_s, ratios, comm, exposed, overlap, observer_ratios;
    json rounds = json::array();
    for (int k = 0; k < a.rounds; ++k) {
      // 0: off, 1: advise, 2: advise with the observer; reversed in odd rounds.
      Run runs[3];
      RunOptions observed;
      observed.observe_nccl_ops = true;
      for (int c : bench::round_order(k, a.compare_observer ? 3 : 2, bench::Order::kReverse)) {
        runs[c] = c == 2 ? run(trainer, a, observed) : run(trainer, a, c == 1);
      }
      const Run &off = runs[0], &adv = runs[1], &obs = runs[2];
      if (a.compare_observer) observer_ratios.push_back(obs.step_s / off.step_s);
      off_s.push_back(off.step_s);
      advise_s.push_back(adv.step_s);
      ratios.push_back(adv.step_s / off.step_s);
      if (adv.comm_ms >= 0) {
        comm.push_back(adv.comm_ms);
        exposed.push_back(adv.exposed_ms);
        if (adv.overlap >= 0) overlap.push_back(adv.overlap);
      }
      rounds.push_back({{"order", k % 2 == 0 ? "off,advise" : "advise,off"},
                        {"off_step_ms", 1e3 * off.step_s},
                        {"advise_step_ms", 1e3 * adv.step_s},
                        {"ratio", adv.step_s / off.step_s},
                        {"observer_step_ms", a.compare_observer ? json(1e3 * obs.step_s) : json()},
                        {"advise_cost", adv.cost},
                        {"comm_ms_per_step", adv.comm_ms},
                        {"exposed_ms_per_step", adv.exposed_ms},
                        {"overlap", adv.overlap}});
      if (dist.rank == 0) {
        std::printf(
            "round %d: off %.3f ms, advise %.3f ms per step, advise/off %.4f; comm %.2f "
            "ms, exposed %.2f ms per step\n",
            k, 1e3 * off.step_s, 1e3 * adv.step_s, adv.step_s / off.step_s, adv.comm_ms,
            adv.exposed_ms);
        std::fflush(stdout);
      }
    }
    json suite;
    if (a.suite != "overhead") suite = full_suite(trainer, a, dist.rank);
    if (dist.rank == 0) {
      const bench::Spread ratio = bench::spread(ratios);
      std::printf(
          "advise_over_off %.4f (min %.4f, max %.4f) over %d rounds, %d ranks (%s); comm "
          "%.2f ms, exposed %.2f ms per step, overlap %.1f%% (medians)\n",
          ratio.median, ratio.min, ratio.max, a.rounds, dist.world, trainer.comm_backend().c_str(),
          median(comm), median(exposed), 100 * median(overlap));
      json out = bench::run_header("collectives", a.run, bench::Stamp::kUnixTime);
      out.update({{"torch", TORCH_VERSION},
                  {"device", trainer.device()},
                  {"backend", trainer.comm_backend()},
                  {"world_size", dist.world},
                  {"overlap_mode", a.no_overlap ? "after backward" : "from backward's hooks"},
                  {"model",
                   {{"d_model", a.train.d_model},
                    {"layers", a.train.layers},
                    {"seq", a.train.seq},
                    {"batch_per_rank", a.train.batch}}},
                  {"steps_per_round", a.steps},
                  {"off_step_ms_median", 1e3 * median(off_s)},
                  {"advise_step_ms_median", 1e3 * median(advise_s)},
                  {"advise_over_off", ratio.median},
                  {"ratio_min", ratio.min},
                  {"ratio_max", ratio.max},
                  {"budget", 1.005},
                  {"comm_ms_per_step_median", median(comm)},
                  {"exposed_ms_per_step_median", median(exposed)},
                  {"overlap_median", overlap.empty() ? json() : json(median(overlap))},
                  {"rounds", rounds}});
      if (!suite.is_null()) out["suite"] = suite;
      if (a.compare_observer) {
        const bench::Spread observer = bench::spread(observer_ratios);
        out["observer_over_off"] = observer.median;
        out["observer_ratio_min"] = observer.min;
        out["observer_ratio_max"] = observer.max;
        std::printf("with comm.observe_nccl_ops: observer_over_off %.4f\n",
                    median(observer_ratios));
      }
      if (!a.run.out.empty()) bench::write_json(a.run.out, out, 1);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collectives: %s\n", e.what());
    if (!ranks.empty()) gpt_example::stop_ranks(ranks);
    return 1;
  }
  if (!ranks.empty()) {
    const int code = gpt_example::wait_ranks(ranks);
    if (code != 0) {
      std::fprintf(stderr, "collectives: a rank exited with status %d\n", code);
      return 1;
    }
  }
  return 0;
}
