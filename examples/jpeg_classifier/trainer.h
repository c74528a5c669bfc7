// The JPEG image-classification trainer shared by the example program and the auto-tune
// benchmark: a folder of JPEG files decoded with libjpeg-turbo and augmented on the CPU in the
// loader's workers, a small CNN trained with Adam, on the GPU when there is one.
// This header is free of LibTorch so its users compile fast.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/loader/loader_records.h"

namespace jpeg_example {

struct TrainOptions {
  std::string data_dir = "data/jpeg_classifier";  // generated on first use if it has no images
  int classes = 10;                               // for generation
  int images_per_class = 160;                     // for generation
  int image_size = 256;                           // stored JPEG size, for generation
  int crop = 64;                                  // network input after random-resized crop
  int batch_size = 32;
  uint64_t seed = 1;
};

struct RunResult {
  int64_t steps = 0;
  double wall_s = 0;
  double last_loss = 0;      // mean loss over the last epoch (or partial epoch)
  double last_accuracy = 0;  // training accuracy over the same steps
};

class Trainer {
 public:
  explicit Trainer(TrainOptions options);  // finds or generates the data, builds the model
  ~Trainer();

  // Trains up to `steps` steps (across epochs) with a new TunableLoader using `settings`, attached
  // to `pilot`, stopping early when `stop` (asked at each epoch's end) says so. Ends the pilot's
  // epoch at the end, also for a partial epoch (the `steps` bound can cut one).
  RunResult run(torchpilot::Pilot& pilot, int64_t steps, const torchpilot::LoaderSettings& settings,
                const std::function<bool()>& stop = {});

  std::string device() const;  // "cpu" or "cuda:0 (NVIDIA H100 ...)"
  int64_t dataset_size() const;
  int64_t steps_per_epoch() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace jpeg_example
