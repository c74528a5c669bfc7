// jpeg_classifier: the torchpilot example. Trains a small CNN on a folder of JPEG images (made
// once if absent) with a TunableLoader attached to a Pilot. By default it starts as LibTorch's
// loader does (workers = 0) in autotune mode, so the advisory log shows a starved run and the
// warm-up trials turn it into a tuned one.
//
//   jpeg_classifier [--data DIR] [--steps N] [--batch B] [--workers W] [--prefetch P]
//                   [--mode off|advise|autotune] [--config FILE] [--json FILE]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "torchpilot/config.h"
#include "torchpilot/pilot.h"
#include "trainer.h"

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: jpeg_classifier [--data DIR] [--steps N] [--batch B] [--workers W]\n"
               "                       [--prefetch P] [--mode off|advise|autotune]\n"
               "                       [--config FILE] [--json FILE]\n"
               "Defaults: data/jpeg_classifier (generated if absent), 400 steps, batch 32,\n"
               "workers 0, prefetch 2, mode autotune (unless the config file or\n"
               "TORCHPILOT_MODE says otherwise).\n");
}

long parse_long(const char* flag, const char* text, long min) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < min) {
    std::fprintf(stderr, "jpeg_classifier: %s needs an integer >= %ld, got '%s'\n", flag, min, text);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  jpeg_example::TrainOptions options;
  torchpilot::LoaderSettings settings;  // LibTorch's defaults: workers 0
  long steps = 400;
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
    if (flag == "--data") options.data_dir = value;
    else if (flag == "--steps") steps = parse_long("--steps", value, 1);
    else if (flag == "--batch") options.batch_size = static_cast<int>(parse_long("--batch", value, 1));
    else if (flag == "--workers") settings.workers = static_cast<int>(parse_long("--workers", value, 0));
    else if (flag == "--prefetch") settings.prefetch = static_cast<int>(parse_long("--prefetch", value, 1));
    else if (flag == "--mode") mode = value;
    else if (flag == "--config") config_path = value;
    else if (flag == "--json") json_path = value;
    else {
      std::fprintf(stderr, "jpeg_classifier: unknown option %s\n", flag.c_str());
      usage();
      return 2;
    }
  }

  try {
    torchpilot::Config config = config_path.empty() ? torchpilot::Config::load()
                                                    : torchpilot::Config::from_yaml_file(config_path);
    // The example's own default is autotune; a config file or TORCHPILOT_MODE may say otherwise.
    if (config_path.empty() && std::getenv("TORCHPILOT_MODE") == nullptr &&
        std::getenv("TORCHPILOT_CONFIG") == nullptr) {
      config.mode = torchpilot::Mode::kAutotune;
    }
    if (!mode.empty()) {
      config = torchpilot::Config::from_yaml_string("mode: " + mode, "--mode");
    }
    if (!json_path.empty()) config.json_path = json_path;

    std::printf("jpeg_classifier: preparing data in %s\n", options.data_dir.c_str());
    std::fflush(stdout);
    jpeg_example::Trainer trainer(options);
    std::printf("jpeg_classifier: %lld images, %lld steps per epoch, batch %d, device %s, "
                "mode %s, starting with workers %d prefetch %d\n",
                static_cast<long long>(trainer.dataset_size()),
                static_cast<long long>(trainer.steps_per_epoch()), options.batch_size,
                trainer.device().c_str(), torchpilot::to_string(config.mode), settings.workers,
                settings.prefetch);
    std::fflush(stdout);

    torchpilot::Pilot pilot(config);
    jpeg_example::RunResult r = trainer.run(pilot, steps, settings);

    std::printf("\njpeg_classifier: %lld steps in %.1f s; last epoch loss %.3f, train accuracy "
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
      std::printf("jpeg_classifier: tuned to [%s]: %.0f %s vs %.0f at the start (x%.2f, measured "
                  "in warm-up trials)\n",
                  torchpilot::to_string(d->chosen).c_str(), d->chosen_throughput, d->unit.c_str(),
                  d->baseline_throughput,
                  d->baseline_throughput > 0 ? d->chosen_throughput / d->baseline_throughput : 0);
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
