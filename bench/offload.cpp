// gpt_offload: what activation offloading (torchpilot::ActivationOffload) does on the GPT example.
//   1. At a fixed micro-batch (--batch): peak allocated GPU memory and step time with and without
//      offloading, one trainer, the offload's knob toggled, rounds interleaved (the order swapped
//      each round). Per round and setting: `warmup` steps, the allocator's peak reset and the
//      device synchronized, `steps` measured steps, synchronized again; step time = the window's
//      wall time / steps; peak = the allocator's peak allocated bytes in the window.
//   2. Micro-batch search (--search B1,B2,...; empty: skipped): for each setting, each batch in
//      ascending order on a fresh trainer (`search-warmup` + `search-steps` steps) until the first
//      out-of-memory (with offloading, or until the pinned host memory it would take, estimated
//      from step 1's bytes per sample, passes --host-fraction of the host's memory); reported:
//      tokens/s and peak of each batch that fits, the largest that fits.
// torchpilot itself is off (mode off) so that only offloading is measured. Writes JSON (--out)
// with machine, date and commit; prints a summary. Without CUDA in LibTorch or a GPU the peaks
// are -1 and offloading is refused (one line): the method still runs (smoke test on the CPU).
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench_cuda.h"
#include "gpt_cli.h"
#include "gpt_flops.h"
#include "gpt_trainer.h"
#include "harness.h"
#include "torchpilot/hooks/memory/activation_offload.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/pilot.h"

#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#define TP_BENCH_CUDA 1
#else
#define TP_BENCH_CUDA 0
#endif

namespace {

using bench::median;

using bench::Clock;
using nlohmann::json;

struct Args {
  gpt_example::TrainOptions train;
  int rounds = 3;
  int steps = 20;
  int warmup = 5;
  std::string search = "8,16,32,64,96,128,160,192,256";
  int search_warmup = 3;
  int search_steps = 8;
  double host_fraction = 0.5;  // of the host's memory that offloaded activations may pin
  double memory_fraction = 1;  // of the device's memory the caching allocator may use
  bench::RunFlags run;         // --machine, --commit, --out
};

void reset_peak(const gpt_example::Trainer& t) {
#if TP_BENCH_CUDA
  if (t.on_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(0);
#endif
}
int64_t peak_allocated(const gpt_example::Trainer& t) {
#if TP_BENCH_CUDA
  if (t.on_cuda())
    return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak;
#endif
  return -1;
}
void empty_cache() {
#if TP_BENCH_CUDA
  if (torch::cuda::is_available()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

double host_memory_bytes() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

bool is_oom(const std::exception& e) {
  return std::string(e.what()).find("out of memory") != std::string::npos;
}

struct Window {
  double step_ms = 0;
  int64_t peak = -1;
  torchpilot::OffloadStats stats;
};

// warmup steps, then `steps` measured steps.
Window measure(gpt_example::Trainer& t, torchpilot::Pilot& pilot, int warmup, int steps) {
  t.train(pilot, warmup);
  t.synchronize();
  t.take_mean_loss();
  if (t.offload() != nullptr) t.offload()->reset_stats();
  reset_peak(t);
  const auto t0 = Clock::now();
  t.train(pilot, steps);
  t.synchronize();
  Window w;
  w.step_ms = 1e3 * bench::seconds_since(t0) / steps;
  w.peak = peak_allocated(t);
  if (t.offload() != nullptr) w.stats = t.offload()->stats();
  t.take_mean_loss();
  return w;
}

json stats_json(const torchpilot::OffloadStats& s, int steps) {
  const double n = steps;
  return {{"offloaded_mib_per_step", static_cast<double>(s.offloaded_bytes) / (1 << 20) / n},
          {"offloaded_storages_per_step", static_cast<double>(s.offloaded) / n},
          {"shared_per_step", static_cast<double>(s.shared) / n},
          {"kept_parameter_per_step", static_cast<double>(s.kept_parameter) / n},
          {"kept_small_per_step", static_cast<double>(s.kept_small) / n},
          {"kept_other_per_step", static_cast<double>(s.kept_other) / n},
          {"fetched_per_step", static_cast<double>(s.fetched) / n},
          {"fetched_late_per_step", static_cast<double>(s.fetched_late) / n},
          {"resident_per_step", static_cast<double>(s.resident) / n}};
}

int run(int argc, char** argv) {
  Args a;
  a.train = gpt_example::reference_options(8);
  std::string precision = "bf16", attention = "fused";
  CLI::App app(
      "offload: peak memory and step time of the GPT example with and without activation "
      "offloading at a fixed micro-batch, and the largest micro-batch each fits (bench/README.md)",
      "gpt_offload");
  example_cli::last_wins(app);
  gpt_example::add_shape_flags(app, a.train, "the fixed micro-batch B");
  gpt_example::add_precision_flags(app, precision, &attention);
  app.add_option("--device", a.train.device, "cpu, cuda or cuda:N; default cuda when available")
      ->check(example_cli::Device())
      ->type_name("cpu|cuda|cuda:N");
  bench::int_flag(app, "--min-bytes", a.train.offload_min_bytes, 1, INT64_MAX,
                  "storages smaller than this stay on the GPU");
  bench::int_flag(app, "--depth", a.train.offload_depth, 0, 1000,
                  "copies in flight behind forward, fetched ahead in backward");
  bench::int_flag(app, "--rounds", a.rounds, 1, 1000, "rounds at the fixed micro-batch");
  bench::int_flag(app, "--steps", a.steps, 1, 1000000, "measured steps per round and setting");
  bench::int_flag(app, "--warmup", a.warmup, 1, 1000000, "steps before the measured ones");
  app.add_option("--search", a.search,
                 "micro-batches tried, ascending, comma-separated; empty: none")
      ->capture_default_str();
  bench::int_flag(app, "--search-warmup", a.search_warmup, 1, 1000000,
                  "steps before the measured ones in the search");
  bench::int_flag(app, "--search-steps", a.search_steps, 1, 1000000,
                  "measured steps per micro-batch in the search");
  bench::number_flag(app, "--host-fraction", a.host_fraction, 0, 1,
                     "the search skips micro-batches whose offloaded activations would pin "
                     "more than this share of the host's memory (estimated)");
  bench::add_memory_fraction_flag(app, a.memory_fraction);
  bench::add_run_flags(app, a.run, "write the results here (JSON)");
  example_cli::parse_or_exit(app, argc, argv);
  if (a.train.d_model % a.train.heads != 0) {
    example_cli::fail(app, "--heads", "--d-model is not a multiple of --heads");
  }
  std::vector<int64_t> batches;
  {
    std::stringstream in(a.search);
    std::string item;
    while (std::getline(in, item, ',')) {
      if (item.empty()) continue;
      try {
        const long long b = std::stoll(item);
        if (b < 1) throw std::out_of_range("");
        batches.push_back(b);
      } catch (const std::exception&) {
        example_cli::fail(app, "--search", "'" + item + "' is not a positive integer");
      }
    }
    std::sort(batches.begin(), batches.end());
  }
  gpt_example::apply_precision_flags(a.train, precision, &attention);
  a.train.offload_activations = true;

  const bool capped = a.memory_fraction < 1 && bench::cap_device_memory(a.memory_fraction);
  if (capped) {
    std::printf("offload: the caching allocator is capped at %.3f of the device's memory\n",
                a.memory_fraction);
  }
  torchpilot::Config off_config;
  off_config.mode = torchpilot::Mode::kOff;
  off_config.gpu.enabled = false;
  json j;
  double offloaded_per_sample = 0;  // bytes, measured at the fixed micro-batch
  try {
    // 1. Fixed micro-batch, interleaved.
    gpt_example::Trainer trainer(a.train);
    torchpilot::ActivationOffload* offload = trainer.offload();
    const gpt_example::GptShape shape = trainer.shape();
    const double tokens = static_cast<double>(gpt_example::tokens_per_step(shape));
    std::printf(
        "offload: %s; d %lld, %lld layers, T %lld, micro-batch %lld, %s, %s attention, device %s; "
        "offloading %s (min %lld bytes, depth %d)\n",
        a.run.machine.c_str(), static_cast<long long>(shape.d_model),
        static_cast<long long>(shape.layers), static_cast<long long>(shape.seq),
        static_cast<long long>(shape.batch), gpt_example::to_string(trainer.precision()),
        trainer.fused_attention() ? "fused" : "unfused", trainer.device().c_str(),
        offload->available() ? "available" : offload->unavailable_reason().c_str(),
        static_cast<long long>(a.train.offload_min_bytes), a.train.offload_depth);
    std::fflush(stdout);
    torchpilot::Pilot pilot(off_config);
    std::vector<double> ms[2], peak[2];
    json rounds = json::array();
    torchpilot::OffloadStats on_stats;
    // Configuration 0: offloading off, 1: on; the order swapped each round.
    bench::interleave(a.rounds, 2, bench::Order::kRotate, [&](int r, int k, int on) {
      if (k == 0) std::printf("  round %d:", r + 1);
      offload->set_enabled(on == 1);
      const Window w = measure(trainer, pilot, a.warmup, a.steps);
      if (on) on_stats = w.stats;
      ms[on].push_back(w.step_ms);
      peak[on].push_back(static_cast<double>(w.peak));
      rounds.push_back({{"round", r},
                        {"offload", on == 1},
                        {"step_ms", w.step_ms},
                        {"peak_allocated_bytes", w.peak}});
      std::printf(" %s %.2f ms/step, peak %.0f MiB;", on ? "on" : "off", w.step_ms,
                  static_cast<double>(w.peak) / (1 << 20));
      std::fflush(stdout);
      if (k == 1) std::printf("\n");
    });
    offloaded_per_sample =
        static_cast<double>(on_stats.offloaded_bytes) / a.steps / static_cast<double>(shape.batch);
    const double ms_off = median(ms[0]), ms_on = median(ms[1]);
    const double peak_off = median(peak[0]), peak_on = median(peak[1]);
    std::printf(
        "fixed micro-batch %lld: step %.2f ms without, %.2f ms with offloading (x%.3f); peak "
        "allocated %.0f MiB without, %.0f MiB with (x%.3f); offloaded %.0f MiB/step\n",
        static_cast<long long>(shape.batch), ms_off, ms_on, ms_on / ms_off, peak_off / (1 << 20),
        peak_on / (1 << 20), peak_on / peak_off,
        static_cast<double>(on_stats.offloaded_bytes) / (1 << 20) / a.steps);
    j["fixed"] = {{"batch", shape.batch},
                  {"off",
                   {{"median_step_ms", ms_off},
                    {"tokens_per_s", tokens / ms_off * 1e3},
                    {"median_peak_allocated_bytes", peak_off}}},
                  {"on",
                   {{"median_step_ms", ms_on},
                    {"tokens_per_s", tokens / ms_on * 1e3},
                    {"median_peak_allocated_bytes", peak_on},
                    {"stats", stats_json(on_stats, a.steps)}}},
                  {"step_time_ratio_on_vs_off", ms_on / ms_off},
                  {"peak_ratio_on_vs_off", peak_on / peak_off},
                  {"rounds", rounds}};
    j["config"] = {{"d_model", shape.d_model},
                   {"layers", shape.layers},
                   {"heads", a.train.heads},
                   {"seq", shape.seq},
                   {"precision", gpt_example::to_string(trainer.precision())},
                   {"attention", trainer.fused_attention() ? "fused" : "unfused"},
                   {"optimizer", gpt_example::to_string(trainer.optimizer())},
                   {"parameters", trainer.parameter_count()},
                   {"min_bytes", a.train.offload_min_bytes},
                   {"depth", a.train.offload_depth},
                   {"offload_available", offload->available()},
                   {"memory_fraction", capped ? a.memory_fraction : 1.0},
                   {"warmup", a.warmup},
                   {"steps", a.steps},
                   {"rounds", a.rounds}};
    j["device"] = trainer.device();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "offload: the fixed micro-batch failed: %s\n", e.what());
    return 1;
  }
  empty_cache();

  // 2. The largest micro-batch each setting fits.
  json search = json::object();
  for (int on = 0; on < 2 && !batches.empty(); ++on) {
    json tried = json::array();
    int64_t largest = 0;
    double largest_tps = 0, best_tps = 0;
    int64_t best_batch = 0;
    for (int64_t b : batches) {
      // Offloaded bytes live in pinned host memory: no micro-batch that would pin more than
      // --host-fraction of the host's memory (the estimate scales the fixed run's bytes/sample).
      const double pinned = offloaded_per_sample * static_cast<double>(b);
      if (on == 1 && pinned > a.host_fraction * host_memory_bytes()) {
        tried.push_back({{"batch", b},
                         {"fits", false},
                         {"skipped", "estimated pinned host memory above --host-fraction"},
                         {"estimated_pinned_bytes", pinned}});
        std::printf(
            "  search on : micro-batch %lld: skipped, would pin an estimated %.1f GiB of "
            "host memory\n",
            static_cast<long long>(b), pinned / (1 << 30));
        break;
      }
      gpt_example::TrainOptions o = a.train;
      o.batch = b;
      o.offload_activations = on == 1;
      json row = {{"batch", b}};
      try {
        auto t = std::make_unique<gpt_example::Trainer>(o);
        torchpilot::Pilot pilot(off_config);
        const Window w = measure(*t, pilot, a.search_warmup, a.search_steps);
        const double tps =
            static_cast<double>(gpt_example::tokens_per_step(t->shape())) / w.step_ms * 1e3;
        row["fits"] = true;
        row["step_ms"] = w.step_ms;
        row["tokens_per_s"] = tps;
        row["peak_allocated_bytes"] = w.peak;
        largest = b;
        largest_tps = tps;
        if (tps > best_tps) best_tps = tps, best_batch = b;
        std::printf("  search %s: micro-batch %lld: %.2f ms/step, %.0f tokens/s, peak %.0f MiB\n",
                    on ? "on " : "off", static_cast<long long>(b), w.step_ms, tps,
                    static_cast<double>(w.peak) / (1 << 20));
      } catch (const std::exception& e) {
        if (!is_oom(e)) {
          std::fprintf(stderr, "offload: micro-batch %lld failed: %s\n", static_cast<long long>(b),
                       e.what());
          return 1;
        }
        row["fits"] = false;
        row["error"] = "out of memory";
        std::printf("  search %s: micro-batch %lld: out of memory\n", on ? "on " : "off",
                    static_cast<long long>(b));
      }
      std::fflush(stdout);
      tried.push_back(row);
      empty_cache();
      if (!row["fits"].get<bool>()) break;
    }
    search[on ? "on" : "off"] = {{"tried", tried},
                                 {"largest_batch", largest},
                                 {"largest_batch_tokens_per_s", largest_tps},
                                 {"best_batch", best_batch},
                                 {"best_tokens_per_s", best_tps}};
    std::printf("search %s: largest micro-batch %lld (%.0f tokens/s); best %lld (%.0f tokens/s)\n",
                on ? "with offloading" : "without offloading", static_cast<long long>(largest),
                largest_tps, static_cast<long long>(best_batch), best_tps);
  }
  j["search"] = search;

  if (!a.run.out.empty()) {
    j.update(bench::run_header("offload", a.run));
    j["libtorch"] = TORCH_VERSION;
    j["method"] =
        "fixed micro-batch: one trainer, offloading toggled by its knob, the order swapped each "
        "round; per round and setting warm-up steps, then measured steps between device "
        "synchronizations; step time = window / steps; peak = the CUDA caching allocator's peak "
        "allocated bytes in the window; medians over rounds. Search: a fresh trainer per "
        "micro-batch, ascending, until the first out-of-memory (with offloading, or until the "
        "estimated "
        "pinned host memory passes --host-fraction of the host's). torchpilot mode off. "
        "config.memory_fraction < 1: the caching allocator was capped at that share of the "
        "device's memory (setMemoryFraction), standing for a smaller device.";
    bench::write_json(a.run.out, j);
    std::printf("wrote %s\n", a.run.out.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("gpt_offload", argc, argv, run); }
