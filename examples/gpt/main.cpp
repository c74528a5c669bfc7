// gpt_trainer: the torchpilot GPT example. Trains a GPT-style decoder-only model on byte-level
// text with AdamW, measured by a Pilot (samples = tokens) and a FLOP counter, and prints per epoch
// the loss, tokens/s and the analytic against the counted model FLOPs per step. torchpilot's
// advisory log (MFU, GPU figures, advice) is printed by the Pilot itself at each epoch's end.
// `--attention unfused` and `--precision fp32` plant the fusion and precision advisors.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

#include "gpt_flops.h"
#include "gpt_trainer.h"
#include "torchpilot/hooks/flop_counter.h"
#include "torchpilot/runtime/config.h"
#include "torchpilot/runtime/pilot.h"

namespace {

void usage() {
  std::fprintf(
      stderr,
      "usage: gpt_trainer [--steps N] [--epochs E] [--batch B] [--seq T] [--d-model D]\n"
      "                   [--layers L] [--heads H] [--attention fused|unfused]\n"
      "                   [--precision bf16|fp32] [--device cuda|cpu] [--lr LR]\n"
      "                   [--text FILE] [--corpus-mb MB] [--seed S] [--no-flops]\n"
      "                   [--mode off|advise|autotune] [--config FILE] [--json FILE]\n"
      "Defaults: 100 steps per epoch, 3 epochs; the reference model: d 1024, 12 layers,\n"
      "16 heads, T 1024, batch 8 (on the CPU, when no size is given: d 128, 2 layers, 4 heads,\n"
      "T 64, batch 8); fused attention, bf16 autocast on CUDA (fp32 on the CPU), lr 3e-4,\n"
      "AdamW weight decay 0.1; device cuda when available; the generated 4 MB pseudo-text\n"
      "unless --text; mode advise (unless the config file or TORCHPILOT_MODE says otherwise);\n"
      "a FLOP counter unless --no-flops.\n");
}

long long parse_int(const std::string& flag, const char* text, long long min) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < min) {
    std::fprintf(stderr, "gpt_trainer: %s needs an integer >= %lld, got '%s'\n", flag.c_str(), min,
                 text);
    std::exit(2);
  }
  return v;
}

double parse_double(const std::string& flag, const char* text) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (*text == '\0' || *end != '\0' || !(v > 0)) {
    std::fprintf(stderr, "gpt_trainer: %s needs a positive number, got '%s'\n", flag.c_str(), text);
    std::exit(2);
  }
  return v;
}

[[noreturn]] void bad_choice(const std::string& flag, const std::string& value) {
  std::fprintf(stderr, "gpt_trainer: bad value '%s' for %s\n", value.c_str(), flag.c_str());
  usage();
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  gpt_example::TrainOptions options;
  options.d_model = 1024;
  options.layers = 12;
  options.heads = 16;
  options.seq = 1024;
  options.batch = 8;
  bool sizes_given = false;
  bool flops = true;
  long long steps = 100, epochs = 3;
  std::string mode, config_path, json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      usage();
      return 0;
    }
    if (flag == "--no-flops") {
      flops = false;
      continue;
    }
    if (i + 1 >= argc) {
      usage();
      return 2;
    }
    const char* value = argv[++i];
    if (flag == "--steps") {
      steps = parse_int(flag, value, 1);
    } else if (flag == "--epochs") {
      epochs = parse_int(flag, value, 1);
    } else if (flag == "--batch") {
      options.batch = parse_int(flag, value, 1);
      sizes_given = true;
    } else if (flag == "--seq") {
      options.seq = parse_int(flag, value, 1);
      sizes_given = true;
    } else if (flag == "--d-model") {
      options.d_model = parse_int(flag, value, 1);
      sizes_given = true;
    } else if (flag == "--layers") {
      options.layers = parse_int(flag, value, 1);
      sizes_given = true;
    } else if (flag == "--heads") {
      options.heads = parse_int(flag, value, 1);
      sizes_given = true;
    } else if (flag == "--attention") {
      const std::string v = value;
      if (v != "fused" && v != "unfused") bad_choice(flag, v);
      options.fused_attention = v == "fused";
    } else if (flag == "--precision") {
      const std::string v = value;
      if (v != "bf16" && v != "fp32") bad_choice(flag, v);
      options.precision =
          v == "bf16" ? gpt_example::Precision::kBf16 : gpt_example::Precision::kFp32;
    } else if (flag == "--device") {
      const std::string v = value;
      if (v != "cpu" && v.rfind("cuda", 0) != 0) bad_choice(flag, v);
      options.device = v;
    } else if (flag == "--lr") {
      options.lr = parse_double(flag, value);
    } else if (flag == "--text") {
      options.text_path = value;
    } else if (flag == "--corpus-mb") {
      options.corpus_bytes = static_cast<size_t>(parse_double(flag, value) * (1 << 20));
    } else if (flag == "--seed") {
      options.seed = static_cast<uint64_t>(parse_int(flag, value, 0));
    } else if (flag == "--mode") {
      mode = value;
    } else if (flag == "--config") {
      config_path = value;
    } else if (flag == "--json") {
      json_path = value;
    } else {
      std::fprintf(stderr, "gpt_trainer: unknown option %s\n", flag.c_str());
      usage();
      return 2;
    }
  }

  try {
    torchpilot::Config config = config_path.empty()
                                    ? torchpilot::Config::load()
                                    : torchpilot::Config::from_yaml_file(config_path);
    if (!mode.empty()) {
      config.mode = torchpilot::Config::from_yaml_string("mode: " + mode, "--mode").mode;
    }
    if (!json_path.empty()) config.log.json_path = json_path;

    // The reference model is far too slow for a CPU: a small default there.
    if (!sizes_given &&
        (options.device == "cpu" || (options.device.empty() && !gpt_example::cuda_available()))) {
      options.d_model = 128;
      options.layers = 2;
      options.heads = 4;
      options.seq = 64;
      options.batch = 8;
      std::printf("gpt: no GPU: the small CPU model (d 128, 2 layers, T 64, batch 8)\n");
    }
    gpt_example::Trainer trainer(options);
    const gpt_example::GptShape shape = trainer.shape();
    const double analytic = gpt_example::model_flops_per_step(shape);
    std::printf(
        "gpt: d %lld, %lld layers, %lld heads, T %lld, batch %lld (%lld tokens/step), vocab %lld; "
        "%s attention, %s, device %s, mode %s\n",
        static_cast<long long>(shape.d_model), static_cast<long long>(shape.layers),
        static_cast<long long>(options.heads), static_cast<long long>(shape.seq),
        static_cast<long long>(shape.batch),
        static_cast<long long>(gpt_example::tokens_per_step(shape)),
        static_cast<long long>(shape.vocab), trainer.fused_attention() ? "fused" : "unfused",
        gpt_example::to_string(trainer.precision()), trainer.device().c_str(),
        torchpilot::to_string(config.mode));
    std::printf(
        "gpt: %.2fM parameters, N = %.2fM matmul weights (blocks + untied LM head); corpus %lld "
        "tokens (%s)\n",
        static_cast<double>(trainer.parameter_count()) / 1e6,
        static_cast<double>(gpt_example::matmul_params(shape)) / 1e6,
        static_cast<long long>(trainer.corpus_size()),
        options.text_path.empty() ? "generated" : options.text_path.c_str());
    std::printf("gpt: analytic FLOPs/step %.4g = 6 N tokens %.4g + attention 12 B L T^2 d %.4g\n",
                analytic, gpt_example::matmul_flops_per_step(shape),
                gpt_example::attention_flops_per_step(shape));
    std::fflush(stdout);

    torchpilot::Pilot pilot(config);
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
      const double tokens = static_cast<double>(steps * gpt_example::tokens_per_step(shape));
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
          std::printf(
              "gpt: epoch %lld: counted FLOPs/step %.4g (%lld steps counted this epoch), "
              "analytic %.4g, counted/analytic %.4f (%+.2f%%)\n",
              e, f.model_flops_per_step, static_cast<long long>(f.counted_steps), analytic,
              f.model_flops_per_step / analytic, 100 * (f.model_flops_per_step / analytic - 1));
        } else {
          std::printf("gpt: epoch %lld: counted FLOPs/step: no count yet\n", e);
        }
      }
      std::fflush(stdout);
    }
    const double wall = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("gpt: %lld steps in %.1f s; last epoch loss %.4f\n", steps * epochs, wall,
                last_loss);
  } catch (const torchpilot::ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_trainer: %s\n", e.what());
    return 1;
  }
  return 0;
}
