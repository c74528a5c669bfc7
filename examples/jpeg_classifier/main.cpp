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
#include <exception>
#include <functional>
#include <string>

#include "cli_flags.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/loader/loader_core.h"
#include "trainer.h"

int main(int argc, char** argv) {
  jpeg_example::TrainOptions options;
  torchpilot::LoaderSettings settings;  // LibTorch's defaults: workers 0
  int64_t steps = 0;                    // 0: auto
  std::string mode, config_path, json_path;

  CLI::App app(
      "jpeg_classifier: trains a small CNN on a folder of JPEG images (made once if absent) with "
      "a TunableLoader attached to a torchpilot Pilot. By default it starts as LibTorch's loader "
      "does (workers 0) in autotune mode.",
      "jpeg_classifier");
  example_cli::last_wins(app);
  example_cli::add_path(app, "--data", options.data_dir, "DIR",
                        "image folder; generated (classes x images-per-class) if it has no images")
      ->check(example_cli::DirectoryOrAbsent())
      ->capture_default_str();
  example_cli::add_int(app, "--steps", steps, 0, 1000000000,
                       "training steps; 0 (auto): in autotune mode until two whole epochs after "
                       "the tuning decision (at least 400 steps, ending at an epoch's end), "
                       "else 400")
      ->capture_default_str();
  example_cli::add_int(app, "--batch", options.batch_size, 1, 65536, "batch size")
      ->capture_default_str();
  example_cli::add_int(app, "--workers", settings.workers, 0, torchpilot::LoaderCore::kMaxWorkers,
                       "loader workers to start with (0: batches made on the training thread)")
      ->capture_default_str();
  example_cli::add_int(app, "--prefetch", settings.prefetch, 1, 256,
                       "batches in flight per worker to start with")
      ->capture_default_str();
  example_cli::add_torchpilot_flags(app, mode, config_path, json_path, "autotune");
  example_cli::add_int(app, "--classes", options.classes, 2, 1000, "classes of a generated folder")
      ->capture_default_str();
  example_cli::add_int(app, "--images-per-class", options.images_per_class, 1, 100000,
                       "images per class of a generated folder")
      ->capture_default_str();
  example_cli::parse_or_exit(app, argc, argv);

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
