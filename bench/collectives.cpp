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
// all-reduce after backward. Written to --out (bench/results/collectives-<machine>.json).
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_flags.h"
#include "gpt_dist.h"
#include "gpt_trainer.h"
#include "torchpilot/runtime/comm_records.h"
#include "torchpilot/runtime/config.h"
#include "torchpilot/runtime/pilot.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Args {
  gpt_example::TrainOptions train;
  int world = 2;
  int rounds = 9;
  int steps = 30;
  int warmup = 5;
  bool no_overlap = false;
  std::string machine = "unnamed", commit = "unknown", out;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

struct Run {
  double step_s = 0;
  double comm_ms = -1, exposed_ms = -1, overlap = -1;
};

Run run(gpt_example::Trainer& trainer, const Args& a, bool advise) {
  // The defaults; TORCHPILOT_* variables isolate a part's cost (e.g.
  // TORCHPILOT_COMM_ENABLED=false).
  torchpilot::Config c = torchpilot::Config::load();
  c.mode = advise ? torchpilot::Mode::kAdvise : torchpilot::Mode::kOff;
  c.log.level = "warn";
  c.gpu.trace_first_step = 1000000000;  // no window: the always-on cost
  c.gpu.trace_anomaly_factor = 0;
  Run r;
  {
    torchpilot::Pilot pilot(c);
    trainer.train(pilot, a.warmup);
    trainer.synchronize();
    const auto t0 = Clock::now();
    trainer.train(pilot, a.steps);
    trainer.synchronize();
    r.step_s = std::chrono::duration<double>(Clock::now() - t0).count() / a.steps;
    pilot.end_epoch();
    if (!pilot.epoch_summaries().empty()) {
      if (const auto* comm =
              pilot.epoch_summaries().back().sections.get<torchpilot::CommEpochStats>()) {
        if (comm->steps > 0) {
          r.comm_ms = static_cast<double>(comm->stats.comm_ns) / 1e6 / comm->steps;
          r.exposed_ms = static_cast<double>(comm->stats.exposed_ns) / 1e6 / comm->steps;
          r.overlap = comm->stats.comm_ns > 0 ? 1 - static_cast<double>(comm->stats.exposed_ns) /
                                                        static_cast<double>(comm->stats.comm_ns)
                                              : -1;
        }
      }
    }
    trainer.detach_pilot();  // before this Pilot goes
  }
  return r;
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
  example_cli::add_int(app, "--world-size", a.world, 2, 64, "ranks on this host")
      ->capture_default_str();
  example_cli::add_int(app, "--rounds", a.rounds, 1, 1000, "rounds")->capture_default_str();
  example_cli::add_int(app, "--steps", a.steps, 1, 1000000, "measured steps per round")
      ->capture_default_str();
  example_cli::add_int(app, "--warmup", a.warmup, 0, 1000000, "steps before the measured ones")
      ->capture_default_str();
  example_cli::add_int(app, "--d-model", a.train.d_model, 1, 65536, "model width")
      ->capture_default_str();
  example_cli::add_int(app, "--layers", a.train.layers, 1, 4096, "blocks")->capture_default_str();
  example_cli::add_int(app, "--heads", a.train.heads, 1, 4096, "heads")->capture_default_str();
  example_cli::add_int(app, "--seq", a.train.seq, 1, 1 << 20, "sequence length")
      ->capture_default_str();
  example_cli::add_int(app, "--batch", a.train.batch, 1, 65536, "batch per rank")
      ->capture_default_str();
  app.add_option("--device", a.train.device, "cpu, cuda; default cuda when available")
      ->check(example_cli::Device());
  app.add_flag("--no-overlap", a.no_overlap, "all-reduce after backward (GradSync overlap off)");
  app.add_option("--machine", a.machine, "machine name, for the JSON file")->capture_default_str();
  app.add_option("--commit", a.commit, "commit, for the JSON file")->capture_default_str();
  app.add_option("--out", a.out, "JSON results file (rank 0)");
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
    std::vector<double> off_s, advise_s, ratios, comm, exposed, overlap;
    json rounds = json::array();
    for (int k = 0; k < a.rounds; ++k) {
      Run off, adv;
      if (k % 2 == 0) {
        off = run(trainer, a, false);
        adv = run(trainer, a, true);
      } else {
        adv = run(trainer, a, true);
        off = run(trainer, a, false);
      }
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
    if (dist.rank == 0) {
      const double ratio = median(ratios);
      std::printf(
          "advise_over_off %.4f (min %.4f, max %.4f) over %d rounds, %d ranks (%s); comm "
          "%.2f ms, exposed %.2f ms per step, overlap %.1f%% (medians)\n",
          ratio, *std::min_element(ratios.begin(), ratios.end()),
          *std::max_element(ratios.begin(), ratios.end()), a.rounds, dist.world,
          trainer.comm_backend().c_str(), median(comm), median(exposed), 100 * median(overlap));
      json out = {{"bench", "collectives"},
                  {"machine", a.machine},
                  {"commit", a.commit},
                  {"torch", TORCH_VERSION},
                  {"device", trainer.device()},
                  {"backend", trainer.comm_backend()},
                  {"world_size", dist.world},
                  {"overlap_mode", a.no_overlap ? "after backward" : "from backward's hooks"},
                  {"unix_time_s", static_cast<int64_t>(std::time(nullptr))},
                  {"model",
                   {{"d_model", a.train.d_model},
                    {"layers", a.train.layers},
                    {"seq", a.train.seq},
                    {"batch_per_rank", a.train.batch}}},
                  {"steps_per_round", a.steps},
                  {"off_step_ms_median", 1e3 * median(off_s)},
                  {"advise_step_ms_median", 1e3 * median(advise_s)},
                  {"advise_over_off", ratio},
                  {"ratio_min", *std::min_element(ratios.begin(), ratios.end())},
                  {"ratio_max", *std::max_element(ratios.begin(), ratios.end())},
                  {"budget", 1.005},
                  {"comm_ms_per_step_median", median(comm)},
                  {"exposed_ms_per_step_median", median(exposed)},
                  {"overlap_median", overlap.empty() ? json() : json(median(overlap))},
                  {"rounds", rounds}};
      if (!a.out.empty()) std::ofstream(a.out) << out.dump(1) << "\n";
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
