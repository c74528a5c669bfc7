// jpeg_classifier: the torchpilot example. Trains a small CNN on a folder of JPEG images (made
// once if absent) with a TunableLoader attached to a Pilot. By default it starts as LibTorch's
// loader does (workers = 0) in autotune mode, so the advisory log shows a starved run and the
// warm-up trials turn it into a tuned one.
//
//   jpeg_classifier [--data DIR] [--steps N] [--batch B] [--workers W] [--prefetch P]
//                   [--mode off|advise|autotune] [--config FILE] [--json FILE]
//                   [--classes C] [--images-per-class K]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <string>

#include "torchpilot/runtime/config.h"
#include "torchpilot/runtime/pilot.h"
#include "trainer.h"

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: jpeg_classifier [--data DIR] [--steps N] [--batch B] [--workers W]\n"
               "                       [--prefetch P] [--mode off|advise|autotune]\n"
               "                       [--config FILE] [--json FILE]\n"
               "                       [--classes C] [--images-per-class K]\n"
               "Defaults: data/jpeg_classifier (generated if absent); --steps 0 (auto): in\n"
               "autotune mode until two epochs after the tuning decision (at least 400 steps),\n"
               "else 400 steps; batch 32,\n"
               "workers 0, prefetch 2, mode autotune (unless the config file or\n"
               "TORCHPILOT_MODE says otherwise); a generated folder has 10 classes x 160\n"
               "images.\n");
}

long parse_long(const char* flag, const char* text, long min) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < min) {
    std::fprintf(stderr, "jpeg_classifier: %s needs an integer >= %ld, got '%s'\n", flag, min,
                 text);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  jpeg_example::TrainOptions options;
  torchpilot::LoaderSettings settings;  // LibTorch's defaults: workers 0
  long steps = 0;                       // 0: auto
  std::string mode, config_path, json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      usage();
      return 0;
    }
    if (i + 1 >= argc) {
      usage();
      return 2;
    }
    const char* value = argv[++i];
    if (flag == "--data")
      options.data_dir = value;
    else if (flag == "--steps")
      steps = parse_long("--steps", value, 0);
    else if (flag == "--batch")
      options.batch_size = static_cast<int>(parse_long("--batch", value, 1));
    else if (flag == "--workers")
      settings.workers = static_cast<int>(parse_long("--workers", value, 0));
    else if (flag == "--prefetch")
      settings.prefetch = static_cast<int>(parse_long("--prefetch", value, 1));
    else if (flag == "--mode")
      mode = value;
    else if (flag == "--config")
      config_path = value;
    else if (flag == "--json")
      json_path = value;
    else if (flag == "--classes")
      options.classes = static_cast<int>(parse_long(flag.c_str(), value, 2));
    else if (flag == "--images-per-class")
      options.images_per_class = static_cast<int>(parse_long(flag.c_str(), value, 1));
    else {
      std::fprintf(stderr, "jpeg_classifier: unknown option %s\n", flag.c_str());
      usage();
      return 2;
    }
  }

  try {
    torchpilot::Config config = config_path.empty()
                                    ? torchpilot::Config::load()
                                    : torchpilot::Config::from_yaml_file(config_path);
    // The example's own default is autotune; a config file or TORCHPILOT_MODE may say otherwise.
    if (config_path.empty() && std::getenv("TORCHPILOT_MODE") == nullptr &&
        std::getenv("TORCHPILOT_CONFIG") == nullptr) {
      config.mode = torchpilot::Mode::kAutotune;
    }
    if (!mode.empty()) {
      config.mode = torchpilot::Config::from_yaml_string("mode: " + mode, "--mode").mode;
    }
    if (!json_path.empty()) config.log.json_path = json_path;

    std::printf("jpeg_classifier: preparing data in %s\n", options.data_dir.c_str());
    std::fflush(stdout);
    jpeg_example::Trainer trainer(options);
    std::printf(
        "jpeg_classifier: %lld images, %lld steps per epoch, batch %d, device %s, "
        "mode %s, starting with workers %d prefetch %d\n",
        static_cast<long long>(trainer.dataset_size()),
        static_cast<long long>(trainer.steps_per_epoch()), options.batch_size,
        trainer.device().c_str(), torchpilot::to_string(config.mode), settings.workers,
        settings.prefetch);
    std::fflush(stdout);

    torchpilot::Pilot pilot(config);
    std::function<bool()> stop;
    if (steps == 0) {
      // Auto: long enough to see the tuned setting run for two whole epochs.
      steps = config.mode == torchpilot::Mode::kAutotune ? 1000000 : 400;
      const int64_t after = 2 * trainer.steps_per_epoch();
      stop = [&pilot, after] {
        const auto& d = pilot.tuning_decision();
        if (pilot.steps() < 400 || !d) return false;  // not decided yet: keep going
        return d->trials.empty() || pilot.steps() >= d->decided_at_step + 1 + after;
      };
      if (config.mode != torchpilot::Mode::kAutotune) stop = nullptr;
    }
    jpeg_example::RunResult r = trainer.run(pilot, steps, settings, stop);

    std::printf(
        "\njpeg_classifier: %lld steps in %.1f s; last epoch loss %.3f, train accuracy "
        "%.1f%%\n",
        static_cast<long long>(r.steps), r.wall_s, r.last_loss, 100 * r.last_accuracy);
    const auto& epochs = pilot.epoch_summaries();
    if (!epochs.empty()) {
      const auto& first = epochs.front();
      const auto& last = epochs.back();
      std::printf("jpeg_classifier: epoch %lld: %.0f samples/s, data wait %.1f%% of step time\n",
                  static_cast<long long>(first.epoch), first.samples_per_s,
                  100 * first.data_wait_fraction);
      std::printf("jpeg_classifier: epoch %lld: %.0f samples/s, data wait %.1f%% of step time\n",
                  static_cast<long long>(last.epoch), last.samples_per_s,
                  100 * last.data_wait_fraction);
    }
    if (const auto& d = pilot.tuning_decision(); d && !d->trials.empty()) {
      const auto& base = d->trials.front();
      const torchpilot::TrialResult* chosen = &base;
      for (const auto& t : d->trials) {
        if (t.setting == d->chosen && !t.failed) chosen = &t;
      }
      std::printf(
          "jpeg_classifier: auto-tune, measured in warm-up trials:\n"
          "  start [%s]: %.0f %s, data wait %.1f%% of step time\n"
          "  tuned [%s]: %.0f %s, data wait %.1f%% of step time (x%.2f)\n",
          torchpilot::to_string(base.setting).c_str(), base.throughput, base.unit.c_str(),
          100 * base.data_wait_fraction, torchpilot::to_string(chosen->setting).c_str(),
          chosen->throughput, chosen->unit.c_str(), 100 * chosen->data_wait_fraction,
          base.throughput > 0 ? chosen->throughput / base.throughput : 0);
    }
  } catch (const torchpilot::ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "jpeg_classifier: %s\n", e.what());
    return 1;
  }
  return 0;
}
