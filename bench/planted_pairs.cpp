// planted_pairs: does torchpilot name a planted bottleneck, and is its estimated gain the gain
// the fix gives? (issue 10, "Planted pairs benchmark"; bench/README.md.)
//
// Each pair is a small trainer in a bad form and a fixed form:
//   data_starvation     CPU work per sample through torchpilot's TunableLoader: 1 worker vs
//                       the workers the advice names (evidence workers_advised; the cores the
//                       machine has less two when it names none)
//   pageable_copies     a large batch copied non_blocking from pageable memory every step vs
//                       the same from pinned memory
//   host_sync           host work (a CPU loop standing in for batch preparation) and GPU work
//                       per step with loss.item() every step vs the loss kept on the device
//   async_sync_every_n  gradient accumulation over micro-steps, each with host work: .item()
//                       after every micro-step vs every N optimizer steps
//   launch_bound        a deep narrow MLP at a small batch vs a larger batch (per sample)
//   fp32_matmul         the GPT example in fp32 vs bf16 autocast
//   unfused_attention   the GPT example with matmul + mask + softmax + matmul vs
//                       scaled_dot_product_attention
//   optimizer           the GPT example (small batch) with per-parameter torch::optim::AdamW vs
//                       at::_fused_adamw_ (foreach where fused is unavailable)
//   checkpoint          an MLP whose parameters are saved every --checkpoint-every steps:
//                       torch::save of the CUDA tensors on the training thread vs copied on a
//                       side stream into pinned memory and written by a background thread
//   stock_loader_cpu    CPU work per sample through LibTorch's own DataLoader (watch()):
//                       workers 0 vs the workers the advice names (else cores - 2, 2..12)
//   stock_loader_io     samples that sleep (I/O) through LibTorch's DataLoader with 2 workers
//                       vs the workers the advice names (else 8): more workers than cores help
//   checkpoint_two_models  a GAN-like pair of MLPs with Adam, both models and both optimizers
//                       saved (torch::save, in a phase "save") every --checkpoint-every steps vs
//                       no save: the cost after each save counts too
//   tuning_overrides_advice  the data_starvation trainer (TunableLoader, 1 worker); its fix is
//                       what a short autotune run (mode autotune) decides, not the advice: the
//                       row says what the advice named, what the tuner tried first and kept,
//                       and whether the advice counts as answered (runtime/tune/answered.h)
// For each pair:
//  1. Advised run: the bad form with a Pilot in advise mode (GPU collectors, a detailed window of
//     --window-steps steps from step --window-first, a FLOP counter), one epoch of
//     --advise-steps steps; the advice of that epoch is read from a RecordingSink. The expected
//     advice's expected_gain is the estimate. The fixed form gets the same run (--advise-fixed)
//     to show which advice remains.
//  2. A/B: bad and fixed alternately (the order swapped each round), each run with torchpilot
//     off (mode off, GPU collectors disabled: the step scopes are no-ops): --warmup untimed
//     steps, then --steps timed steps between two device synchronizations, repeated (each time
//     synchronized) until the run has lasted --min-run-s: a run of a fast form's 30 steps lasts
//     30-60 ms on an H100, where one host hiccup moved its throughput by tens of %. Throughput =
//     samples / time; median over --rounds rounds; measured_gain = fixed / bad - 1;
//     ratio = estimated_gain / measured_gain.
// Robustness: each pair runs inside try/catch (an error becomes the row's "error" and the next
// pair runs); pairs that need CUDA are skipped without it ("skipped": "no CUDA device"), and so
// are pairs that would start after --budget-s seconds. The JSON file is rewritten after every
// pair, so a run cut short keeps the rows it finished. Without a GPU (or --small) the sizes are
// tiny: a smoke test of the method, not a measurement.
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpt_trainer.h"
#include "harness.h"
#include "torchpilot/advisors/core/gain_models.h"
#include "torchpilot/hooks/core/compat.h"
#include "torchpilot/hooks/flops/flop_counter.h"
#include "torchpilot/hooks/loader/tunable_loader.h"
#include "torchpilot/hooks/loader/watch.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/flops/flop_records.h"
#include "torchpilot/runtime/gpu/gpu_records.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"
#include "torchpilot/runtime/tune/answered.h"

#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

using bench::median;

using bench::Clock;
using nlohmann::json;

struct Args {
  std::string device;  // empty: cuda when available
  bool small = false;  // tiny sizes (always without CUDA)
  int rounds = 5;
  int steps = 30;  // timed steps per A/B run (repeated until it lasts min_run_s)
  double min_run_s = 0.5;
  int warmup = 5;  // untimed steps before them
  int advise_steps = 40;
  int window_first = 10;
  int window_steps = 10;
  bool advise_fixed = true;
  double budget_s = 1200;
  double sample_us = 20;        // data_starvation: CPU work per sample
  double host_us = 3000;        // host_sync: host work per step (async_sync_every_n: / micro-steps)
  int micro_steps = 4;          // async_sync_every_n
  int sync_every = 8;           // async_sync_every_n, fixed form: .item() every N optimizer steps
  int checkpoint_every = 150;   // checkpoint: steps between saves (longer than a save takes)
  int sync_width = 4096;        // sync_per_micro_step: the MLP's width (GPU time per launch)
  int sync_host_us = 200;       // sync_per_micro_step: host work per micro-step
  double wait_us = 400;         // stock_loader_io: the wait per sample
  double tune_seconds = 10;     // tuning_overrides_advice: autotune.warmup_seconds
  int windows = 3;              // epochs of the advised run, a window in each (checkpoint pairs: 1)
  std::string set = "planted";  // or "second-opinion" (bench/second_opinion.h)
  double decode_us = 2000;      // second-opinion custom_dataset: CPU work per image (decoding)
  bool default_run = false;     // also an advised run under the default configuration
  int periodic_rounds = 5;      // A/B rounds of the pairs with a checkpoint period
  // launch_bound: the fixed form's batch factor, the one the advice's estimate is for.
  int launch_batch_factor = static_cast<int>(torchpilot::kLaunchBoundBatchFactor);
  std::vector<std::string> pairs;  // empty: all
  bench::RunFlags run;             // --machine, --commit, --out
  std::string trace_dir;  // report.trace_dir of the advise runs (their windows as trace files)
};

struct Env {
  torch::Device device{torch::kCPU};
  bool cuda = false;
  bool small = false;
  torch::Dtype dtype = torch::kFloat;  // the MLP workloads' weights: bf16 on CUDA
};

void sync(const Env& env) {
  if (env.cuda) torch::cuda::synchronize();
}

// --- host work --------------------------------------------------------------------------------

// A dependent chain of float operations: CPU work that no compiler removes and no intra-op thread
// pool spreads. Calibrated once to iterations per microsecond.
float cpu_work(int64_t iterations, float seed) {
  float x = seed;
  for (int64_t i = 0; i < iterations; ++i) x = x * 0.9999999f + 1e-7f * static_cast<float>(i & 7);
  return x;
}

double g_iterations_per_us = 100;

void calibrate_cpu_work() {
  int64_t n = 1 << 16;
  for (;;) {
    const auto t0 = Clock::now();
    volatile float sink = cpu_work(n, 1.0f);
    (void)sink;
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (us > 20000 || n > (int64_t{1} << 34)) {
      g_iterations_per_us = static_cast<double>(n) / std::max(us, 1.0);
      return;
    }
    n *= 2;
  }
}

int64_t iterations_for(double us) {
  return std::max<int64_t>(1, static_cast<int64_t>(us * g_iterations_per_us));
}

// What data_starvation tells a stock loader's user (evidence intra_op_threads): one intra-op
// thread, set on the training thread before the loader is made; each worker also sets it once
// (Dataset::get), off the training thread.
const std::thread::id g_training_thread = std::this_thread::get_id();
void one_intra_op_thread_in_workers() {
  thread_local bool done = false;
  if (done || std::this_thread::get_id() == g_training_thread) return;
  torch::set_num_threads(1);
  done = true;
}
// torch::set_num_threads also sets the count threads started later take: a fixed form that set it
// puts the training thread's count back at its end, so the next runs' workers start as before.
class IntraOpThreads {
 public:
  void begin() { saved_ = torch::get_num_threads(); }
  void end() {
    if (saved_ > 0) torch::set_num_threads(saved_);
  }

 private:
  int saved_ = 0;
};

// --- workloads --------------------------------------------------------------------------------

class Workload {
 public:
  virtual ~Workload() = default;
  virtual int64_t samples_per_step() const = 0;
  virtual void begin(torchpilot::Pilot& pilot) {}  // before a run (the run's Pilot)
  virtual void steps(torchpilot::Pilot& pilot, int n) = 0;
  virtual void end() {}  // after a run, the device synchronized
};

// Forward, backward and update of `net` on a squared output, in the Pilot's phases; returns the
// loss (on the device).
torch::Tensor train_step(torchpilot::Pilot& pilot, torch::nn::Sequential& net,
                         torch::optim::Optimizer& optimizer, const torch::Tensor& x) {
  torch::Tensor loss;
  {
    auto p = pilot.phase("forward");
    loss = net->forward(x).to(torch::kFloat).square().mean();
  }
  {
    auto p = pilot.phase("backward");
    optimizer.zero_grad();
    loss.backward();
  }
  {
    auto p = pilot.phase("optimizer");
    optimizer.step();
  }
  return loss;
}

// An MLP of `layers` Linear + GELU blocks, in env.dtype, trained with SGD on a squared output.
struct Mlp {
  torch::nn::Sequential net;
  std::unique_ptr<torch::optim::SGD> optimizer;
  Mlp(const Env& env, int64_t in, int64_t width, int64_t layers, int64_t out) {
    for (int64_t i = 0; i < layers; ++i) {
      net->push_back(torch::nn::Linear(i == 0 ? in : width, width));
      net->push_back(torch::nn::ReLU());
    }
    net->push_back(torch::nn::Linear(layers > 0 ? width : in, out));
    net->to(env.device, env.dtype);
    optimizer =
        std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(1e-4));
  }
  torch::Tensor train_step(torchpilot::Pilot& pilot, const torch::Tensor& x) {
    return ::train_step(pilot, net, *optimizer, x);
  }
};

// data_starvation: samples cost CPU work; the loader's workers produce them.
class SlowSamples : public torch::data::datasets::Dataset<SlowSamples> {
 public:
  SlowSamples(size_t size, int64_t features, int64_t iterations)
      : size_(size), features_(features), iterations_(iterations) {}
  void set_one_thread(bool on) { one_thread_ = on; }
  torch::data::Example<> get(size_t index) override {
    if (one_thread_) one_intra_op_thread_in_workers();
    const float v = cpu_work(iterations_, static_cast<float>(index % 97));
    torch::Tensor data = torch::full({features_}, v * 1e-3f);
    return {data, torch::tensor(static_cast<int64_t>(index % 10))};
  }
  torchpilot::compat::optional<size_t> size() const override { return size_; }

 private:
  size_t size_;
  int64_t features_;
  int64_t iterations_;
  bool one_thread_ = false;
};

class DataStarvation : public Workload {
 public:
  using Data = torch::data::datasets::MapDataset<SlowSamples, torch::data::transforms::Stack<>>;
  DataStarvation(const Env& env, const Args& a, bool fixed)
      : env_(env),
        batch_(env.small ? 32 : 256),
        features_(env.small ? 768 : 3072),
        mlp_(env, features_, env.small ? 256 : 4096, env.small ? 2 : 4, 10),
        // Small sizes run on a CPU whose compute is slow: more work per sample keeps it starved.
        iterations_(iterations_for(env.small ? 50 * a.sample_us : a.sample_us)),
        workers_(fixed ? std::max(2, std::min(torchpilot::affinity_cpu_count() - 2, 12)) : 1) {}
  int64_t samples_per_step() const override { return batch_; }
  int workers() const { return workers_; }
  // The fixed form as the advice on the bad form has it (evidence workers_advised).
  void set_workers(int n) { workers_ = std::max(1, n); }
  // tuning_overrides_advice: the fixed form is what the tuner kept.
  void set_prefetch(int n) { prefetch_ = std::max(1, n); }
  int prefetch() const { return prefetch_; }
  void begin(torchpilot::Pilot& pilot) override {
    torchpilot::LoaderOptions o;
    o.batch_size = static_cast<size_t>(batch_);
    o.workers = workers_;
    o.prefetch = prefetch_;
    o.pin_memory = env_.cuda;
    o.shuffle = false;
    o.drop_last = true;
    // Far more samples than a run takes: no epoch ends inside a run.
    Data data = SlowSamples(static_cast<size_t>(batch_) * 1000000, features_, iterations_)
                    .map(torch::data::transforms::Stack<>());
    loader_ = std::make_unique<torchpilot::TunableLoader<Data>>(std::move(data), o);
    loader_->attach(pilot);
    loader_->start_epoch();
  }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      auto batch = loader_->next();
      if (!batch) throw std::runtime_error("data_starvation: the loader ran out of samples");
      auto step = pilot.step(batch_);
      torch::Tensor x = batch->data.to(env_.device, env_.dtype, /*non_blocking=*/true);
      mlp_.train_step(pilot, x);
    }
  }
  void end() override { loader_.reset(); }  // joins the workers before the run's Pilot goes

 private:
  Env env_;
  int64_t batch_, features_;
  Mlp mlp_;
  int64_t iterations_;
  int workers_;
  int prefetch_ = 4;
  std::unique_ptr<torchpilot::TunableLoader<Data>> loader_;
};

// pageable_copies: a [B, 3, 224, 224] batch from host memory each step into a small CNN.
class PageableCopies : public Workload {
 public:
  PageableCopies(const Env& env, bool fixed) : env_(env), fixed_(fixed) {
    host_ = torch::rand({kBatch, 3, 224, 224});
    if (fixed_) host_ = host_.pin_memory();
    net_->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 7).stride(2).padding(3)));
    net_->push_back(torch::nn::ReLU());
    net_->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 128, 3).stride(2).padding(1)));
    net_->push_back(torch::nn::ReLU());
    net_->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(128, 256, 3).stride(2).padding(1)));
    net_->push_back(torch::nn::ReLU());
    net_->push_back(torch::nn::AdaptiveAvgPool2d(1));
    net_->push_back(torch::nn::Flatten());
    net_->push_back(torch::nn::Linear(256, 1000));
    net_->to(env.device, env.dtype);
    optimizer_ =
        std::make_unique<torch::optim::SGD>(net_->parameters(), torch::optim::SGDOptions(1e-4));
  }
  int64_t samples_per_step() const override { return kBatch; }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      auto step = pilot.step(kBatch);
      torch::Tensor x;
      {
        auto p = pilot.phase("copy");
        // Both non_blocking: from pageable memory the driver stages the batch through its own
        // buffer, so the host still waits for the GPU to reach the copy and run it; pinned, it
        // returns at once. (A blocking copy from pageable memory synchronizes: host_sync names
        // that one, with pinning as its first action.)
        x = host_.to(env_.device, /*non_blocking=*/true).to(env_.dtype);
      }
      train_step(pilot, net_, *optimizer_, x);
    }
  }

 private:
  static constexpr int64_t kBatch = 64;
  Env env_;
  bool fixed_;
  torch::Tensor host_;
  torch::nn::Sequential net_;
  std::unique_ptr<torch::optim::SGD> optimizer_;
};

// host_sync and async_sync_every_n: per micro-step, host work (a CPU loop standing in for batch
// preparation) then a forward/backward on the GPU; an optimizer step after `micro` micro-steps.
// Bad: loss.item() after every micro-step. Fixed: the loss summed on the device and read every
// `read_every` optimizer steps. Without the syncs the host prepares the next micro-batch while
// the GPU computes the current one; with them the two take turns. Sized so that the GPU's work
// per micro-step (H100, bf16: ~7 ms for host_sync, ~3 ms per micro-step for async_sync_every_n)
// exceeds the host's (its work plus ~2 ms of launches): the fixed form is GPU-bound and the sync's
// cost is the host work the GPU waits through, which is what the advice measures. With a GPU
// faster than the host, removing the sync removes only the short drain wait: the first sizes
// (1.8 ms of GPU work, 3.4 ms of host per step, both forms host-bound) measured -11% and -21%,
// the fixed forms' runs spread widely; that spread is not explained.
class SyncingTrainer : public Workload {
 public:
  SyncingTrainer(const Env& env, double host_us, int micro, int read_every, bool fixed,
                 int64_t width, int64_t layers, int64_t batch)
      : env_(env),
        mlp_(env, width, width, layers, width),
        iterations_(iterations_for(host_us)),
        micro_(micro),
        read_every_(read_every),
        fixed_(fixed),
        batch_(batch) {
    x_ = torch::randn({batch, width}, torch::TensorOptions().device(env.device).dtype(env.dtype));
    loss_sum_ = torch::zeros({}, torch::TensorOptions().device(env.device));
  }
  int64_t samples_per_step() const override { return batch_ * micro_; }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      auto step = pilot.step(samples_per_step());
      mlp_.optimizer->zero_grad();
      for (int k = 0; k < micro_; ++k) {
        {
          auto p = pilot.phase("prepare");
          sink_ += cpu_work(iterations_, static_cast<float>(k));
        }
        torch::Tensor loss;
        {
          auto p = pilot.phase("forward");
          loss = mlp_.net->forward(x_).to(torch::kFloat).square().mean();
        }
        {
          auto p = pilot.phase("backward");
          loss.backward();
        }
        if (!fixed_) {
          sink_ += loss.item<float>();  // the planted sync: logging every micro-step's loss
        } else {
          loss_sum_ += loss.detach();
        }
      }
      {
        auto p = pilot.phase("optimizer");
        mlp_.optimizer->step();
      }
      if (fixed_ && ++steps_ % read_every_ == 0) sink_ += loss_sum_.item<float>();
    }
  }

 private:
  Env env_;
  Mlp mlp_;
  int64_t iterations_;
  int micro_, read_every_;
  bool fixed_;
  int64_t batch_;
  torch::Tensor x_, loss_sum_;
  int64_t steps_ = 0;
  float sink_ = 0;
};

// sync_per_micro_step: 8 micro-steps of an fp32 MLP (width --sync-width), each after some host
// work (--sync-host-us: its micro-batch prepared), loss.item() after each of them, and one device
// synchronization at the step's end by design (a trainer that times its steps). Fixed: no .item()
// (the loss summed on the device), the step-end sync kept. Removing the reads lets the host
// prepare the next micro-batch while the GPU computes; it gives back no drain of the step's end.
// Without host work removing them gives back only each read's drain, a few percent that the A/B
// runs did not resolve (width 512 to 2048 on H200s: -12% to +12%); at width 4096 with 200 us of
// host work a micro-step the fix measured +11% (1ef82ac).
class SyncPerMicroStep : public Workload {
 public:
  SyncPerMicroStep(const Env& env, const Args& a, bool fixed)
      : env_(env), fixed_(fixed), batch_(env.small ? 32 : 256), micro_(8) {
    Env fp32 = env;
    fp32.dtype = torch::kFloat;
    const int64_t width = env.small ? std::min<int64_t>(a.sync_width, 64) : a.sync_width;
    mlp_ = std::make_unique<Mlp>(fp32, width, width, 3, width);
    iterations_ = iterations_for(a.sync_host_us);
    x_ = torch::randn({batch_, width}, torch::TensorOptions().device(env.device));
    loss_sum_ = torch::zeros({}, torch::TensorOptions().device(env.device));
  }
  int64_t samples_per_step() const override { return batch_ * micro_; }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      auto step = pilot.step(samples_per_step());
      mlp_->optimizer->zero_grad();
      for (int k = 0; k < micro_; ++k) {
        if (iterations_ > 0) {
          auto p = pilot.phase("prepare");
          sink_ += cpu_work(iterations_, static_cast<float>(k));
        }
        torch::Tensor loss;
        {
          auto p = pilot.phase("forward");
          loss = mlp_->net->forward(x_).square().mean();
        }
        {
          auto p = pilot.phase("backward");
          loss.backward();
        }
        if (!fixed_) {
          sink_ += loss.item<float>();  // the planted sync: every micro-step's loss read
        } else {
          loss_sum_ += loss.detach();
        }
      }
      {
        auto p = pilot.phase("optimizer");
        mlp_->optimizer->step();
      }
      sync(env_);  // by design, in both forms
    }
  }

 private:
  Env env_;
  bool fixed_;
  int64_t batch_;
  int micro_;
  int64_t iterations_ = 0;
  std::unique_ptr<Mlp> mlp_;
  torch::Tensor x_, loss_sum_;
  float sink_ = 0;
};

// pageable_copy_sync: a 138 MB batch ([128, 3, 300, 300] fp32) copied from pageable memory each
// step into a small CNN, and the device synchronized at each step's end. Fixed: the batch pinned
// and copied non_blocking, the sync kept. One idle, two candidate causes: the copy makes the host
// wait whether or not the sync follows, so the idle is the copy's (issue: the attribution flipped
// between windows of identical steps).
class PageableCopySync : public Workload {
 public:
  PageableCopySync(const Env& env, bool fixed) : env_(env), fixed_(fixed) {
    const int64_t batch = env.small ? 4 : 128;
    host_ = torch::rand({batch, 3, 300, 300});
    if (fixed_ && env.cuda) host_ = host_.pin_memory();
    net_->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 7).stride(4).padding(3)));
    net_->push_back(torch::nn::ReLU());
    net_->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).stride(2).padding(1)));
    net_->push_back(torch::nn::ReLU());
    net_->push_back(torch::nn::AdaptiveAvgPool2d(1));
    net_->push_back(torch::nn::Flatten());
    net_->push_back(torch::nn::Linear(64, 10));
    net_->to(env.device, env.dtype);
    optimizer_ =
        std::make_unique<torch::optim::SGD>(net_->parameters(), torch::optim::SGDOptions(1e-4));
  }
  int64_t samples_per_step() const override { return host_.size(0); }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      auto step = pilot.step(samples_per_step());
      torch::Tensor x;
      {
        auto p = pilot.phase("copy");
        // The bad form as trainers write it: a blocking .to(device).
        x = host_.to(env_.device, /*non_blocking=*/fixed_).to(env_.dtype);
      }
      train_step(pilot, net_, *optimizer_, x);
      sync(env_);  // by design, in both forms
    }
  }

 private:
  Env env_;
  bool fixed_;
  torch::Tensor host_;
  torch::nn::Sequential net_;
  std::unique_ptr<torch::optim::SGD> optimizer_;
};

// launch_bound: a deep narrow MLP whose kernels are too short to hide their launches.
class LaunchBound : public Workload {
 public:
  LaunchBound(const Env& env, int64_t batch)
      : width_(env.small ? 128 : 1024),
        mlp_(env, width_, width_, env.small ? 4 : 24, width_),
        batch_(batch) {
    x_ = torch::randn({batch, width_}, torch::TensorOptions().device(env.device).dtype(env.dtype));
  }
  int64_t samples_per_step() const override { return batch_; }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      auto step = pilot.step(batch_);
      mlp_.train_step(pilot, x_);
    }
  }

 private:
  int64_t width_;
  Mlp mlp_;
  int64_t batch_;
  torch::Tensor x_;
};

// fp32_matmul, unfused_attention, optimizer: the GPT example's trainer.
class Gpt : public Workload {
 public:
  explicit Gpt(gpt_example::TrainOptions options) : trainer_(std::move(options)) {}
  int64_t samples_per_step() const override {
    return trainer_.options().batch * trainer_.options().seq;
  }
  void steps(torchpilot::Pilot& pilot, int n) override { trainer_.train(pilot, n); }
  void end() override { trainer_.take_mean_loss(); }  // keeps the running sum small
  const gpt_example::Trainer& trainer() const { return trainer_; }

 private:
  gpt_example::Trainer trainer_;
};

gpt_example::TrainOptions gpt_options(const Env& env, int64_t d, int64_t layers, int64_t seq,
                                      int64_t batch) {
  gpt_example::TrainOptions o;
  o.device = env.device.str();
  if (env.small) {
    d = 64;
    layers = 2;
    seq = 32;
    batch = 2;
  }
  o.d_model = d;
  o.layers = layers;
  o.heads = std::max<int64_t>(1, d / 64);
  o.seq = seq;
  o.batch = batch;
  o.corpus_bytes = size_t{1} << 20;
  return o;
}

// checkpoint: the parameters saved every `every` steps, at the middle of each period (a timed
// run's last save is followed by half a period, in which the fixed form's writer finishes).
// Bad: torch::save of the CUDA parameters on the training thread: the copies to pageable host
// memory wait for the GPU's queue, then the file is written while the GPU idles. Fixed: copied on
// a side stream into pinned buffers (the training stream waits for the copies on the GPU, not the
// host), then written from a background thread; a save still running at the next checkpoint is
// waited for. Nothing names the work as a phase: the cause comes from the sync probe.
class Checkpointing : public Workload {
 public:
  Checkpointing(const Env& env, const Args& a, bool fixed)
      : env_(env),
        fixed_(fixed),
        every_(a.checkpoint_every),
        batch_(env.small ? 64 : 8192),
        mlp_(env, env.small ? 256 : 2048, env.small ? 256 : 2048, env.small ? 2 : 4,
             env.small ? 256 : 2048) {
    x_ = torch::randn({batch_, env.small ? 256 : 2048},
                      torch::TensorOptions().device(env.device).dtype(env.dtype));
    params_ = mlp_.net->parameters();
    path_ = std::string(std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp") +
            "/torchpilot-planted-checkpoint-" + (fixed ? "async" : "sync") + ".pt";
  }
  ~Checkpointing() override {
    try {
      end();
    } catch (...) {
    }
    std::remove(path_.c_str());
  }
  int64_t samples_per_step() const override { return batch_; }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      auto step = pilot.step(batch_);
      mlp_.train_step(pilot, x_);
      if (++count_ % every_ == every_ / 2) fixed_ ? save_async() : save();
    }
  }
  void end() override {
    if (writer_.valid()) writer_.get();
  }
  double megabytes() const {
    double b = 0;
    for (const auto& p : params_) b += static_cast<double>(p.nbytes());
    return b / 1e6;
  }

 private:
  void save() { torch::save(params_, path_); }
  void save_async() {
    if (writer_.valid()) writer_.get();  // its buffers are about to be reused
    if (host_.empty()) {
      for (const auto& p : params_) {
        host_.push_back(torch::empty(
            p.sizes(), torch::TensorOptions().dtype(p.dtype()).pinned_memory(env_.cuda)));
      }
    }
#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
    if (env_.cuda) {
      if (!side_) side_ = c10::cuda::getStreamFromPool(false, env_.device.index());
      auto train = c10::cuda::getCurrentCUDAStream(env_.device.index());
      ready_.record(train);
      ready_.block(*side_);
      {
        c10::cuda::CUDAStreamGuard guard(*side_);
        for (size_t i = 0; i < params_.size(); ++i) {
          host_[i].copy_(params_[i].detach(), /*non_blocking=*/true);
        }
      }
      copied_.record(*side_);
      copied_.block(train);  // the next optimizer step waits for the copies, on the GPU
      writer_ = std::async(std::launch::async, [this] {
        copied_.synchronize();
        torch::save(host_, path_);
      });
      return;
    }
#endif
    for (size_t i = 0; i < params_.size(); ++i) host_[i].copy_(params_[i].detach());
    writer_ = std::async(std::launch::async, [this] { torch::save(host_, path_); });
  }

  Env env_;
  bool fixed_;
  int every_;
  int64_t batch_;
  Mlp mlp_;
  torch::Tensor x_;
  std::vector<torch::Tensor> params_, host_;
  std::string path_;
  int64_t count_ = 0;
  std::future<void> writer_;
#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
  std::optional<c10::cuda::CUDAStream> side_;
  at::cuda::CUDAEvent ready_, copied_;
#endif
};

// stock_loader_io: samples that wait (a read from a slow disk or the network) without using a
// core.
class WaitingSamples : public torch::data::datasets::Dataset<WaitingSamples> {
 public:
  WaitingSamples(size_t size, int64_t features, double wait_us)
      : size_(size), features_(features), wait_us_(wait_us) {}
  void set_one_thread(bool on) { one_thread_ = on; }
  torch::data::Example<> get(size_t index) override {
    if (one_thread_) one_intra_op_thread_in_workers();
    std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(wait_us_));
    return {torch::full({features_}, static_cast<float>(index % 97) * 1e-3f),
            torch::tensor(static_cast<int64_t>(index % 10))};
  }
  torchpilot::compat::optional<size_t> size() const override { return size_; }

 private:
  size_t size_;
  int64_t features_;
  double wait_us_;
  bool one_thread_ = false;
};

// stock_loader_cpu, stock_loader_io: LibTorch's own DataLoader, measured through watch() (no
// tuning). One pass over a dataset far larger than a run: the watched loop goes on across
// steps() calls; end() leaves it (ending the Pilot's epoch, as a loop left early does).
template <typename Samples>
class StockLoader : public Workload {
 public:
  using Data = torch::data::datasets::MapDataset<Samples, torch::data::transforms::Stack<>>;
  using Loader = torch::data::StatelessDataLoader<Data, torch::data::samplers::SequentialSampler>;
  using Watched = torchpilot::WatchedLoader<Loader>;
  StockLoader(const Env& env, std::function<Samples(size_t, int64_t)> samples, int64_t batch,
              int64_t features, int workers)
      : env_(env),
        samples_(std::move(samples)),
        batch_(batch),
        features_(features),
        mlp_(env, features, env.small ? 256 : 4096, env.small ? 2 : 4, 10),
        workers_(workers) {}
  int64_t samples_per_step() const override { return batch_; }
  int workers() const { return workers_; }
  void set_workers(int n) { workers_ = std::max(1, n); }
  void set_one_thread(bool on) { one_thread_ = on; }
  void begin(torchpilot::Pilot& pilot) override {
    threads_.begin();
    // Far more samples than a run takes; a sequential sampler allocates no index list.
    const auto size = static_cast<size_t>(batch_) * 1000000;
    // The advice's fix: one intra-op thread on the training thread before the loader is made
    // (the workers it starts then take one too; each also sets it itself).
    if (one_thread_) torch::set_num_threads(1);
    Samples samples = samples_(size, features_);
    samples.set_one_thread(one_thread_);
    loader_ = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
        std::move(samples).map(torch::data::transforms::Stack<>()),
        torch::data::DataLoaderOptions()
            .batch_size(static_cast<size_t>(batch_))
            .workers(static_cast<size_t>(workers_)));
    watched_ = std::make_unique<Watched>(*loader_, pilot);
  }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      if (!it_) {
        it_.emplace(watched_->begin());
      } else {
        ++*it_;
      }
      auto step = pilot.step(batch_);
      torch::Tensor x = (*it_)->data.to(env_.device, env_.dtype);
      mlp_.train_step(pilot, x);
    }
  }
  void end() override {
    it_.reset();  // the loop left: the pass (and the Pilot's epoch) ends
    watched_.reset();
    loader_.reset();  // joins the workers before the run's Pilot goes
    threads_.end();
  }

 private:
  Env env_;
  bool one_thread_ = false;
  IntraOpThreads threads_;
  std::function<Samples(size_t, int64_t)> samples_;
  int64_t batch_, features_;
  Mlp mlp_;
  int workers_;
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<Watched> watched_;
  std::optional<typename Watched::Iterator> it_;
};

// checkpoint_two_models: a GAN-like trainer (a generator and a discriminator, each an MLP with
// Adam) that saves both models and both optimizers every --checkpoint-every steps on the
// training thread; the fixed form does not save. What a save costs shows in the step that saves
// and in the steps after it (the allocator, the page cache, the GPU's queue).
class TwoModelCheckpoint : public Workload {
 public:
  TwoModelCheckpoint(const Env& env, const Args& a, bool fixed)
      : env_(env),
        fixed_(fixed),
        every_(a.checkpoint_every),
        batch_(env.small ? 64 : 1024),
        // Small: about 12 MB a save, still several median steps of a CPU run.
        width_(env.small ? 512 : 2048),
        generator_(make(env, width_, env.small ? 3 : 4, width_)),
        discriminator_(make(env, width_, env.small ? 3 : 4, 1)),
        g_opt_(generator_->parameters(), torch::optim::AdamOptions(1e-4)),
        d_opt_(discriminator_->parameters(), torch::optim::AdamOptions(1e-4)) {
    const auto o = torch::TensorOptions().device(env.device).dtype(env.dtype);
    z_ = torch::randn({batch_, width_}, o);
    real_ = torch::randn({batch_, width_}, o);
    const std::string dir = std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp";
    g_path_ = dir + "/torchpilot-planted-gan-g.pt";
    d_path_ = dir + "/torchpilot-planted-gan-d.pt";
  }
  ~TwoModelCheckpoint() override {
    std::remove(g_path_.c_str());
    std::remove(d_path_.c_str());
  }
  int64_t samples_per_step() const override { return batch_; }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      auto step = pilot.step(batch_);
      torch::Tensor fake, d_loss, g_loss;
      {
        auto p = pilot.phase("forward");
        fake = generator_->forward(z_);
        d_loss = discriminator_->forward(fake.detach()).to(torch::kFloat).square().mean() +
                 (discriminator_->forward(real_).to(torch::kFloat) - 1).square().mean();
      }
      {
        auto p = pilot.phase("backward");
        d_opt_.zero_grad();
        d_loss.backward();
      }
      {
        auto p = pilot.phase("optimizer");
        d_opt_.step();
      }
      {
        auto p = pilot.phase("forward");
        g_loss = (discriminator_->forward(fake).to(torch::kFloat) - 1).square().mean();
      }
      {
        auto p = pilot.phase("backward");
        g_opt_.zero_grad();
        g_loss.backward();
      }
      {
        auto p = pilot.phase("optimizer");
        g_opt_.step();
      }
      if (!fixed_ && ++count_ % every_ == every_ / 2) {
        auto p = pilot.phase("save");
        torch::serialize::OutputArchive g, d;
        generator_->save(g);
        g_opt_.save(g);
        discriminator_->save(d);
        d_opt_.save(d);
        g.save_to(g_path_);
        d.save_to(d_path_);
      }
    }
  }

 private:
  static torch::nn::Sequential make(const Env& env, int64_t width, int64_t layers, int64_t out) {
    torch::nn::Sequential net;
    for (int64_t i = 0; i < layers; ++i) {
      net->push_back(torch::nn::Linear(width, width));
      net->push_back(torch::nn::ReLU());
    }
    net->push_back(torch::nn::Linear(width, out));
    net->to(env.device, env.dtype);
    return net;
  }

  Env env_;
  bool fixed_;
  int every_;
  int64_t batch_, width_;
  torch::nn::Sequential generator_, discriminator_;
  torch::optim::Adam g_opt_, d_opt_;
  torch::Tensor z_, real_;
  std::string g_path_, d_path_;
  int64_t count_ = 0;
};

// --- pairs ------------------------------------------------------------------------------------

struct Pair {
  std::string name;
  std::string advice;   // the advice id expected on the bad form
  std::string keyword;  // a word its text should contain to name this cause ("" = none)
  bool needs_cuda = false;
  std::string bad, fixed;  // what the forms are
  // Why the pair cannot run in this build ("" = it can).
  std::function<std::string(const Env&)> unavailable;
  std::function<std::unique_ptr<Workload>(const Env&, const Args&, bool fixed)> make;
};

// Steps of the advised run and of each timed run: --advise-steps and --steps, more where a pair
// needs it. checkpoint: the period is known after three stalls and the sync probe probes the next
// ones (6.5 periods); a timed run holds whole periods (4).
// The period of a pair that saves checkpoints, in steps (0: none).
int period_of(const Pair& pair, const Args& a) {
  if (pair.name == "checkpoint" || pair.name == "checkpoint_two_models") return a.checkpoint_every;
  if (pair.name == "dcgan") return 200;  // the example's kCheckpointEvery
  return 0;
}
int advise_steps_for(const Pair& pair, const Args& a) {
  if (const int p = period_of(pair, a)) return std::max(a.advise_steps, 6 * p + p / 2);
  return a.advise_steps;
}
// Epochs (windows) of the advised run: one for the checkpoint pairs, whose epochs are long.
int windows_for(const Pair& pair, const Args& a) { return period_of(pair, a) > 0 ? 1 : a.windows; }
int timed_steps_for(const Pair& pair, const Args& a) {
  if (const int p = period_of(pair, a)) return std::max(a.steps, 4 * p);
  return a.steps;
}

std::vector<Pair> all_pairs() {
  std::vector<Pair> pairs;
  pairs.push_back({"data_starvation", "data_starvation", "", false,
                   "TunableLoader, 1 worker, CPU work per sample",
                   "TunableLoader, the workers the advice names (else cores - 2, 2..12)", nullptr,
                   [](const Env& env, const Args& a, bool fixed) -> std::unique_ptr<Workload> {
                     return std::make_unique<DataStarvation>(env, a, fixed);
                   }});
  pairs.push_back({"pageable_copies", "pageable_copies", "", true,
                   "a 38.5 MB batch from pageable memory each step, copied non_blocking",
                   "the same batch pinned, copied non_blocking", nullptr,
                   [](const Env& env, const Args&, bool fixed) -> std::unique_ptr<Workload> {
                     return std::make_unique<PageableCopies>(env, fixed);
                   }});
  pairs.push_back(
      {"host_sync", "host_sync", "", false, "host work + GPU work per step, loss.item() every step",
       "the loss kept on the device", nullptr,
       [](const Env& env, const Args& a, bool fixed) -> std::unique_ptr<Workload> {
         return std::make_unique<SyncingTrainer>(env, a.host_us, 1, 1000000000, fixed,
                                                 env.small ? 128 : 4096, env.small ? 4 : 8,
                                                 env.small ? 64 : 4096);
       }});
  pairs.push_back({"async_sync_every_n", "host_sync", "", false,
                   "micro-steps with host work, .item() after every micro-step",
                   "the loss summed on the device, .item() every N optimizer steps", nullptr,
                   [](const Env& env, const Args& a, bool fixed) -> std::unique_ptr<Workload> {
                     return std::make_unique<SyncingTrainer>(
                         env, a.host_us / a.micro_steps, a.micro_steps, a.sync_every, fixed,
                         env.small ? 128 : 4096, env.small ? 2 : 4, env.small ? 32 : 3072);
                   }});
  pairs.push_back(
      {"launch_bound", "launch_bound", "", false,
       "a 24-layer 1024-wide MLP at batch 32 (small: 4 layers of 128, batch 8)",
       "the same at batch 32 x --launch-batch-factor (default: the factor the "
       "advice estimates for; throughput per sample)",
       nullptr, [](const Env& env, const Args& a, bool fixed) -> std::unique_ptr<Workload> {
         const int64_t batch = env.small ? 8 : 32;
         return std::make_unique<LaunchBound>(env, fixed ? batch * a.launch_batch_factor : batch);
       }});
  pairs.push_back(
      {"fp32_matmul", "fp32_matmul", "", true, "GPT d 1024, 4 layers, T 1024, batch 4, fp32",
       "the same with bf16 autocast", nullptr,
       [](const Env& env, const Args&, bool fixed) -> std::unique_ptr<Workload> {
         auto o = gpt_options(env, 1024, 4, 1024, 4);
         o.precision = fixed ? gpt_example::Precision::kBf16 : gpt_example::Precision::kFp32;
         return std::make_unique<Gpt>(o);
       }});
  pairs.push_back(
      {"unfused_attention", "unfused_attention", "", false,
       "GPT d 1024, 4 layers, T 1024, batch 4, bf16, matmul + mask + softmax + matmul",
       "the same with scaled_dot_product_attention",
       [](const Env&) -> std::string {
         return TORCHPILOT_TORCH_AT_LEAST(2, 0)
                    ? ""
                    : "the fixed form needs at::scaled_dot_product_attention (LibTorch >= 2.0)";
       },
       [](const Env& env, const Args&, bool fixed) -> std::unique_ptr<Workload> {
         auto o = gpt_options(env, 1024, 4, 1024, 4);
         o.fused_attention = fixed;
         return std::make_unique<Gpt>(o);
       }});
  pairs.push_back({"linear_bias", "unfused_linear_bias", "", true,
                   "GPT d 1024, 12 layers, T 1024, batch 8, bf16, torch::nn::Linear's forward "
                   "(matmul, then += bias on 3-D inputs)",
                   "the same with torch::linear (the bias in the GEMM's epilogue)", nullptr,
                   [](const Env& env, const Args&, bool fixed) -> std::unique_ptr<Workload> {
                     auto o = gpt_options(env, 1024, 12, 1024, 8);
                     o.aten_linear = fixed;
                     return std::make_unique<Gpt>(o);
                   }});
  pairs.push_back({"optimizer", "per_parameter_optimizer", "", false,
                   "GPT d 512, 12 layers, T 256, batch 2, bf16, per-parameter torch::optim::AdamW",
                   "the same with at::_fused_adamw_ (foreach where fused is unavailable)", nullptr,
                   [](const Env& env, const Args&, bool fixed) -> std::unique_ptr<Workload> {
                     auto o = gpt_options(env, 512, 12, 256, 2);
                     o.optimizer = fixed ? gpt_example::Optimizer::kFused
                                         : gpt_example::Optimizer::kPerParameter;
                     return std::make_unique<Gpt>(o);
                   }});
  pairs.push_back({"checkpoint", "periodic_stall", "checkpoint", true,
                   "a 2048-wide 4-layer MLP at batch 8192, torch::save of its CUDA parameters "
                   "every --checkpoint-every steps",
                   "the parameters copied on a side stream into pinned memory and saved from a "
                   "background thread",
                   nullptr,
                   [](const Env& env, const Args& a, bool fixed) -> std::unique_ptr<Workload> {
                     return std::make_unique<Checkpointing>(env, a, fixed);
                   }});
  pairs.push_back(
      {"stock_loader_cpu", "data_starvation", "", false,
       "LibTorch's DataLoader through watch(), workers 0, CPU work per sample",
       "the same with the workers the advice names (else cores - 2, 2..12)", nullptr,
       [](const Env& env, const Args& a, bool fixed) -> std::unique_ptr<Workload> {
         const int64_t features = env.small ? 768 : 3072;
         const int64_t iterations = iterations_for(env.small ? 50 * a.sample_us : a.sample_us);
         return std::make_unique<StockLoader<SlowSamples>>(
             env, [iterations](size_t size, int64_t f) { return SlowSamples(size, f, iterations); },
             env.small ? 32 : 256, features,
             fixed ? std::max(2, std::min(torchpilot::affinity_cpu_count() - 2, 12)) : 0);
       }});
  pairs.push_back(
      {"stock_loader_io", "data_starvation", "", false,
       "LibTorch's DataLoader through watch(), 2 workers, each sample waits --wait-us (I/O)",
       "the same with the workers the advice names (else 8; more than the cores can help)", nullptr,
       [](const Env& env, const Args& a, bool fixed) -> std::unique_ptr<Workload> {
         // Small sizes compute slowly on a CPU: a longer wait keeps the loader the bottleneck.
         const double wait_us = env.small ? 4 * a.wait_us : a.wait_us;
         return std::make_unique<StockLoader<WaitingSamples>>(
             env, [wait_us](size_t size, int64_t f) { return WaitingSamples(size, f, wait_us); },
             env.small ? 16 : 64, env.small ? 768 : 3072, fixed ? 8 : 2);
       }});
  pairs.push_back({"checkpoint_two_models", "periodic_stall", "checkpoint", false,
                   "a GAN-like pair of MLPs with Adam, both models and both optimizers saved "
                   "(torch::save) every --checkpoint-every steps",
                   "no save", nullptr,
                   [](const Env& env, const Args& a, bool fixed) -> std::unique_ptr<Workload> {
                     return std::make_unique<TwoModelCheckpoint>(env, a, fixed);
                   }});
  pairs.push_back({"sync_per_micro_step", "host_sync", "", true,
                   "8 micro-steps of an fp32 MLP, each after host work, loss.item() after "
                   "each, a device sync at each step's end",
                   "no .item() (the loss summed on the device), the step-end sync kept", nullptr,
                   [](const Env& env, const Args& a, bool fixed) -> std::unique_ptr<Workload> {
                     return std::make_unique<SyncPerMicroStep>(env, a, fixed);
                   }});
  pairs.push_back({"pageable_copy_sync", "pageable_copies", "", true,
                   "a 138 MB batch from pageable memory each step (blocking .to), a device sync "
                   "at each step's end",
                   "the batch pinned, copied non_blocking, the sync kept", nullptr,
                   [](const Env& env, const Args&, bool fixed) -> std::unique_ptr<Workload> {
                     return std::make_unique<PageableCopySync>(env, fixed);
                   }});
  pairs.push_back({"tuning_overrides_advice", "data_starvation", "", false,
                   "TunableLoader, 1 worker, CPU work per sample",
                   "the setting a short autotune run kept (not the advice's)", nullptr,
                   [](const Env& env, const Args& a, bool fixed) -> std::unique_ptr<Workload> {
                     return std::make_unique<DataStarvation>(env, a, fixed);
                   }});
  return pairs;
}

#include "second_opinion.h"

// --- running ----------------------------------------------------------------------------------

json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

torchpilot::Config off_config() {
  torchpilot::Config c;  // defaults, not the environment: the bench sets every key it needs
  c.mode = torchpilot::Mode::kOff;
  c.gpu.enabled = false;
  c.log.level = "warn";
  return c;
}

torchpilot::Config advise_config(const Args& a) {
  torchpilot::Config c;
  c.mode = torchpilot::Mode::kAdvise;
  c.gpu.trace_first_step = a.window_first;
  c.gpu.trace_steps = a.window_steps;
  c.report.trace_dir = a.trace_dir;
  c.gpu.trace_every_epochs = a.windows > 1 ? 1 : 0;  // a window at the same step of each epoch
  c.gpu.trace_anomaly_factor = 0;                    // no windows but those
  c.cost.budget = 1;  // not deferred by the budget: the advice needs the window
  // TORCHPILOT_* keys in the environment apply on top (an experiment without one collector).
  torchpilot::apply_env_overrides(c, torchpilot::process_environment());
  return c;
}

struct TimedRun {
  double samples_per_s = 0;
  int64_t steps = 0;
  // The training thread's time runnable but waiting for a CPU, ms a step (Linux schedstat; NaN
  // where unreadable): how much of its step the cores' other threads took (a stock loader's
  // workers and their intra-op teams), what one intra-op thread a worker gives back.
  double run_delay_ms = std::nan("");
};

// The calling thread's cumulative run-queue wait, ns (-1 where /proc has no schedstat).
int64_t thread_run_delay_ns() {
  std::ifstream f("/proc/thread-self/schedstat");
  int64_t on_cpu = 0, delay = -1;
  // A kernel without schedstats reads zeros: unknown, not no wait.
  if (!(f >> on_cpu >> delay) || on_cpu == 0) return -1;
  return delay;
}

// Samples per second of `n` timed steps after `warmup` untimed ones, torchpilot off; the `n`
// steps are repeated (synchronized after each repetition) until the timed part lasts `min_s`.
TimedRun timed_run(Workload& w, const Env& env, int warmup, int n, double min_s) {
  torchpilot::Pilot pilot(off_config());
  w.begin(pilot);
  w.steps(pilot, warmup);
  sync(env);
  const auto t0 = Clock::now();
  const int64_t delay0 = thread_run_delay_ns();
  TimedRun r;
  double s = 0;
  do {
    w.steps(pilot, n);
    sync(env);
    r.steps += n;
    s = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (s < min_s);
  const int64_t delay1 = thread_run_delay_ns();
  w.end();
  r.samples_per_s = static_cast<double>(w.samples_per_step()) * static_cast<double>(r.steps) / s;
  if (delay0 >= 0 && delay1 >= delay0) {
    r.run_delay_ms = static_cast<double>(delay1 - delay0) / 1e6 / static_cast<double>(r.steps);
  }
  return r;
}

struct AdvisedRun {
  std::vector<torchpilot::Advice> advice;
  int64_t traced_steps = 0;
  double mfu = std::nan("");
  double samples_per_s = std::nan("");  // the epoch's, with torchpilot on
  json steps = json::array();           // per step: [step, data wait, torchpilot's own] in ms
  json all_steps = json::array();       // every epoch's: [epoch, step, data wait, own] in ms
  // Per window (epoch): the GPU idle's causes as shares of traced time, and the advice's gains.
  json windows = json::array();
};

// The idle partition of an epoch's windows, shares of the traced time; null without a window.
json idle_shares(const torchpilot::EpochSummary& e) {
  const auto* g = e.sections.get<torchpilot::GpuEpochStats>();
  if (g == nullptr || g->traced_steps == 0 || g->stats.traced_ns <= 0) return nullptr;
  const auto& st = g->stats;
  const double t = static_cast<double>(st.traced_ns);
  auto share = [&](torchpilot::Nanos ns) { return std::round(1e4 * ns / t) / 1e4; };
  return {{"data_wait", share(st.idle_data_wait_ns)},
          {"host_sync", share(st.idle_host_sync_ns)},
          {"pageable_copy", share(st.idle_pageable_copy_ns)},
          {"launch_gap", share(st.idle_launch_gap_ns)},
          {"other", share(st.idle_other_ns)}};
}

// `epochs` epochs of `steps` steps, a window in each; the advice is the first epoch's.
AdvisedRun advised_run(Workload& w, const Env& env, const Args& a, int steps, int epochs) {
  auto sink = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::PilotOptions po;
  po.sinks = {sink};
  AdvisedRun r;
  {
    torchpilot::Config config = advise_config(a);
    if (!config.report.trace_dir.empty()) {
      config.report.trace_dir = bench::next_run_folder(config.report.trace_dir);
    }
    torchpilot::Pilot pilot(config, po);
    torchpilot::FlopCounter flops(pilot);
    w.begin(pilot);
    for (int epoch = 0; epoch < epochs; ++epoch) {
      w.steps(pilot, steps);
      sync(env);
      pilot.end_epoch();  // before end(): the loader's counters are read at the epoch's end
    }
    w.end();
  }
  if (sink->advice.empty() || sink->epochs.empty()) {
    throw std::runtime_error("the advised run produced no epoch summary");
  }
  for (size_t i = 0; i < sink->epochs.size(); ++i) {
    json gains = json::object();
    if (i < sink->advice.size()) {
      for (const auto& x : sink->advice[i]) gains[x.id] = number(x.expected_gain);
    }
    // The epoch's traced steps, and windows' first steps left out of its figures (over twice
    // their window's other steps: a trace's start holding the GPU). Beside a window's idle
    // shares, what the always-on path measured of its epoch and the traced steps' length: when
    // two windows' shares differ, whether the steps differed too.
    const torchpilot::EpochSummary& es = sink->epochs[i];
    const auto* g = es.sections.get<torchpilot::GpuEpochStats>();
    const bool traced = g != nullptr && g->traced_steps > 0;
    r.windows.push_back(
        {{"idle", idle_shares(es)},
         {"advice", gains},
         {"traced_steps", g != nullptr ? g->traced_steps : 0},
         {"traced_steps_left_out", g != nullptr ? g->traced_steps_left_out : 0},
         {"traced_ms_per_step", traced ? json(static_cast<double>(g->stats.traced_ns) / 1e6 /
                                              static_cast<double>(g->traced_steps))
                                       : json()},
         {"epoch_step_p50_ms", static_cast<double>(es.step_p50_ns) / 1e6},
         {"epoch_data_wait_fraction", es.data_wait_fraction},
         // The steps the gain models start from (gains::steady_step_seconds and its parts).
         {"ordinary_steps", g != nullptr ? g->ordinary_steps : 0},
         {"ordinary_step_p50_ms",
          g != nullptr ? static_cast<double>(g->ordinary_step_p50_ns) / 1e6 : 0.0},
         {"ordinary_gpu_step_p50_ms",
          g != nullptr ? static_cast<double>(g->ordinary_gpu_step_p50_ns) / 1e6 : 0.0},
         {"ordinary_gpu_ms", g != nullptr ? static_cast<double>(g->ordinary_gpu_ns) / 1e6 : 0.0},
         {"ordinary_gpu_host_ms",
          g != nullptr ? static_cast<double>(g->ordinary_gpu_host_ns) / 1e6 : 0.0},
         {"steady_step_ms", torchpilot::gains::steady_step_seconds(es) * 1e3}});
  }
  r.advice = sink->advice.front();
  const torchpilot::EpochSummary& e = sink->epochs.front();
  if (const auto* g = e.sections.get<torchpilot::GpuEpochStats>()) r.traced_steps = g->traced_steps;
  if (const auto* f = e.sections.get<torchpilot::FlopEpochStats>()) r.mfu = f->mfu;
  r.samples_per_s = e.samples_per_s;
  auto ms = [](torchpilot::Nanos ns) { return std::round(static_cast<double>(ns) / 1e3) / 1e3; };
  for (const auto& st : sink->steps) {
    if (st.epoch == 0) r.steps.push_back({ms(st.step_ns()), ms(st.data_wait_ns), ms(st.own_ns)});
    r.all_steps.push_back({st.epoch, ms(st.step_ns()), ms(st.data_wait_ns), ms(st.own_ns)});
  }
  return r;
}

// --default-run: the bad form under the default configuration (mode advise, the cost budget
// deciding when a window opens), epochs of `steps` steps until 10 s have passed (at most 20): per
// epoch the traced steps and the advice with its gains.
json default_run(Workload& w, const Env& env, int steps) {
  auto sink = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::PilotOptions po;
  po.sinks = {sink};
  torchpilot::Config config;
  config.mode = torchpilot::Mode::kAdvise;
  const auto t0 = Clock::now();
  {
    torchpilot::Pilot pilot(config, po);
    torchpilot::FlopCounter flops(pilot);
    w.begin(pilot);
    for (int epoch = 0; epoch < 20 && bench::seconds_since(t0) < 10; ++epoch) {
      w.steps(pilot, steps);
      sync(env);
      pilot.end_epoch();
    }
    w.end();
  }
  json epochs = json::array();
  for (size_t i = 0; i < sink->epochs.size(); ++i) {
    const auto* g = sink->epochs[i].sections.get<torchpilot::GpuEpochStats>();
    json advice = json::object();
    if (i < sink->advice.size()) {
      for (const auto& x : sink->advice[i]) {
        advice[x.id] = {{"severity", torchpilot::to_string(x.severity)},
                        {"expected_gain", number(x.expected_gain)}};
      }
    }
    epochs.push_back({{"steps", sink->epochs[i].steps},
                      {"seconds", sink->epochs[i].wall_ns / 1e9},
                      {"traced_steps", g != nullptr ? g->traced_steps : 0},
                      {"advice", advice}});
  }
  return epochs;
}

// tuning_overrides_advice: the trainer in mode autotune until the tuner decides (at most 20,000
// steps); the decision, or none.
std::optional<torchpilot::TuningDecision> tuning_run(Workload& w, const Env& env, const Args& a) {
  auto sink = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::PilotOptions po;
  po.sinks = {sink};
  torchpilot::Config config = off_config();
  config.mode = torchpilot::Mode::kAutotune;
  config.autotune.warmup_seconds = a.tune_seconds;
  {
    torchpilot::Pilot pilot(config, po);
    w.begin(pilot);
    for (int done = 0; done < 20000 && sink->decisions.empty(); done += 10) w.steps(pilot, 10);
    sync(env);
    w.end();
  }
  if (sink->decisions.empty()) return std::nullopt;
  return sink->decisions.back();
}

json advice_json(const torchpilot::Advice& x) {
  json evidence = json::object();
  for (const auto& ev : x.evidence) evidence[ev.name] = number(ev.value);
  return {{"id", x.id},
          {"expected_gain", number(x.expected_gain)},
          {"finding", x.finding},
          {"action", x.action},
          {"evidence", evidence}};
}

bool mentions(const torchpilot::Advice& x, const std::string& word) {
  auto low = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
  };
  return low(x.finding + " " + x.cause + " " + x.action).find(word) != std::string::npos;
}

json run_pair(const Pair& pair, const Env& env, const Args& a, Clock::time_point started) {
  json row = {{"pair", pair.name},        {"advice", nullptr},  {"estimated_gain", nullptr},
              {"measured_gain", nullptr}, {"ratio", nullptr},   {"expected_advice", pair.advice},
              {"bad", pair.bad},          {"fixed", pair.fixed}};
  auto elapsed = [&] { return bench::seconds_since(started); };
  if (pair.needs_cuda && !env.cuda) {
    row["skipped"] = "no CUDA device";
    return row;
  }
  if (pair.unavailable) {
    const std::string why = pair.unavailable(env);
    if (!why.empty()) {
      row["skipped"] = why;
      return row;
    }
  }
  if (elapsed() > a.budget_s) {
    row["skipped"] = "time budget (--budget-s) spent";
    return row;
  }
  const auto t0 = Clock::now();
  std::string stage = "building the bad form";
  try {
    std::unique_ptr<Workload> bad = pair.make(env, a, false);
    stage = "building the fixed form";
    std::unique_ptr<Workload> fixed = pair.make(env, a, true);
    std::fflush(stdout);  // the trainers' notes before the Pilot's log lines
    if (auto* g = dynamic_cast<Gpt*>(fixed.get())) {
      row["fixed_optimizer"] = gpt_example::to_string(g->trainer().optimizer());
    }

    stage = "the advised run of the bad form";
    const int advise_steps = advise_steps_for(pair, a);
    const int timed_steps = timed_steps_for(pair, a);
    row["advise_steps"] = advise_steps;
    row["timed_steps"] = timed_steps;
    if (auto* c = dynamic_cast<Checkpointing*>(bad.get())) row["checkpoint_mb"] = c->megabytes();
    const AdvisedRun advised = advised_run(*bad, env, a, advise_steps, windows_for(pair, a));
    if (a.default_run) {
      stage = "the default-config run of the bad form";
      row["default_config_epochs"] = default_run(*bad, env, std::max(advise_steps, 100));
    }
    json others = json::array();
    const torchpilot::Advice* expected = nullptr;
    for (const auto& x : advised.advice) {
      if (x.id == pair.advice) {
        expected = &x;
        row["advice"] = x.id;
        row["estimated_gain"] = number(x.expected_gain);
        row["advice_detail"] = advice_json(x);
        if (!pair.keyword.empty()) row["advice_names_cause"] = mentions(x, pair.keyword);
      } else {
        others.push_back(advice_json(x));
      }
    }
    row["other_advice"] = others;
    // A loader pair's fix is the advice applied: the worker count it names (the pair's own
    // fallback when the advice gives none).
    auto advised_workers = [&](auto* w) {
      for (size_t i = 0; w != nullptr && expected != nullptr && i < expected->evidence.size();
           ++i) {
        const torchpilot::Evidence& ev = expected->evidence[i];
        if (ev.name == "workers_advised" && ev.value >= 1)
          w->set_workers(static_cast<int>(ev.value));
      }
      if (w != nullptr) row["fixed_workers"] = w->workers();
    };
    advised_workers(dynamic_cast<DataStarvation*>(fixed.get()));
    advised_workers(dynamic_cast<StockLoader<SlowSamples>*>(fixed.get()));
    advised_workers(dynamic_cast<StockLoader<WaitingSamples>*>(fixed.get()));
    advised_workers(dynamic_cast<second_opinion::Workers*>(fixed.get()));
    // The advice's one intra-op thread per stock worker, where it says so.
    const bool one_thread =
        expected != nullptr &&
        std::any_of(expected->evidence.begin(), expected->evidence.end(),
                    [](const torchpilot::Evidence& ev) { return ev.name == "intra_op_threads"; });
    auto set_one_thread = [&](auto* w) {
      if (w == nullptr) return;
      w->set_one_thread(one_thread);
      row["fixed_one_intra_op_thread_per_worker"] = one_thread;
    };
    set_one_thread(dynamic_cast<StockLoader<SlowSamples>*>(fixed.get()));
    set_one_thread(dynamic_cast<StockLoader<WaitingSamples>*>(fixed.get()));
    set_one_thread(dynamic_cast<second_opinion::Workers*>(fixed.get()));
    if (pair.name == "tuning_overrides_advice") {
      // The fix is the tuner's: a run in mode autotune until it decides; the advice's count is
      // its first trial after the baseline where the baseline's figures give one.
      stage = "the autotune run";
      auto* d = dynamic_cast<DataStarvation*>(fixed.get());
      DataStarvation probe(env, a, false);
      const std::optional<torchpilot::TuningDecision> decision = tuning_run(probe, env, a);
      if (!decision || d == nullptr) throw std::runtime_error("autotune decided nothing");
      const auto chosen = [&](const char* knob, int fallback) {
        const auto it = decision->chosen.find(knob);
        return it != decision->chosen.end() ? static_cast<int>(it->second) : fallback;
      };
      d->set_workers(chosen("loader.workers", d->workers()));
      d->set_prefetch(chosen("loader.prefetch", d->prefetch()));
      row["fixed_workers"] = d->workers();
      row["fixed_prefetch"] = d->prefetch();
      row["tuner_chosen"] = torchpilot::to_string(decision->chosen);
      if (decision->trials.size() > 1) {
        row["tuner_first_trial"] = torchpilot::to_string(decision->trials[1].setting);
      }
      // The rule the log, the JSON lines and the HTML report mark answered advice by.
      row["advice_answered_by_tuning"] =
          expected != nullptr && !torchpilot::answered_setting(expected->id, &*decision).empty();
    }
    if (row["advice"].is_null()) {
      std::string fired;
      for (const auto& x : advised.advice) fired += (fired.empty() ? "" : ", ") + x.id;
      row["note"] = "expected advice " + pair.advice +
                    " did not fire; fired: " + (fired.empty() ? std::string("none") : fired);
    }
    row["traced_steps"] = advised.traced_steps;
    row["mfu_bad"] = number(advised.mfu);
    row["advised_samples_per_s"] = number(advised.samples_per_s);
    row["advised_steps_ms"] = advised.steps;
    row["advised_all_steps_ms"] = advised.all_steps;
    row["windows"] = advised.windows;
    // The largest spread of one cause's idle share between the epochs whose windows' figures came
    // (percentage points); none with fewer than two (a repeat's figures can come epochs late).
    // The same over the windows of steady steps: traced steps within 10% of the windows' median
    // step time (a window in the run's first steps can trace a trainer still warming up).
    std::vector<const json*> with_shares, steady;
    std::vector<double> traced_ms;
    for (const auto& w : advised.windows) {
      if (!w["idle"].is_object()) continue;
      with_shares.push_back(&w);
      const double ms = w.value("traced_ms_per_step", json()).is_number()
                            ? w["traced_ms_per_step"].get<double>()
                            : -1;
      if (ms >= 0) traced_ms.push_back(ms);
    }
    const double median_ms = traced_ms.empty() ? 0 : median(traced_ms);
    for (const json* w : with_shares) {
      const json ms = w->value("traced_ms_per_step", json());
      if (ms.is_number() && std::abs(ms.get<double>() - median_ms) <= 0.1 * median_ms)
        steady.push_back(w);
    }
    auto spread_of = [](const std::vector<const json*>& windows) {
      double spread = 0;
      for (const char* cause : {"data_wait", "host_sync", "pageable_copy", "launch_gap", "other"}) {
        double lo = 1, hi = 0;
        for (const json* w : windows) {
          lo = std::min(lo, (*w)["idle"][cause].get<double>());
          hi = std::max(hi, (*w)["idle"][cause].get<double>());
        }
        if (hi >= lo) spread = std::max(spread, 100 * (hi - lo));
      }
      return spread;
    };
    row["windows_with_shares"] = with_shares.size();
    if (with_shares.size() > 1) row["idle_share_spread_points"] = number(spread_of(with_shares));
    row["steady_windows"] = steady.size();
    if (steady.size() > 1) row["idle_share_spread_points_steady"] = number(spread_of(steady));

    if (a.advise_fixed) {
      stage = "the advised run of the fixed form";
      const AdvisedRun after = advised_run(*fixed, env, a, advise_steps, 1);
      json ids = json::array();
      for (const auto& x : after.advice) {
        ids.push_back({{"id", x.id}, {"expected_gain", number(x.expected_gain)}});
      }
      row["advice_on_fixed"] = ids;
      row["mfu_fixed"] = number(after.mfu);
      row["advised_fixed_samples_per_s"] = number(after.samples_per_s);
      row["advised_fixed_steps_ms"] = after.steps;
    }

    stage = "the A/B runs";
    std::vector<double> bad_sps, fixed_sps;
    json bad_delay = json::array(), fixed_delay = json::array();
    std::vector<int64_t> bad_steps, fixed_steps;
    const int rounds = period_of(pair, a) > 0 ? std::max(a.rounds, a.periodic_rounds) : a.rounds;
    for (int round = 0; round < rounds; ++round) {
      if (round > 0 && elapsed() > a.budget_s) {
        row["note_rounds"] = "time budget: stopped after " + std::to_string(round) + " rounds";
        break;
      }
      // Interleaved, the order swapped each round (drift and thermal effects fall on both): 0 is
      // the bad form, first in even rounds.
      for (int form : bench::round_order(round, 2, bench::Order::kReverse)) {
        const bool run_bad = form == 0;
        const TimedRun t =
            timed_run(run_bad ? *bad : *fixed, env, a.warmup, timed_steps, a.min_run_s);
        (run_bad ? bad_sps : fixed_sps).push_back(t.samples_per_s);
        (run_bad ? bad_steps : fixed_steps).push_back(t.steps);
        (run_bad ? bad_delay : fixed_delay).push_back(number(t.run_delay_ms));
      }
    }
    const double b = median(bad_sps), f = median(fixed_sps);
    const double measured = f / b - 1;
    row["bad_samples_per_s"] = number(b);
    row["fixed_samples_per_s"] = number(f);
    row["bad_runs"] = bad_sps;
    row["fixed_runs"] = fixed_sps;
    row["bad_run_steps"] = bad_steps;
    row["fixed_run_steps"] = fixed_steps;
    row["bad_run_delay_ms_per_step"] = bad_delay;
    row["fixed_run_delay_ms_per_step"] = fixed_delay;
    row["measured_gain"] = number(measured);
    if (row["estimated_gain"].is_number() && std::isfinite(measured) && measured > 0) {
      row["ratio"] = number(row["estimated_gain"].get<double>() / measured);
    }
    // Under the default configuration: the epochs that named the expected advice, the median of
    // their estimates against the same measured fix.
    if (row.contains("default_config_epochs")) {
      std::vector<double> gains;
      int epochs = 0;
      for (const auto& e : row["default_config_epochs"]) {
        ++epochs;
        if (e["advice"].contains(pair.advice) &&
            e["advice"][pair.advice]["expected_gain"].is_number())
          gains.push_back(e["advice"][pair.advice]["expected_gain"].get<double>());
      }
      row["default_named_epochs"] = json::array({static_cast<int>(gains.size()), epochs});
      if (!gains.empty()) {
        const double g = median(gains);
        row["default_estimated_gain"] = number(g);
        if (std::isfinite(measured) && measured > 0) row["default_ratio"] = number(g / measured);
      }
    }
  } catch (const std::exception& e) {
    row["error"] = stage + ": " + e.what();
  }
#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
  if (env.cuda) {
    try {
      torch::cuda::synchronize();
    } catch (const std::exception&) {
    }
    c10::cuda::CUDACachingAllocator::emptyCache();  // the next pair starts with the memory free
  }
#endif
  row["seconds"] = bench::seconds_since(t0);
  return row;
}

void write(const std::string& path, const json& j) {
  if (path.empty()) return;
  bench::write_json(path, j);
}

int run(int argc, char** argv) {
  Args a;
  std::vector<std::string> names;
  for (const auto& p : all_pairs()) names.push_back(p.name);
  for (const auto& p : second_opinion::pairs()) names.push_back(p.name);

  CLI::App app(
      "planted_pairs: planted bottleneck pairs (bad form, fixed form); for each, the advice "
      "torchpilot gives on the bad form with its estimated gain, against the measured gain of "
      "the fixed form (interleaved A/B, torchpilot off). bench/README.md.",
      "planted_pairs");
  example_cli::last_wins(app);
  app.add_option("--pairs", a.pairs, "pairs to run, comma-separated (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(names))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->type_name("LIST");
  app.add_option("--device", a.device, "cpu, cuda or cuda:N; default cuda when available")
      ->check(example_cli::Device())
      ->type_name("cpu|cuda|cuda:N");
  app.add_flag("--small", a.small, "tiny sizes (always so without CUDA): a smoke test");
  bench::int_flag(app, "--rounds", a.rounds, 1, 1000, "A/B rounds (bad and fixed once each)");
  bench::int_flag(app, "--steps", a.steps, 1, 1000000, "timed steps per A/B run");
  bench::int_flag(app, "--warmup", a.warmup, 0, 1000000, "untimed steps before them");
  bench::number_flag(app, "--min-run-s", a.min_run_s, 0, 3600,
                     "the timed steps are repeated until a run lasts this long");
  bench::int_flag(app, "--advise-steps", a.advise_steps, 1, 1000000,
                  "steps of the advised run (one epoch)");
  bench::int_flag(app, "--window-first", a.window_first, 0, 1000000,
                  "the detailed window starts after this step of the advised run");
  bench::int_flag(app, "--window-steps", a.window_steps, 1, 1000000,
                  "steps in the detailed window");
  bool no_advise_fixed = false;
  app.add_flag("--no-advise-fixed", no_advise_fixed,
               "no advised run of the fixed form (by default one shows which advice remains)");
  bench::number_flag(app, "--budget-s", a.budget_s, 0, 1e6,
                     "total time: pairs that would start later are skipped");
  bench::number_flag(app, "--sample-us", a.sample_us, 0, 1e6,
                     "data_starvation: CPU work per sample, microseconds");
  bench::number_flag(app, "--host-us", a.host_us, 0, 1e7,
                     "host_sync: host work per step, microseconds (async_sync_every_n: "
                     "shared among the micro-steps)");
  bench::int_flag(app, "--micro-steps", a.micro_steps, 1, 1024,
                  "async_sync_every_n: micro-steps per optimizer step");
  bench::int_flag(app, "--sync-every", a.sync_every, 1, 1000000,
                  "async_sync_every_n, fixed form: .item() every N optimizer steps");
  bench::int_flag(app, "--checkpoint-every", a.checkpoint_every, 2, 1000000,
                  "checkpoint: steps between saves");
  bench::int_flag(app, "--sync-width", a.sync_width, 8, 65536,
                  "sync_per_micro_step: the MLP's width (its matmuls' GPU time against the "
                  "launches)");
  bench::int_flag(app, "--sync-host-us", a.sync_host_us, 0, 10000000,
                  "sync_per_micro_step: host work per micro-step before its launches "
                  "(microseconds)");
  bench::number_flag(app, "--wait-us", a.wait_us, 0, 1e7,
                     "stock_loader_io: the wait per sample (a sleep: I/O), microseconds");
  bench::number_flag(app, "--tune-seconds", a.tune_seconds, 0, 3600,
                     "tuning_overrides_advice: the autotune run's autotune.warmup_seconds");
  app.add_option("--set", a.set,
                 "planted: the planted pairs; second-opinion: trainers modelled on public C++ "
                 "LibTorch code, each with its own fix (bench/second_opinion.h)")
      ->check(CLI::IsMember({"planted", "second-opinion"}));
  bench::number_flag(app, "--decode-us", a.decode_us, 0, 1e7,
                     "second-opinion custom_dataset: CPU work per image standing in for decoding");
  app.add_flag("--default-run", a.default_run,
               "also an advised run of the bad form under the default configuration (windows "
               "as the cost budget allows): its advice and whether a window opened");
  bench::int_flag(app, "--periodic-rounds", a.periodic_rounds, 1, 1000,
                  "A/B rounds of the pairs that save checkpoints (their gains are a few percent: "
                  "more rounds narrow the median)");
  bench::int_flag(app, "--windows", a.windows, 1, 100,
                  "epochs of the advised run, a window in each; the advice is the first's, the "
                  "others show whether the idle's causes stay put (checkpoint pairs: 1)");
  bench::int_flag(app, "--launch-batch-factor", a.launch_batch_factor, 2, 1024,
                  "launch_bound: the fixed form's batch / the bad form's");
  app.add_option(
      "--trace-dir", a.trace_dir,
      "write the advise runs' detailed windows as trace-event files here (report.trace_dir), a "
      "folder per run (the bad form's first)");
  bench::add_run_flags(app, a.run, "write the rows here (JSON)");
  example_cli::parse_or_exit(app, argc, argv);
  a.advise_fixed = !no_advise_fixed;
  if (a.window_first + a.window_steps + 3 > a.advise_steps) {
    example_cli::fail(app, "--advise-steps",
                      "--advise-steps must exceed --window-first + --window-steps by at least 3 "
                      "(a window's records arrive up to two steps after it)");
  }

  Env env;
  if (a.device.empty()) {
    env.device = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::kCPU;
  } else {
    env.device = torch::Device(a.device);
    if (env.device.is_cuda() && !env.device.has_index())
      env.device = torch::Device(torch::kCUDA, 0);
    if (env.device.is_cuda() && !torch::cuda::is_available()) {
      std::fprintf(stderr, "planted_pairs: --device %s but this LibTorch sees no CUDA device\n",
                   a.device.c_str());
      return 2;
    }
  }
  env.cuda = env.device.is_cuda();
  env.small = a.small || !env.cuda;
  env.dtype = env.cuda ? torch::kBFloat16 : torch::kFloat;
  calibrate_cpu_work();
  std::printf("planted_pairs: %s, device %s%s, LibTorch %s; CPU work %.0f iterations/us\n",
              a.run.machine.c_str(), env.device.str().c_str(), env.small ? " (small sizes)" : "",
              TORCH_VERSION, g_iterations_per_us);
  std::fflush(stdout);

  json result = bench::run_header("planted_pairs", a.run);
  result.update(
      {{"device", env.device.str()},
       {"small", env.small},
       {"libtorch", TORCH_VERSION},
       {"method",
        "per pair: the bad form once with a Pilot in advise mode (one epoch of advise_steps steps, "
        "a detailed window of window_steps steps after step window_first, a FLOP counter); its "
        "advice of the expected id gives estimated_gain. Then bad and fixed forms alternately "
        "(order swapped each round) with torchpilot off, warmup untimed + steps timed steps "
        "between device synchronizations, repeated until the run lasts min_run_s (the steps in "
        "bad_run_steps, fixed_run_steps; the training thread's run-queue wait per step in "
        "bad_run_delay_ms_per_step, fixed_run_delay_ms_per_step); throughput = samples/s; "
        "medians over rounds; "
        "measured_gain = fixed/bad - 1; ratio = estimated_gain / measured_gain"},
       {"config",
        {{"rounds", a.rounds},
         {"steps", a.steps},
         {"warmup", a.warmup},
         {"min_run_s", a.min_run_s},
         {"advise_steps", a.advise_steps},
         {"window_first", a.window_first},
         {"window_steps", a.window_steps},
         {"sample_us", a.sample_us},
         {"host_us", a.host_us},
         {"sync_width", a.sync_width},
         {"sync_host_us", a.sync_host_us},
         {"micro_steps", a.micro_steps},
         {"sync_every", a.sync_every},
         {"launch_batch_factor", a.launch_batch_factor},
         {"wait_us", a.wait_us},
         {"tune_seconds", a.tune_seconds},
         {"windows", a.windows},
         {"set", a.set},
         {"decode_us", a.decode_us},
         {"budget_s", a.budget_s}}},
       {"rows", json::array()}});

  const std::vector<Pair> pairs = a.set == "second-opinion" ? second_opinion::pairs() : all_pairs();
  const auto started = Clock::now();
  int named = 0, within = 0, measured_rows = 0;
  for (const Pair& pair : pairs) {
    if (!a.pairs.empty() && std::find(a.pairs.begin(), a.pairs.end(), pair.name) == a.pairs.end())
      continue;
    std::printf("== %s: bad: %s; fixed: %s\n", pair.name.c_str(), pair.bad.c_str(),
                pair.fixed.c_str());
    std::fflush(stdout);
    json row = run_pair(pair, env, a, started);
    if (row.contains("skipped")) {
      std::printf("   skipped: %s\n", row["skipped"].get<std::string>().c_str());
    } else if (row.contains("error")) {
      std::printf("   error: %s\n", row["error"].get<std::string>().c_str());
    } else {
      ++measured_rows;
      const bool has_ratio = row["ratio"].is_number();
      if (!row["advice"].is_null()) ++named;
      if (has_ratio && row["ratio"].get<double>() >= 0.5 && row["ratio"].get<double>() <= 2)
        ++within;
      auto fmt = [](const json& v) {
        char buf[32];
        if (!v.is_number()) return std::string("n/a");
        std::snprintf(buf, sizeof buf, "%+.1f%%", 100 * v.get<double>());
        return std::string(buf);
      };
      std::printf(
          "   advice %s, estimated %s, measured %s (bad %.0f, fixed %.0f samples/s)%s%s\n",
          row["advice"].is_null() ? "none" : row["advice"].get<std::string>().c_str(),
          fmt(row["estimated_gain"]).c_str(), fmt(row["measured_gain"]).c_str(),
          row["bad_samples_per_s"].is_number() ? row["bad_samples_per_s"].get<double>() : 0.0,
          row["fixed_samples_per_s"].is_number() ? row["fixed_samples_per_s"].get<double>() : 0.0,
          has_ratio ? (", ratio " + std::to_string(row["ratio"].get<double>())).c_str() : "",
          row.contains("note") ? ("; " + row["note"].get<std::string>()).c_str() : "");
      if (row.contains("idle_share_spread_points")) {
        std::printf("   idle causes over %d windows: spread %.1f points",
                    row["windows_with_shares"].get<int>(),
                    row["idle_share_spread_points"].get<double>());
        if (row.contains("idle_share_spread_points_steady")) {
          std::printf("; over the %d of steady steps %.1f", row["steady_windows"].get<int>(),
                      row["idle_share_spread_points_steady"].get<double>());
        }
        std::printf("\n");
      }
      if (row.contains("default_named_epochs")) {
        std::printf("   default config: named in %d of %d epochs, estimated %s%s\n",
                    row["default_named_epochs"][0].get<int>(),
                    row["default_named_epochs"][1].get<int>(),
                    fmt(row.value("default_estimated_gain", json())).c_str(),
                    row.contains("default_ratio") && row["default_ratio"].is_number()
                        ? (", ratio " + std::to_string(row["default_ratio"].get<double>())).c_str()
                        : "");
      }
    }
    std::fflush(stdout);
    result["rows"].push_back(row);
    result["summary"] = {{"pairs_measured", measured_rows},
                         {"advice_named", named},
                         {"ratio_within_0.5_2", within},
                         {"wall_s", bench::seconds_since(started)}};
    write(a.run.out, result);  // after every pair: a run cut short keeps what it finished
  }
  std::printf(
      "planted_pairs: %d pairs measured, %d named the expected advice, %d ratios in "
      "[0.5, 2]%s%s\n",
      measured_rows, named, within, a.run.out.empty() ? "" : "; results in ", a.run.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("planted_pairs", argc, argv, run); }
