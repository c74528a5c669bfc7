// The GPT trainer shared by the example program (gpt_trainer) and the overhead benchmark
// (bench/gpt_overhead): a GPT-style model (gpt_model.h) trained on byte-level text
// (gpt_data.h) with AdamW, measured by a torchpilot Pilot: one step per batch with
// samples = tokens (batch x sequence), phases forward / backward / optimizer.
// This header is free of LibTorch so its users compile fast.
//
// Batches: the corpus is copied to the device once; each step draws `batch` random window
// starts on the device (torch::randint, seeded) and gathers windows of T+1 tokens there
// (input = the first T, target = the last T). No host copy and no host sync per step. With
// host_loader instead, a torchpilot::TunableLoader over a host copy of the corpus (below).
// Precision: kBf16 enables CUDA autocast to bf16 for forward and loss (backward follows it, as in
// PyTorch); the autocast weight-cast cache is cleared at the end of every step. On the CPU the
// trainer runs fp32 and says so once.
// Optimizer: AdamW three ways, the same update (PyTorch's AdamW, no amsgrad): kFused is
// at::_fused_adamw_ (one multi-tensor kernel per parameter group; LibTorch >= 2.1 on CUDA),
// kForeach the multi-tensor at::_foreach_* ops (PyTorch's foreach=True path), kPerParameter
// torch::optim::AdamW (a loop of ~10 kernels per parameter). The default is the fastest the build
// and device have: kFused, else kForeach with a note. kFused and kForeach set gradients to none
// between steps (zero_grad(set_to_none=True)).
// Activation offloading (offload_activations): the forward and the loss run inside a scope of a
// torchpilot::ActivationOffload (one scope around the whole forward); saved activations of at
// least offload_min_bytes go to pinned host memory and come back in backward. Without a GPU the
// library refuses it with one line and the trainer runs as before.
// Host loader (host_loader): see TrainOptions; the loader is attached to the Pilot train() is
// given (data wait, loader.* knobs) and ends that Pilot's epoch when its epoch is exhausted,
// which is at the first step after loader_epoch_steps steps (the program's end_epoch came first:
// then a no-op).
// Thread-safety: one thread. Failure behaviour: the constructor throws std::invalid_argument /
// std::runtime_error on bad sizes or an unreadable text file; train() lets LibTorch's errors
// (out of memory, ...) through.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpt_flops.h"
#include "torchpilot/hooks/memory/activation_offload.h"
#include "torchpilot/runtime/core/pilot.h"

namespace gpt_example {

enum class Precision { kBf16, kFp32 };
const char* to_string(Precision precision);
enum class Optimizer { kFused, kForeach, kPerParameter };
const char* to_string(Optimizer optimizer);  // "fused", "foreach", "per-parameter"
// The optimizer to_string names (--optimizer); per-parameter for any other name.
Optimizer optimizer_from_string(const std::string& name);
// Whether this build can run at::_fused_adamw_ (LibTorch >= 2.1 with CUDA; the device decides too).
bool fused_adamw_compiled();
// Whether LibTorch sees a CUDA device.
bool cuda_available();
// LibTorch's intra-op threads (ranks sharing a host's cores).
void set_intra_op_threads(int n);

struct TrainOptions {
  int64_t d_model = 256;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t seq = 256;
  int64_t batch = 16;
  bool fused_attention = true;  // false: the unfused path (plants the fusion advisor)
  // torch::linear for the linear layers; false: the Linear modules' forward (LibTorch's C++
  // frontend adds their biases in separate kernels: plants the unfused_linear_bias advice).
  bool aten_linear = true;
  Precision precision = Precision::kBf16;
  std::string device;  // "cuda", "cuda:N" or "cpu"; empty: cuda when available, else cpu
  double lr = 3e-4;
  double weight_decay = 0.1;  // on matrices and embeddings, not on biases and LayerNorm gains
  Optimizer optimizer = Optimizer::kFused;  // falls back to kForeach where fused is unavailable
  std::string text_path;                    // empty: the generated corpus
  size_t corpus_bytes = size_t{4} << 20;    // size of the generated corpus
  uint64_t seed = 1;
  // Data parallelism (gpt_dist.h): with world_size > 1 this process is rank `rank`, joined to the
  // others through MASTER_ADDR:MASTER_PORT; gradients are averaged by torchpilot::GradSync in
  // buckets of bucket_mb MiB, from backward's hooks (grad_overlap) or after backward. The model
  // starts alike on every rank; each rank draws its own batches.
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // A process group and GradSync even at world size 1 (NCCL's one-rank kernels on one GPU).
  bool distributed = false;
  bool grad_overlap = true;
  double bucket_mb = 25;
  // Host work on the training thread at each step's start (a busy loop, ms): plants a straggler.
  double host_ms = 0;
  // Gradient accumulation (torchpilot::Accumulation, hooks/memory/accumulation.h): each step's
  // `batch` rows run as micro-batches of this many rows, the optimizer stepping once per batch
  // (global batch = batch x world_size, unchanged); in mode autotune torchpilot searches the
  // micro-batch ("batch.micro") and recovers from an out-of-memory trial. 0: the whole batch at
  // once, no Accumulation (the default). With world_size > 1 gradients are all-reduced after the
  // last micro-batch (grad_overlap off).
  int64_t micro_batch = 0;
  // Micro-batches the search may try (empty: powers of two up to the batch, the batch, the start).
  std::vector<int64_t> micro_choices;
  // Saved activations to pinned host memory during forward, back for backward.
  bool offload_activations = false;
  int64_t offload_min_bytes = int64_t{1} << 20;  // storages smaller stay on the GPU
  int offload_depth = 4;                         // copies in flight / fetched ahead
  // Host data loader (opt-in): batches come from a torchpilot::TunableLoader over a host copy of
  // the corpus instead of being cut on the device, so that the loader's knobs (loader.workers,
  // loader.prefetch, loader.pin_memory, loader.device_prefetch) can be advised on and auto-tuned.
  // Sample i of a rank's epoch is a window whose start depends on (seed, rank, i) only: every
  // epoch sees the same windows, each rank its own. The loader's epoch is loader_epoch_steps
  // batches (the program's steps per epoch), so its epoch ends where the program's does.
  bool host_loader = false;
  // CPU work per sample (standing for tokenization / decoding), microseconds of the producing
  // thread's CPU time: a loop hashing the window's bytes until that much thread CPU time passed.
  double loader_sample_us = 0;
  // Waiting per sample (standing for storage or network latency), microseconds of sleep: costs
  // no core, so workers hide it even on a machine with fewer cores than threads (the CPU tests).
  double loader_io_us = 0;
  int loader_workers = 0;            // the loader.workers knob's start value
  int64_t loader_epoch_steps = 100;  // batches per loader epoch
};

class Trainer {
 public:
  // Builds the corpus, the model (on the device) and the optimizer. Notes (fused attention not
  // available, fp32 on the CPU) are printed once to stdout.
  explicit Trainer(TrainOptions options);
  ~Trainer();

  // Runs `steps` training steps measured by `pilot` (which may be in mode off). Does not end the
  // pilot's epoch and does not synchronize the device.
  void train(torchpilot::Pilot& pilot, int64_t steps);
  // The mean loss of the steps since the last call (reads it from the device: synchronizes);
  // NaN if none.
  double take_mean_loss();
  // With options.micro_batch: the micro-batch the next step runs, its accumulation count, and the
  // out-of-memory errors recovered from (0, 0, 0 without accumulation or before train()).
  int64_t micro_batch() const;
  int64_t accumulation() const;
  int64_t oom_recoveries() const;
  // Waits for all work queued on the device (no-op on the CPU).
  void synchronize();
  // With data parallelism, the collectives are observed for the Pilot train() was last given:
  // call this before that Pilot goes when another one follows (benchmarks).
  void detach_pilot();
  // Data parallelism's gradient sync (from the next step; every rank alike) and the planted host
  // work per step (ms; 0: none). Benchmarks switch them between runs.
  void set_grad_sync(bool overlap, double bucket_mb);
  void set_host_ms(double ms);

  const TrainOptions& options() const;
  GptShape shape() const;
  std::string device() const;  // "cpu" or "cuda:0"
  bool on_cuda() const;
  bool fused_attention() const;  // the path run (false when requested but not available)
  Precision precision() const;   // the precision run (kFp32 on the CPU)
  Optimizer optimizer() const;   // the optimizer run (kForeach when kFused is unavailable)
  int64_t parameter_count() const;
  int64_t corpus_size() const;       // tokens
  std::string comm_backend() const;  // "gloo" or "nccl" with world_size > 1, else
  // The activation offload (null unless offload_activations): its knob, stats and state.
  torchpilot::ActivationOffload* offload() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpt_example
