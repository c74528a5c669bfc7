// torchpilot::Accumulation (hooks/memory/accumulation.h): the accumulation loop over micro-batches,
// the knob "batch.micro", the per-trial memory peak from the CUDA caching allocator, and the
// recovery from an out-of-memory error during auto-tune.
#include <c10/util/Exception.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "torchpilot/hooks/memory/accumulation.h"
#include "torchpilot/runtime/memory/batch_policy.h"

#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#define TORCHPILOT_ACCUMULATION_CUDA 1
#else
#define TORCHPILOT_ACCUMULATION_CUDA 0
#endif

namespace torchpilot {
namespace {

bool is_out_of_memory(const c10::Error& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  // LibTorch 1.13 raises some out-of-memory errors as a plain c10::Error.
  return std::string(e.what()).find("out of memory") != std::string::npos;
}

// The error's first line, short enough for a log line.
std::string first_line(const std::string& what) {
  std::string line = what.substr(0, what.find('\n'));
  if (line.size() > 200) line = line.substr(0, 200) + "...";
  return line;
}

}  // namespace

struct Accumulation::Link final : Collector {
  explicit Link(Accumulation* owner) : owner(owner) {}
  std::string name() const override { return "accumulation"; }
  unsigned step_hooks() const override { return 0; }
  void attach(CollectorHost* host) override {
    if (host == nullptr) owner->pilot_ = nullptr;  // the Pilot goes: no knob, no recovery
  }
  Accumulation* owner;
};

Accumulation::Accumulation(Pilot& pilot, std::vector<at::Tensor> parameters,
                           AccumulationOptions options)
    : pilot_(&pilot), parameters_(std::move(parameters)), options_(std::move(options)) {
  if (options_.world_size < 1) throw std::invalid_argument("Accumulation: world_size must be >= 1");
  if (options_.global_batch < 1 || options_.global_batch % options_.world_size != 0) {
    throw std::invalid_argument(
        "Accumulation: global_batch " + std::to_string(options_.global_batch) +
        " must be a positive multiple of world_size " + std::to_string(options_.world_size));
  }
  rank_batch_ = options_.global_batch / options_.world_size;
  micro_ = options_.micro_batch == 0 ? rank_batch_ : options_.micro_batch;
  if (micro_ < 1 || micro_ > rank_batch_) {
    throw std::invalid_argument("Accumulation: micro_batch " + std::to_string(micro_) +
                                " must be in [1, " + std::to_string(rank_batch_) +
                                "] (the rank's batch)");
  }
  if (options_.choices.empty()) {
    for (int64_t m = 1; m <= rank_batch_; m *= 2) domain_.push_back(m);
    domain_.push_back(rank_batch_);
  } else {
    for (int64_t m : options_.choices) {
      if (m >= 1 && m <= rank_batch_) domain_.push_back(m);
    }
  }
  domain_.push_back(micro_);
  std::sort(domain_.begin(), domain_.end());
  domain_.erase(std::unique(domain_.begin(), domain_.end()), domain_.end());
  for (const auto& p : parameters_) {
    if (p.defined() && p.is_cuda()) {
      cuda_ = true;
      device_ = p.device().index();
      break;
    }
  }
  if (!options_.tune || pilot.mode() == Mode::kOff) return;
  link_ = std::make_unique<Link>(this);
  pilot.add_collector(link_.get());
  Knob knob;
  knob.name = kMicroBatchKnob;
  knob.domain = domain_;
  knob.get = [this] { return micro_; };
  knob.set = [this](int64_t value) {
    if (value < 1 || value > rank_batch_) {
      throw std::invalid_argument("batch.micro " + std::to_string(value) + " outside [1, " +
                                  std::to_string(rank_batch_) + "]");
    }
    micro_ = value;
  };
  pilot_->knobs().add(std::move(knob));
  knob_added_ = true;
  install_memory_probe();
}

Accumulation::~Accumulation() {
  if (pilot_ == nullptr) return;
  if (link_) pilot_->remove_collector(link_.get());
  if (knob_added_) pilot_->knobs().remove_prefix("batch.");
  if (probe_set_) pilot_->set_memory_probe({});
}

void Accumulation::install_memory_probe() {
  const bool searching =
      pilot_->mode() == Mode::kAutotune && pilot_->config().autotune.tune_micro_batch;
#if TORCHPILOT_ACCUMULATION_CUDA
  if (cuda_) {
    int64_t capacity = 0;
    try {
      const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
      size_t free = 0, total = 0;
      if (cudaMemGetInfo(&free, &total) == cudaSuccess) capacity = static_cast<int64_t>(total);
    } catch (...) {
    }
    if (capacity > 0) {
      auto warned = std::make_shared<bool>(false);
      const auto device = static_cast<c10::DeviceIndex>(device_);
      Pilot* pilot = pilot_;
      peak_seen_ = std::make_shared<int64_t>(0);
      auto seen = peak_seen_;
      MemoryProbe probe;
      probe.reset = [device, seen] {
        *seen = 0;
        c10::cuda::CUDACachingAllocator::resetPeakStats(device);
      };
      probe.read = [device, capacity, warned, pilot, searching,
                    seen]() -> std::optional<MemoryPeak> {
        try {
          const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
          constexpr size_t kAll = 0;  // StatType::AGGREGATE: every pool
          return MemoryPeak{std::max<int64_t>(*seen, s.allocated_bytes[kAll].peak), capacity};
        } catch (const std::exception& e) {
          if (!*warned && searching) {
            *warned = true;
            pilot->log(LogLevel::kInfo,
                       std::string("micro-batch search: memory figures missing (the allocator's "
                                   "statistics: ") +
                           first_line(e.what()) + "); micro-batches judged by samples/s alone");
          }
          return std::nullopt;
        }
      };
      pilot_->set_memory_probe(std::move(probe));
      probe_set_ = true;
      return;
    }
  }
#endif
  if (searching) {
    pilot_->log(LogLevel::kInfo,
                std::string("micro-batch search: memory figures missing (") +
                    (cuda_                          ? "the device's capacity is unknown"
                     : TORCHPILOT_ACCUMULATION_CUDA ? "the parameters are on the CPU"
                                                    : "LibTorch without CUDA") +
                    "); micro-batches judged by samples/s alone, autotune.memory_headroom unused");
  }
}

void Accumulation::step(const std::vector<at::Tensor>& batch, const MicroStep& micro_step,
                        const OptimizerStep& optimizer_step) {
  if (batch.empty() || !batch.front().defined() || batch.front().dim() == 0) {
    throw std::invalid_argument("Accumulation::step: an empty batch");
  }
  const int64_t n = batch.front().size(0);
  for (const auto& t : batch) {
    if (!t.defined() || t.dim() == 0 || t.size(0) != n) {
      throw std::invalid_argument(
          "Accumulation::step: the batch's tensors differ in length along dim 0");
    }
  }
  std::vector<Setting> attempted;  // settings that ran out of memory in this step
  for (;;) {
    const int64_t micro = micro_;
    try {
      run(batch, n, micro, micro_step);
      break;
    } catch (const c10::Error& e) {
      if (!is_out_of_memory(e) || !recover(e.what(), micro, attempted)) throw;
    }
  }
  optimizer_step();
  if (peak_seen_ && pilot_ != nullptr && pilot_->autotuning()) note_peak();
}

void Accumulation::note_peak() {
  // The memory collector resets the allocator's peak at each epoch's end: the trial's peak so far
  // is kept here, read after each of its steps.
#if TORCHPILOT_ACCUMULATION_CUDA
  try {
    const auto s =
        c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device_));
    constexpr size_t kAll = 0;
    *peak_seen_ = std::max<int64_t>(*peak_seen_, s.allocated_bytes[kAll].peak);
  } catch (...) {  // the probe's read says the figures are missing
  }
#endif
}

void Accumulation::run(const std::vector<at::Tensor>& batch, int64_t n, int64_t micro,
                       const MicroStep& micro_step) {
  micro = std::min(micro, n);  // the last batch of an epoch may be smaller
  MicroBatch m;
  m.count = (n + micro - 1) / micro;
  std::vector<at::Tensor> views(batch.size());
  for (m.index = 0; m.index < m.count; ++m.index) {
    m.offset = m.index * micro;
    m.size = std::min(micro, n - m.offset);
    m.loss_scale = static_cast<double>(m.size) / static_cast<double>(n);
    for (size_t i = 0; i < batch.size(); ++i) views[i] = batch[i].narrow(0, m.offset, m.size);
    micro_step(views, m);
  }
}

bool Accumulation::recover(const std::string& what, int64_t micro,
                           std::vector<Setting>& attempted) {
  // Outside auto-tune an out-of-memory error is the trainer's own (so it is without the knob:
  // mode off, tune off; or once the Pilot went).
  if (!link_ || pilot_ == nullptr || !pilot_->autotuning()) return false;
  const Setting before = pilot_->knobs().snapshot();
  attempted.push_back(before);
  drop_gradients();
#if TORCHPILOT_ACCUMULATION_CUDA
  if (cuda_) {
    try {
      c10::cuda::CUDACachingAllocator::emptyCache();
    } catch (...) {  // the retry shows whether memory came back
    }
  }
#endif
  ++recoveries_;
  // The trial engine restores the incumbent's setting (or starts a smaller micro-batch when the
  // start itself failed) through the knobs' setters before this returns.
  const bool failed = pilot_->fail_trial("out of memory at batch.micro=" + std::to_string(micro) +
                                         ": " + first_line(what));
  const Setting after = pilot_->knobs().snapshot();
  const bool moved = failed && after != before &&
                     std::find(attempted.begin(), attempted.end(), after) == attempted.end();
  if (!moved) {
    // Nothing to go back to (the first step, before the trials start; the start does not fit on
    // a rank that waits for the others' windows; a setting that failed in this step already):
    // the next smaller micro-batch of the domain than any that failed here.
    int64_t smallest_failed = micro;
    for (const auto& s : attempted) {
      const auto it = s.find(kMicroBatchKnob);
      if (it != s.end()) smallest_failed = std::min(smallest_failed, it->second);
    }
    int64_t smaller = 0;
    for (int64_t m : domain_) {
      if (m < smallest_failed) smaller = m;
    }
    if (smaller == 0) {
      pilot_->log(LogLevel::kError, "out of memory at batch.micro=" + std::to_string(micro) +
                                        ", the smallest micro-batch: nothing left to try");
      return false;
    }
    micro_ = smaller;
  }
  pilot_->log(LogLevel::kWarn,
              "out of memory at batch.micro=" + std::to_string(micro) +
                  " during auto-tune: the step's gradients dropped, the cache "
                  "emptied, the same " +
                  std::to_string(rank_batch_) +
                  "-sample batch runs again at batch.micro=" + std::to_string(micro_));
  return true;
}

void Accumulation::drop_gradients() {
  for (auto& p : parameters_) {
    if (p.defined() && p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

}  // namespace torchpilot
