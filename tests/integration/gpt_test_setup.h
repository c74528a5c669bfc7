// What the GPT example's tests share: the tiny model they train, a Pilot's configuration for
// them, and the loss of each step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpt_model.h"
#include "gpt_trainer.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/pilot.h"

namespace gpt_test {

// The tiny GPT of these tests: 32 wide, 2 layers of 2 heads, 16 tokens.
inline gpt_example::GptConfig tiny_gpt_model() {
  gpt_example::GptConfig c;
  c.d_model = 32;
  c.layers = 2;
  c.heads = 2;
  c.seq = 16;
  return c;
}

// That GPT trained in fp32 at a high learning rate (1e-2)
// in batches of `batch` on `device`, on a 64 KiB corpus.
inline gpt_example::TrainOptions tiny_gpt(int64_t batch, const std::string& device) {
  gpt_example::TrainOptions o;
  o.d_model = 32;
  o.layers = 2;
  o.heads = 2;
  o.seq = 16;
  o.batch = batch;
  o.lr = 1e-2;
  o.device = device;
  o.precision = gpt_example::Precision::kFp32;
  o.corpus_bytes = 1 << 16;
  return o;
}

// Mode `mode` without the GPU monitor.
inline torchpilot::Config pilot_config(torchpilot::Mode mode) {
  torchpilot::Config c;
  c.mode = mode;
  c.gpu.enabled = false;
  return c;
}

// `steps` steps of training: the mean loss of each.
inline std::vector<double> step_losses(gpt_example::Trainer& trainer, torchpilot::Pilot& pilot,
                                       int steps) {
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) {
    trainer.train(pilot, 1);
    out.push_back(trainer.take_mean_loss());
  }
  return out;
}

}  // namespace gpt_test
