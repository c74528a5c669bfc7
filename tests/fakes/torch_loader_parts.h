// What the LibTorch loader tests share: a dataset whose sample i is the tensor [i] with target i
// (optionally slow, sleep_us a sample, and throwing on one index; its size may be "endless",
// 2^40, for a sequential sampler: a random one would hold every index), a quiet config and
// Pilot options that record into a sink.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>

#include "torchpilot/runtime/core/pilot.h"

namespace torchpilot {
namespace test {

class IndexDataset : public torch::data::datasets::Dataset<IndexDataset> {
 public:
  explicit IndexDataset(size_t size, int64_t throw_on = -1, int sleep_us = 0)
      : size_(size), throw_on_(throw_on), sleep_us_(sleep_us) {}
  torch::data::Example<> get(size_t i) override {
    if (static_cast<int64_t>(i) == throw_on_) throw std::runtime_error("corrupt sample");
    if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    return {torch::full({1}, static_cast<float>(i)), torch::tensor(static_cast<int64_t>(i))};
  }
  torch::optional<size_t> size() const override { return size_; }

 private:
  size_t size_;
  int64_t throw_on_;
  int sleep_us_;
};

inline auto stacked(size_t size, int64_t throw_on = -1, int sleep_us = 0) {
  return IndexDataset(size, throw_on, sleep_us).map(torch::data::transforms::Stack<>());
}
using Stacked = decltype(stacked(1));

// Mode `mode`, torchpilot's log at warnings only.
inline Config quiet_config(Mode mode) {
  Config c;
  c.mode = mode;
  c.log.level = "warn";
  return c;
}

// PilotOptions whose only sink is `recording`.
inline PilotOptions recording_into(std::shared_ptr<RecordingSink> recording) {
  PilotOptions po;
  po.sinks.push_back(std::move(recording));
  return po;
}

}  // namespace test
}  // namespace torchpilot
