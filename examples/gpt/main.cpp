// gpt_trainer: the torchpilot GPT example. Trains a GPT-style decoder-only model on byte-level
// text with AdamW, measured by a Pilot (samples = tokens) and a FLOP counter, and prints per epoch
// the loss, tokens/s and the analytic against the counted model FLOPs per step. torchpilot's
// advisory log (MFU, GPU figures, advice) is printed by the Pilot itself at each epoch's end.
// `--attention unfused` and `--precision fp32` plant the fusion and precision advisors.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli_flags.h"
#include "gpt_cli.h"
#include "gpt_dist.h"
#include "gpt_flops.h"
#include "gpt_trainer.h"
#include "torchpilot/hooks/flops/flop_counter.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/pilot.h"

int main(int argc, char** argv) {
  gpt_example::TrainOptions options = gpt_example::reference_options(8);
  bool no_flops = false;
  long long steps = 100, epochs = 3;
  double corpus_mb = static_cast<double>(options.corpus_bytes) / (1 << 20);
  std::string attention = "fused", precision = "bf16", optimizer = "fused", linear = "aten";
  std::string mode, config_path, json_path;
  int world_size = 1, straggler_rank = -1;
  double straggler_ms = 0;
  bool no_overlap = false;

  CLI::App app(
      "gpt_trainer: trains a GPT-style decoder-only model on byte-level text with AdamW (weight "
      "decay 0.1), measured by a torchpilot Pilot (samples = tokens) and a FLOP counter.",
      "gpt_trainer");
  example_cli::last_wins(app);
  example_cli::add_int(app, "--steps", steps, 1, 1000000000, "steps per epoch")
      ->capture_default_str();
  example_cli::add_int(app, "--epochs", epochs, 1, 1000000, "epochs")->capture_default_str();
  app.footer(
      "Sizes: the reference model by default; on the CPU (no GPU, or --device cpu) when no size "
      "is given: d 128, 2 layers, 4 heads, T 64, batch 8.");
  example_cli::add_int(app, "--batch", options.batch, 1, 65536, "batch B")->capture_default_str();
  example_cli::add_int(app, "--micro-batch", options.micro_batch, 0, 65536,
                       "run each batch as micro-batches of this many rows with gradient "
                       "accumulation (torchpilot::Accumulation; in mode autotune torchpilot "
                       "picks it); 0: the whole batch at once")
      ->capture_default_str();
  example_cli::add_int(app, "--seq", options.seq, 1, 1 << 20, "sequence length T")
      ->capture_default_str();
  example_cli::add_int(app, "--d-model", options.d_model, 1, 65536,
                       "model width d (a multiple of --heads)")
      ->capture_default_str();
  example_cli::add_int(app, "--layers", options.layers, 1, 4096, "blocks")->capture_default_str();
  example_cli::add_int(app, "--heads", options.heads, 1, 4096, "attention heads")
      ->capture_default_str();
  app.add_option("--attention", attention,
                 "fused: scaled_dot_product_attention; unfused: matmul + mask + softmax + matmul "
                 "(plants the fusion advisor)")
      ->check(CLI::IsMember({"fused", "unfused"}))
      ->capture_default_str();
  app.add_option("--linear", linear,
                 "aten: torch::linear (the bias in the GEMM, as Python's F.linear); module: the "
                 "Linear modules' forward, which adds the bias in a separate kernel on 3-D inputs "
                 "(plants the unfused_linear_bias advice)")
      ->check(CLI::IsMember({"aten", "module"}))
      ->capture_default_str();
  app.add_option("--precision", precision,
                 "bf16 autocast on CUDA, or fp32 (plants the precision advisor); the CPU runs fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  app.add_option("--optimizer", optimizer,
                 "AdamW as fused: at::_fused_adamw_ (LibTorch >= 2.1, CUDA; else foreach, said "
                 "once), foreach: multi-tensor _foreach ops, per-parameter: torch::optim::AdamW")
      ->check(CLI::IsMember({"fused", "foreach", "per-parameter"}))
      ->capture_default_str();
  app.add_option("--device", options.device, "cpu, cuda or cuda:N; default cuda when available")
      ->check(example_cli::Device())
      ->type_name("cpu|cuda|cuda:N");
  example_cli::add_number(app, "--lr", options.lr, 0, 10, "AdamW learning rate")
      ->capture_default_str();
  example_cli::add_path(app, "--text", options.text_path, "FILE",
                        "train on this file's bytes (default: the generated pseudo-text)")
      ->check(example_cli::ExistingFile());
  example_cli::add_number(app, "--corpus-mb", corpus_mb, 0, 16384,
                          "size of the generated pseudo-text, MiB")
      ->capture_default_str();
  example_cli::add_int(app, "--seed", options.seed, 0, INT64_MAX, "seed of weights and batches")
      ->capture_default_str();
  app.add_flag("--no-flops", no_flops, "no FLOP counter (no MFU)");
  example_cli::add_torchpilot_flags(app, mode, config_path, json_path, "advise");
  example_cli::add_int(app, "--world-size", world_size, 1, 1024,
                       "data-parallel ranks on this host (one process each, Gloo on the CPU, NCCL "
                       "on CUDA, one GPU per rank); under torchrun its RANK and WORLD_SIZE count")
      ->capture_default_str();
  app.add_flag("--no-overlap", no_overlap,
               "all-reduce the gradients after backward instead of from backward's hooks "
               "(plants exposed communication)");
  example_cli::add_amount(app, "--bucket-mb", options.bucket_mb, 1 << 20,
                          "gradient bucket size, MiB (0: one bucket per parameter)")
      ->capture_default_str();
  example_cli::add_int(app, "--straggler-rank", straggler_rank, 0, 1023,
                       "this rank does --straggler-ms of host work per step (plants a straggler)");
  example_cli::add_amount(app, "--straggler-ms", straggler_ms, 1e6,
                          "host work per step on --straggler-rank, ms")
      ->capture_default_str();
  app.add_flag("--offload-activations", options.offload_activations,
               "saved activations to pinned host memory during forward, back ahead of backward "
               "(torchpilot::ActivationOffload; refused with one line without a GPU)");
  example_cli::add_int(app, "--offload-min-bytes", options.offload_min_bytes, 1, INT64_MAX,
                       "with --offload-activations: storages smaller than this stay on the GPU")
      ->capture_default_str();
  example_cli::add_int(app, "--offload-depth", options.offload_depth, 0, 1000,
                       "with --offload-activations: copies in flight behind forward and fetched "
                       "ahead in backward")
      ->capture_default_str();
  app.add_flag("--host-loader", options.host_loader,
               "batches from a host data loader (torchpilot::TunableLoader over a host copy of "
               "the corpus, one window per sample) instead of cut on the device: data wait is "
               "measured and the loader.* knobs are advised on and, in mode autotune, tuned");
  example_cli::add_amount(app, "--loader-sample-us", options.loader_sample_us, 1e7,
                          "with --host-loader: CPU work per sample, microseconds of the loading "
                          "thread's CPU time (stands for tokenization / decoding)")
      ->capture_default_str();
  example_cli::add_amount(app, "--loader-io-us", options.loader_io_us, 1e7,
                          "with --host-loader: waiting per sample, microseconds of sleep (stands "
                          "for storage latency; costs no core)")
      ->capture_default_str();
  example_cli::add_int(app, "--loader-workers", options.loader_workers, 0, 256,
                       "with --host-loader: loader worker threads at the start (0: batches made "
                       "on the training thread; mode autotune tunes it)")
      ->capture_default_str();
  example_cli::parse_or_exit(app, argc, argv);
  if (!options.host_loader) {
    for (const char* flag : {"--loader-sample-us", "--loader-io-us", "--loader-workers"}) {
      if (app.count(flag) > 0) example_cli::fail(app, flag, "needs --host-loader");
    }
  }
  options.loader_epoch_steps = steps;  // the loader's epoch ends where the program's does
  if (straggler_rank >= world_size && app.count("--world-size") > 0) {
    example_cli::fail(app, "--straggler-rank",
                      std::to_string(straggler_rank) + " is not a rank of --world-size " +
                          std::to_string(world_size));
  }
  if (options.micro_batch > options.batch && app.count("--batch") > 0) {
    example_cli::fail(app, "--micro-batch",
                      std::to_string(options.micro_batch) + " is larger than --batch " +
                          std::to_string(options.batch));
  }
  if (options.d_model % options.heads != 0) {
    example_cli::fail(app, "--heads",
                      "--d-model " + std::to_string(options.d_model) +
                          " is not a multiple of --heads " + std::to_string(options.heads));
  }
  options.fused_attention = attention == "fused";
  options.aten_linear = linear == "aten";
  options.precision =
      precision == "bf16" ? gpt_example::Precision::kBf16 : gpt_example::Precision::kFp32;
  options.optimizer = gpt_example::optimizer_from_string(optimizer);
  options.corpus_bytes = static_cast<size_t>(corpus_mb * (1 << 20));
  const bool flops = !no_flops;
  bool sizes_given = false;
  for (const char* size : {"--batch", "--seq", "--d-model", "--layers", "--heads"}) {
    sizes_given = sizes_given || app.count(size) > 0;
  }

  std::vector<int> ranks;  // the ranks this process started (rank 0 of --world-size N)
  try {
    // Data parallelism: under torchrun, its variables; else --world-size N starts ranks 1..N-1.
    if (std::getenv("RANK") == nullptr && world_size > 1) {
      ranks = gpt_example::launch_ranks(world_size, argv);
    }
    const gpt_example::DistRank dist = gpt_example::dist_rank_from_env();
    options.rank = dist.rank;
    options.world_size = dist.world;
    options.local_rank = dist.local_rank;
    // --world-size 1 or torchrun's variables: a process group of one (NCCL's one-rank kernels).
    options.distributed = app.count("--world-size") > 0 || std::getenv("RANK") != nullptr;
    options.grad_overlap = !no_overlap;
    if (straggler_rank == dist.rank) options.host_ms = straggler_ms;
    const bool speak = dist.rank == 0;  // rank 0 prints; the others' torchpilot logs warnings
    torchpilot::Config config = config_path.empty()
                                    ? torchpilot::Config::load()
                                    : torchpilot::Config::from_yaml_file(config_path);
    if (!mode.empty()) {
      config.mode = torchpilot::Config::from_yaml_string("mode: " + mode, "--mode").mode;
    }
    if (!json_path.empty()) {
      config.log.json_path =
          dist.world > 1 ? json_path + ".rank" + std::to_string(dist.rank) : json_path;
    }
    if (!speak && config.log.level != "error" && config.log.level != "off") {
      config.log.level = "warn";
    }
    if (dist.world > 1 &&
        (options.device == "cpu" || (options.device.empty() && !gpt_example::cuda_available()))) {
      // Ranks share this host's cores.
      const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      gpt_example::set_intra_op_threads(std::max(1, static_cast<int>(cores) / dist.world));
    }

    // The reference model is far too slow for a CPU: a small default there.
    if (!sizes_given &&
        (options.device == "cpu" || (options.device.empty() && !gpt_example::cuda_available()))) {
      options.d_model = 128;
      options.layers = 2;
      options.heads = 4;
      options.seq = 64;
      options.batch = std::max<int64_t>(8, options.micro_batch);
      if (speak)
        std::printf("gpt: no GPU: the small CPU model (d 128, 2 layers, T 64, batch %lld)\n",
                    static_cast<long long>(options.batch));
    }
    // The Pilot before the trainer: the trainer's data-parallel group observes it (Collectives)
    // and must go first.
    torchpilot::Pilot pilot(config);
    gpt_example::Trainer trainer(options);
    char straggler_buf[96];
    std::snprintf(straggler_buf, sizeof straggler_buf, "; rank %d does %g ms of host work a step",
                  straggler_rank, straggler_ms);
    const std::string straggler_note = straggler_buf;
    if (speak && dist.world > 1) {
      std::printf("gpt: data parallel: %d ranks, %s, gradients in %g MiB buckets %s%s\n",
                  dist.world, trainer.comm_backend().c_str(), options.bucket_mb,
                  options.grad_overlap ? "all-reduced from backward's hooks"
                                       : "all-reduced after backward (--no-overlap)",
                  straggler_rank >= 0 ? straggler_note.c_str() : "");
    }
    if (speak && options.micro_batch > 0) {
      std::printf(
          "gpt: gradient accumulation: micro-batch %lld x %lld of batch %lld per rank%s\n",
          static_cast<long long>(options.micro_batch),
          static_cast<long long>((options.batch + options.micro_batch - 1) / options.micro_batch),
          static_cast<long long>(options.batch),
          config.mode == torchpilot::Mode::kAutotune ? "; torchpilot tunes the micro-batch" : "");
    }
    const gpt_example::GptShape shape = trainer.shape();
    const double analytic = gpt_example::model_flops_per_step(shape);
    if (speak)
      std::printf(
          "gpt: d %lld, %lld layers, %lld heads, T %lld, batch %lld (%lld tokens/step), vocab "
          "%lld; "
          "%s attention, %s linear, %s, %s AdamW, device %s, mode %s\n",
          static_cast<long long>(shape.d_model), static_cast<long long>(shape.layers),
          static_cast<long long>(options.heads), static_cast<long long>(shape.seq),
          static_cast<long long>(shape.batch),
          static_cast<long long>(gpt_example::tokens_per_step(shape)),
          static_cast<long long>(shape.vocab), trainer.fused_attention() ? "fused" : "unfused",
          options.aten_linear ? "aten" : "module", gpt_example::to_string(trainer.precision()),
          gpt_example::to_string(trainer.optimizer()), trainer.device().c_str(),
          torchpilot::to_string(config.mode));
    if (speak)
      std::printf(
          "gpt: %.2fM parameters, N = %.2fM matmul weights (blocks + untied LM head); corpus %lld "
          "tokens (%s)\n",
          static_cast<double>(trainer.parameter_count()) / 1e6,
          static_cast<double>(gpt_example::matmul_params(shape)) / 1e6,
          static_cast<long long>(trainer.corpus_size()),
          options.text_path.empty() ? "generated" : options.text_path.c_str());
    if (speak)
      std::printf("gpt: analytic FLOPs/step %.4g = 6 N tokens %.4g + attention 12 B L T^2 d %.4g\n",
                  analytic, gpt_example::matmul_flops_per_step(shape),
                  gpt_example::attention_flops_per_step(shape));
    if (speak && options.host_loader) {
      std::printf(
          "gpt: host loader: %lld windows of T+1 tokens a batch, %g us CPU + %g us wait a sample, "
          "%d workers at the start%s\n",
          static_cast<long long>(options.batch), options.loader_sample_us, options.loader_io_us,
          options.loader_workers,
          config.mode == torchpilot::Mode::kAutotune ? "; torchpilot tunes the loader" : "");
    }
    if (speak && trainer.offload() != nullptr && trainer.offload()->enabled()) {
      std::printf(
          "gpt: activation offloading: saved storages of %lld bytes or more to pinned host "
          "memory, depth %d\n",
          static_cast<long long>(options.offload_min_bytes), options.offload_depth);
    }
    std::fflush(stdout);

    std::optional<torchpilot::FlopCounter> counter;
    if (flops) counter.emplace(pilot);

    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    double last_loss = 0;
    for (long long e = 0; e < epochs; ++e) {
      const auto t0 = Clock::now();
      trainer.train(pilot, steps);
      last_loss = trainer.take_mean_loss();  // reads the loss: waits for the epoch's work
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      pilot.end_epoch();  // torchpilot's epoch summary and advice
      const double tokens =
          static_cast<double>(steps) * static_cast<double>(gpt_example::tokens_per_step(shape));
      if (speak)
        std::printf(
            "gpt: epoch %lld: %lld steps, loss %.4f, %.0f tokens/s, %.1f ms/step, analytic "
            "%.2f TFLOP/s\n",
            e, steps, last_loss, tokens / seconds, 1e3 * seconds / static_cast<double>(steps),
            analytic * static_cast<double>(steps) / seconds / 1e12);
      if (!pilot.epoch_summaries().empty() &&
          pilot.epoch_summaries().back().sections.get<torchpilot::FlopEpochStats>()) {
        const torchpilot::FlopEpochStats& f =
            *pilot.epoch_summaries().back().sections.get<torchpilot::FlopEpochStats>();
        // steps_with_count: steps carrying a count (from a counting window in this epoch or,
        // for the same tokens per step, an earlier one); counted_steps: this epoch's window.
        if (f.steps_with_count > 0 && f.model_flops_per_step > 0) {
          if (speak)
            std::printf(
                "gpt: epoch %lld: counted FLOPs/step %.4g (%lld steps counted this epoch), "
                "analytic %.4g, counted/analytic %.4f (%+.2f%%)\n",
                e, f.model_flops_per_step, static_cast<long long>(f.counted_steps), analytic,
                f.model_flops_per_step / analytic, 100 * (f.model_flops_per_step / analytic - 1));
        } else {
          if (speak) std::printf("gpt: epoch %lld: counted FLOPs/step: no count yet\n", e);
        }
      }
      if (speak && trainer.offload() != nullptr && trainer.offload()->enabled()) {
        const torchpilot::OffloadStats o = trainer.offload()->stats();
        trainer.offload()->reset_stats();
        std::printf(
            "gpt: epoch %lld: offloaded %.1f MiB/step (%.1f storages/step, %.1f kept as "
            "parameters, %.1f as small), fetched %.1f/step, %.1f of them late, %.1f used "
            "resident\n",
            e, static_cast<double>(o.offloaded_bytes) / (1 << 20) / static_cast<double>(steps),
            static_cast<double>(o.offloaded) / static_cast<double>(steps),
            static_cast<double>(o.kept_parameter) / static_cast<double>(steps),
            static_cast<double>(o.kept_small) / static_cast<double>(steps),
            static_cast<double>(o.fetched) / static_cast<double>(steps),
            static_cast<double>(o.fetched_late) / static_cast<double>(steps),
            static_cast<double>(o.resident) / static_cast<double>(steps));
      }
      std::fflush(stdout);
    }
    const double wall = std::chrono::duration<double>(Clock::now() - start).count();
    if (speak)
      std::printf("gpt: %lld steps in %.1f s; last epoch loss %.4f\n", steps * epochs, wall,
                  last_loss);
    if (speak && options.micro_batch > 0) {
      std::printf(
          "gpt: micro-batch at the end %lld x accumulation %lld; out-of-memory errors "
          "recovered %lld\n",
          static_cast<long long>(trainer.micro_batch()),
          static_cast<long long>(trainer.accumulation()),
          static_cast<long long>(trainer.oom_recoveries()));
    }
    if (!ranks.empty()) {
      const int code = gpt_example::wait_ranks(ranks);
      if (code != 0) {
        std::fprintf(stderr, "gpt_trainer: a rank exited with status %d\n", code);
        return 1;
      }
    }
  } catch (const torchpilot::ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    if (!ranks.empty()) gpt_example::stop_ranks(ranks);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_trainer: %s\n", e.what());
    if (!ranks.empty()) gpt_example::stop_ranks(ranks);
    return 1;
  }
  return 0;
}
