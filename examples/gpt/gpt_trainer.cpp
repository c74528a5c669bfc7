#include "gpt_trainer.h"

#include <time.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpt_data.h"
#include "gpt_dist.h"
#include "gpt_model.h"
#include "torchpilot/hooks/core/compat.h"
#include "torchpilot/hooks/loader/tunable_loader.h"
#include "torchpilot/hooks/memory/accumulation.h"

namespace gpt_example {

const char* to_string(Precision precision) {
  return precision == Precision::kBf16 ? "bf16" : "fp32";
}

bool cuda_available() { return torch::cuda::is_available(); }

void set_intra_op_threads(int n) { torch::set_num_threads(n); }

namespace {

// The optimizers' names, both ways.
constexpr std::pair<Optimizer, const char*> kOptimizerNames[] = {
    {Optimizer::kFused, "fused"},
    {Optimizer::kForeach, "foreach"},
    {Optimizer::kPerParameter, "per-parameter"},
};

}  // namespace

const char* to_string(Optimizer optimizer) {
  for (const auto& [o, name] : kOptimizerNames) {
    if (o == optimizer) return name;
  }
  return "?";
}

Optimizer optimizer_from_string(const std::string& name) {
  for (const auto& [o, n] : kOptimizerNames) {
    if (name == n) return o;
  }
  return Optimizer::kPerParameter;
}

bool fused_adamw_compiled() {
#if TORCHPILOT_TORCH_AT_LEAST(2, 1) && defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

namespace {

// AdamW over lists of tensors, PyTorch's update (torch/optim/adamw.py, no amsgrad, not
// capturable): decoupled weight decay, bias-corrected moments. All parameters share one step
// count. kFused: at::_fused_adamw_ per group; kForeach: the at::_foreach_* sequence of PyTorch's
// _multi_tensor_adamw. Either way a handful of launches per group instead of ~10 per parameter.
class ListAdamW {
 public:
  struct Group {
    std::vector<torch::Tensor> params, exp_avg, exp_avg_sq;
    double weight_decay = 0;
  };

  ListAdamW(std::vector<std::pair<std::vector<torch::Tensor>, double>> groups, double lr,
            bool fused)
      : lr_(lr), fused_(fused) {
    for (auto& [params, wd] : groups) {
      Group g;
      g.weight_decay = wd;
      for (const auto& p : params) {
        g.params.push_back(p);
        g.exp_avg.push_back(torch::zeros_like(p));
        g.exp_avg_sq.push_back(torch::zeros_like(p));
      }
      if (!g.params.empty()) groups_.push_back(std::move(g));
    }
    if (fused_ && !groups_.empty()) {
      // The fused kernel reads the step count from a device tensor (incremented before the call,
      // as PyTorch's _fused_adamw does); one shared scalar for all parameters.
      step_t_ = torch::zeros({}, groups_.front().params.front().options().dtype(torch::kFloat));
    }
  }

  // zero_grad(set_to_none=True): no memset per parameter; backward writes fresh gradients.
  void zero_grad() {
    for (auto& g : groups_) {
      for (auto& p : g.params) p.mutable_grad() = torch::Tensor();
    }
  }

  void step() {
    torch::NoGradGuard no_grad;
    ++step_;
    if (fused_) step_t_.add_(1);
    const double bc1 = 1 - std::pow(kBeta1, static_cast<double>(step_));
    const double bc2 = 1 - std::pow(kBeta2, static_cast<double>(step_));
    for (auto& g : groups_) {
      std::vector<torch::Tensor> params, grads, m, v;
      for (size_t i = 0; i < g.params.size(); ++i) {
        if (!g.params[i].grad().defined()) continue;  // no gradient this step: untouched
        params.push_back(g.params[i]);
        grads.push_back(g.params[i].grad());
        m.push_back(g.exp_avg[i]);
        v.push_back(g.exp_avg_sq[i]);
      }
      if (params.empty()) continue;
#if TORCHPILOT_TORCH_AT_LEAST(2, 1)
      if (fused_) {
        const std::vector<torch::Tensor> steps(params.size(), step_t_);
        at::_fused_adamw_(params, grads, m, v, /*max_exp_avg_sqs=*/{}, steps, lr_, kBeta1, kBeta2,
                          g.weight_decay, kEps, /*amsgrad=*/false, /*maximize=*/false);
        continue;
      }
#endif
      if (g.weight_decay != 0) at::_foreach_mul_(params, 1 - lr_ * g.weight_decay);
      at::_foreach_mul_(m, kBeta1);
      at::_foreach_add_(m, grads, 1 - kBeta1);
      at::_foreach_mul_(v, kBeta2);
      at::_foreach_addcmul_(v, grads, grads, 1 - kBeta2);
      std::vector<torch::Tensor> denom = at::_foreach_sqrt(v);
      at::_foreach_div_(denom, std::sqrt(bc2));
      at::_foreach_add_(denom, kEps);
      at::_foreach_addcdiv_(params, m, denom, -lr_ / bc1);
    }
  }

  static constexpr double kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8;

 private:
  std::vector<Group> groups_;
  double lr_;
  bool fused_;
  int64_t step_ = 0;
  torch::Tensor step_t_;  // fused: the step count on the device
};

// Whether at::_fused_adamw_ runs on `device` here: one update of a one-element tensor. Empty when
// it does, else the reason.
std::string fused_adamw_problem(const torch::Device& device) {
  if (!fused_adamw_compiled()) {
    return "at::_fused_adamw_ needs LibTorch >= 2.1 with CUDA (this is " +
           std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
           (torch::cuda::is_available() ? "" : ", no CUDA") + ")";
  }
  if (!device.is_cuda())
    return "at::_fused_adamw_ runs on CUDA here, the device is " + device.str();
  try {
    auto p = torch::ones({1}, torch::TensorOptions().device(device).requires_grad(true));
    p.mutable_grad() = torch::ones_like(p);
    ListAdamW probe({{{p}, 0.1}}, 1e-3, /*fused=*/true);
    probe.step();
    torch::cuda::synchronize();
  } catch (const std::exception& e) {
    return std::string("at::_fused_adamw_ failed: ") + e.what();
  }
  return {};
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The host loader's dataset: sample i is a window of T+1 byte tokens (int64) of the host corpus,
// data = the first T, target = the last T; its start depends on (seed, rank, i) only, so every
// epoch sees the same windows and each rank its own. Stateless apart from the hash sink: each
// loader thread works on its own copy, the corpus is shared read-only.
class WindowDataset : public torch::data::datasets::Dataset<WindowDataset> {
 public:
  WindowDataset(std::shared_ptr<const std::vector<uint8_t>> corpus, int64_t seq, uint64_t seed,
                int rank, size_t size, double sample_us, double io_us)
      : corpus_(std::move(corpus)),
        seq_(seq),
        key_(splitmix64(seed ^ splitmix64(0x6C6F61646572ull + static_cast<uint64_t>(rank)))),
        size_(size),
        sample_ns_(static_cast<int64_t>(sample_us * 1e3)),
        io_us_(static_cast<int64_t>(io_us)) {}

  torch::data::Example<> get(size_t i) override {
    const auto& bytes = *corpus_;
    const auto starts = static_cast<uint64_t>(static_cast<int64_t>(bytes.size()) - seq_ - 1);
    const size_t start = static_cast<size_t>(splitmix64(key_ ^ splitmix64(i)) % starts);
    const uint8_t* w = bytes.data() + start;
    // The per-sample CPU cost is thread CPU time, not a calibrated count of work: the same cost
    // on any machine without a calibration pass, and unlike a wall-clock busy loop it is work done,
    // however many threads share the cores (as decoding is). Not a sleep: that loads no core.
    if (sample_ns_ > 0) {
      const int64_t until = thread_cpu_ns() + sample_ns_;
      uint64_t h = hash_ ^ 1469598103934665603ull;
      do {
        for (int64_t k = 0; k <= seq_; ++k) h = (h ^ w[k]) * 1099511628211ull;  // FNV-1a
      } while (thread_cpu_ns() < until);
      hash_ = h;  // kept, so the loop is not optimized away
    }
    if (io_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(io_us_));
    torch::Tensor tokens = torch::empty({seq_ + 1}, torch::kLong);
    int64_t* p = tokens.data_ptr<int64_t>();
    for (int64_t k = 0; k <= seq_; ++k) p[k] = w[k];
    return {tokens.slice(0, 0, seq_), tokens.slice(0, 1, seq_ + 1)};
  }
  torch::optional<size_t> size() const override { return size_; }

 private:
  std::shared_ptr<const std::vector<uint8_t>> corpus_;
  int64_t seq_;
  uint64_t key_;
  size_t size_;
  int64_t sample_ns_;
  int64_t io_us_;
  uint64_t hash_ = 0;
};

using WindowBatches =
    torch::data::datasets::MapDataset<WindowDataset,
                                      torch::data::transforms::Stack<torch::data::Example<>>>;
using HostLoader = torchpilot::TunableLoader<WindowBatches>;

}  // namespace

struct Trainer::Impl {
  TrainOptions options;
  torch::Device device{torch::kCPU};
  Gpt model{nullptr};
  Optimizer optimizer_kind = Optimizer::kPerParameter;
  std::unique_ptr<torch::optim::AdamW> optimizer;  // kPerParameter
  std::unique_ptr<ListAdamW> list_optimizer;       // kFused, kForeach
  Precision precision = Precision::kFp32;
  torch::Tensor corpus;    // [n] uint8 on the device
  torch::Tensor window;    // [1, T+1] int64: 0..T, on the device
  torch::Tensor loss_sum;  // running sum on the device (no sync per step)
  int64_t loss_steps = 0;
  int64_t corpus_tokens = 0;
  std::unique_ptr<DataParallel> dist;  // world_size > 1 or distributed
  // options.micro_batch > 0: the accumulation loop, for the Pilot train() was last given.
  std::unique_ptr<torchpilot::Accumulation> acc;
  torchpilot::Pilot* acc_pilot = nullptr;
  torchpilot::Pilot* offload_pilot = nullptr;  // holds the offload's knob (auto-tune)
  std::unique_ptr<torchpilot::ActivationOffload> offload;
  // host_loader: the corpus on the host and the loader, attached to loader_pilot.
  std::shared_ptr<const std::vector<uint8_t>> host_corpus;
  std::unique_ptr<HostLoader> loader;
  torchpilot::Pilot* loader_pilot = nullptr;
};

namespace {
// CUDA autocast on for a scope, off again however the scope ends (an out-of-memory error in
// forward must not leave it on for the retry's backward).
struct AutocastScope {
  bool on;
  explicit AutocastScope(bool enable) : on(enable) {
    if (on) torchpilot::compat::set_cuda_autocast(true);
  }
  ~AutocastScope() {
    if (on) torchpilot::compat::set_cuda_autocast(false);
  }
};
}  // namespace

Trainer::Trainer(TrainOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = options;
  if (options.batch <= 0) throw std::invalid_argument("batch must be positive");
  if (options.micro_batch < 0 || options.micro_batch > options.batch) {
    throw std::invalid_argument("micro-batch must be in [0, batch]");
  }
  const bool data_parallel = options.world_size > 1 || options.distributed;
  // Backward's hooks would all-reduce each micro-batch's partial gradients: once, after the last.
  if (options.micro_batch > 0 && data_parallel) m.options.grad_overlap = false;
  if (options.device.empty()) {
    m.device = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::kCPU;
  } else {
    m.device = torch::Device(options.device);
    if (m.device.is_cuda() && !torch::cuda::is_available()) {
      throw std::runtime_error("device " + options.device +
                               " requested but this LibTorch has no CUDA device");
    }
    if (m.device.is_cuda() && !m.device.has_index()) m.device = torch::Device(torch::kCUDA, 0);
  }
  if (options.world_size > 1 && m.device.is_cuda() &&
      options.device.find(':') == std::string::npos) {
    // One GPU per rank: this host's rank picks its own.
    const int gpus = static_cast<int>(torch::cuda::device_count());
    if (options.world_size > gpus) {
      throw std::runtime_error(std::to_string(options.world_size) + " ranks need as many GPUs; " +
                               std::to_string(gpus) + " visible (or run with --device cpu)");
    }
    m.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(options.local_rank));
  }
  if (m.device.is_cuda()) torch::cuda::synchronize(m.device.index());  // creates its context
  m.precision = m.device.is_cuda() ? options.precision : Precision::kFp32;
  if (options.precision == Precision::kBf16 && !m.device.is_cuda()) {
    std::printf("gpt: bf16 autocast is for CUDA; running fp32 on the CPU\n");
  }
  if (options.fused_attention && !fused_attention_available()) {
    std::printf(
        "gpt: fused attention (at::scaled_dot_product_attention) needs LibTorch >= 2.0, this is "
        "%d.%d: running the unfused path\n",
        TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR);
  }

  // Data: byte tokens on the device, once.
  std::vector<uint8_t> bytes = options.text_path.empty()
                                   ? generate_corpus(options.corpus_bytes, options.seed)
                                   : load_text_corpus(options.text_path);
  if (static_cast<int64_t>(bytes.size()) < options.seq + 2) {
    throw std::runtime_error("the text has " + std::to_string(bytes.size()) +
                             " bytes; a window needs seq + 1 = " + std::to_string(options.seq + 1) +
                             " and more");
  }
  m.corpus_tokens = static_cast<int64_t>(bytes.size());
  if (options.host_loader) {
    if (options.loader_epoch_steps <= 0 || options.loader_workers < 0 ||
        options.loader_sample_us < 0 || options.loader_io_us < 0) {
      throw std::invalid_argument(
          "host loader: epoch steps must be positive, workers and sample costs not negative");
    }
    m.host_corpus = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  } else {
    m.corpus = torch::from_blob(bytes.data(), {m.corpus_tokens}, torch::kUInt8)
                   .to(m.device, torch::kUInt8, /*non_blocking=*/false, /*copy=*/true);
  }
  m.window = torch::arange(options.seq + 1, torch::TensorOptions().dtype(torch::kLong))
                 .unsqueeze(0)
                 .to(m.device);

  torch::manual_seed(options.seed);
  GptConfig config;
  config.d_model = options.d_model;
  config.layers = options.layers;
  config.heads = options.heads;
  config.seq = options.seq;
  config.attention = options.fused_attention ? Attention::kFused : Attention::kUnfused;
  config.aten_linear = options.aten_linear;
  m.model = Gpt(config);
  m.model->to(m.device);
  m.model->train();

  // AdamW as nanoGPT configures it: decay matrices and embeddings, not biases and LayerNorm gains.
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : m.model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  m.optimizer_kind = options.optimizer;
  if (m.optimizer_kind == Optimizer::kFused) {
    const std::string problem = fused_adamw_problem(m.device);
    if (!problem.empty()) {
      std::printf("gpt: %s; running the foreach AdamW\n", problem.c_str());
      m.optimizer_kind = Optimizer::kForeach;
    }
  }
  if (m.optimizer_kind == Optimizer::kPerParameter) {
    auto group_options = [&](double wd) {
      auto o = std::make_unique<torch::optim::AdamWOptions>(options.lr);
      o->betas({ListAdamW::kBeta1, ListAdamW::kBeta2}).eps(ListAdamW::kEps).weight_decay(wd);
      return o;
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, group_options(options.weight_decay));
    groups.emplace_back(no_decay, group_options(0.0));
    m.optimizer = std::make_unique<torch::optim::AdamW>(
        std::move(groups),
        torch::optim::AdamWOptions(options.lr).betas({ListAdamW::kBeta1, ListAdamW::kBeta2}));
  } else {
    m.list_optimizer = std::make_unique<ListAdamW>(
        std::vector<std::pair<std::vector<torch::Tensor>, double>>{{decay, options.weight_decay},
                                                                   {no_decay, 0.0}},
        options.lr, m.optimizer_kind == Optimizer::kFused);
  }
  m.loss_sum = torch::zeros({}, torch::TensorOptions().device(m.device));
  if (data_parallel) {
    DistRank r;
    r.rank = options.rank;
    r.world = options.world_size;
    r.local_rank = options.local_rank;
    m.dist = std::make_unique<DataParallel>(r, m.device, m.model->parameters(), options.bucket_mb,
                                            m.options.grad_overlap);
    // The same weights on every rank (same seed above); each rank its own batches.
    torch::manual_seed(options.seed + 7919 * static_cast<uint64_t>(options.rank));
  }
  if (options.offload_activations) {
    torchpilot::OffloadOptions o;
    o.min_bytes = options.offload_min_bytes;
    o.depth = options.offload_depth;
    m.offload = std::make_unique<torchpilot::ActivationOffload>(o);
  }
  if (m.device.is_cuda()) torch::cuda::synchronize();
}

Trainer::~Trainer() {
  if (impl_ && impl_->precision == Precision::kBf16) {
    torchpilot::compat::set_cuda_autocast(false);
    torchpilot::compat::clear_autocast_cache();
  }
}

void Trainer::train(torchpilot::Pilot& pilot, int64_t steps) {
  Impl& m = *impl_;
  const int64_t b = m.options.batch, t = m.options.seq, vocab = m.model->config().vocab;
  const bool autocast = m.precision == Precision::kBf16;
  const int forward = pilot.phase_id("forward");
  const int backward = pilot.phase_id("backward");
  const int optimizer = pilot.phase_id("optimizer");
  const int grad_sync = m.dist ? pilot.phase_id("grad_sync") : -1;
  const int host = m.options.host_ms > 0 ? pilot.phase_id("host") : -1;
  if (m.dist) m.dist->attach(pilot);  // before the first step
  if (m.options.host_loader && m.loader_pilot != &pilot) {
    // A loader per Pilot: attached before the first step, so its knobs are registered before
    // the first step on every rank (the ranks' trial sequences must match). A loader attached to
    // another Pilot leaves it as it goes (detach_pilot destroys it for the same reason).
    m.loader.reset();
    torchpilot::LoaderOptions lo;
    lo.batch_size = static_cast<size_t>(b);
    lo.workers = m.options.loader_workers;
    lo.device_index = m.device.is_cuda() ? m.device.index() : 0;
    lo.drop_last = true;
    lo.seed = m.options.seed;
    lo.name = "gpt";
    const auto samples = static_cast<size_t>(m.options.loader_epoch_steps * b);
    m.loader = std::make_unique<HostLoader>(
        WindowDataset(m.host_corpus, t, m.options.seed, m.options.rank, samples,
                      m.options.loader_sample_us, m.options.loader_io_us)
            .map(torch::data::transforms::Stack<>()),
        lo);
    m.loader->attach(pilot);
    m.loader->start_epoch();
    m.loader_pilot = &pilot;
  }
  const auto long_on_device = torch::TensorOptions().dtype(torch::kLong).device(m.device);
  namespace I = torch::indexing;
  if (m.options.micro_batch > 0 && m.acc_pilot != &pilot) {
    m.acc.reset();  // before its Pilot may go
    torchpilot::AccumulationOptions a;
    a.global_batch = b * m.options.world_size;
    a.world_size = m.options.world_size;
    a.micro_batch = m.options.micro_batch;
    a.choices = m.options.micro_choices;
    m.acc = std::make_unique<torchpilot::Accumulation>(pilot, m.model->parameters(), a);
    m.acc_pilot = &pilot;
  }
  // Auto-tune decides offloading: its knob joins the search, which starts with it off.
  if (m.offload && m.offload->available() && pilot.mode() == torchpilot::Mode::kAutotune &&
      m.offload_pilot != &pilot) {
    m.offload->set_enabled(false);
    pilot.knobs().add(m.offload->knob());
    m.offload_pilot = &pilot;
  }
  auto zero_grad = [&] {
    if (m.optimizer) {
      m.optimizer->zero_grad();
    } else {
      m.list_optimizer->zero_grad();
    }
  };
  auto optimizer_step = [&] {
    if (m.dist) {
      auto p = pilot.phase(grad_sync);
      m.dist->synchronize();
    }
    auto p = pilot.phase(optimizer);
    if (m.optimizer) {
      m.optimizer->step();
    } else {
      m.list_optimizer->step();
    }
  };
  for (int64_t i = 0; i < steps; ++i) {
    // The host loader's batch before the step opens: the wait for it belongs to the step. At the
    // end of a loader epoch next() ends the Pilot's epoch (a no-op right after the program's
    // end_epoch) and the loader's next epoch starts.
    std::optional<torchpilot::TunableLoader<WindowBatches>::Batch> batch;
    if (m.loader) {
      batch = m.loader->next();
      if (!batch) {
        m.loader->start_epoch();
        batch = m.loader->next();
      }
      if (!batch) throw std::runtime_error("the host loader delivered no batch");
    }
    auto step = pilot.step(b * t);  // samples = tokens
    if (m.options.host_ms > 0) {
      auto p = pilot.phase(host);
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::microseconds(static_cast<int64_t>(m.options.host_ms * 1e3));
      while (std::chrono::steady_clock::now() < until) {
      }
    }
    torch::Tensor input, target;
    if (batch) {
      // Pinned (loader.pin_memory): an asynchronous copy; already on the GPU
      // (loader.device_prefetch): no copy.
      input = batch->data.to(m.device, /*non_blocking=*/true);
      target = batch->target.to(m.device, /*non_blocking=*/true);
    } else {
      // The batch, on the device: B random window starts, windows of T+1 tokens.
      torch::Tensor starts = torch::randint(m.corpus_tokens - t - 1, {b, 1}, long_on_device);
      torch::Tensor tokens = torch::take(m.corpus, starts + m.window).to(torch::kLong);
      input = tokens.index({I::Slice(), I::Slice(0, t)});
      target = tokens.index({I::Slice(), I::Slice(1, t + 1)});
    }
    if (m.acc) {
      // Micro-batches of the same B rows; the loss of the step is the scaled losses' sum (a
      // retry after an out-of-memory error starts again from the first micro-batch).
      torch::Tensor step_loss;
      zero_grad();
      m.acc->step(
          {input, target},
          [&](const std::vector<at::Tensor>& mb, const torchpilot::MicroBatch& mbi) {
            torch::Tensor loss;
            {
              auto p = pilot.phase(forward);
              std::optional<torchpilot::ActivationOffload::Scope> offloading;
              if (m.offload) offloading.emplace(m.offload->scope());
              const AutocastScope scope(autocast);
              torch::Tensor logits = m.model->forward(mb[0]);
              loss = torch::nn::functional::cross_entropy(logits.reshape({mbi.size * t, vocab}),
                                                          mb[1].reshape({mbi.size * t}));
            }
            {
              auto p = pilot.phase(backward);
              (loss * mbi.loss_scale).backward();
            }
            const torch::Tensor scaled = loss.detach().to(torch::kFloat) * mbi.loss_scale;
            step_loss = mbi.index == 0 ? scaled : step_loss + scaled;
          },
          optimizer_step);
      m.loss_sum += step_loss;
      ++m.loss_steps;
      if (autocast) torchpilot::compat::clear_autocast_cache();
      continue;
    }
    torch::Tensor loss;
    {
      auto p = pilot.phase(forward);
      std::optional<torchpilot::ActivationOffload::Scope> offloading;
      if (m.offload) offloading.emplace(m.offload->scope());
      if (autocast) torchpilot::compat::set_cuda_autocast(true);
      torch::Tensor logits = m.model->forward(input);
      loss = torch::nn::functional::cross_entropy(logits.reshape({b * t, vocab}),
                                                  target.reshape({b * t}));
      // Backward outside the autocast region, as `with torch.autocast(...)` scopes it.
      if (autocast) torchpilot::compat::set_cuda_autocast(false);
    }
    {
      auto p = pilot.phase(backward);
      zero_grad();
      loss.backward();
    }
    optimizer_step();
    m.loss_sum += loss.detach().to(torch::kFloat);
    ++m.loss_steps;
    if (autocast) torchpilot::compat::clear_autocast_cache();
  }
}

int64_t Trainer::micro_batch() const { return impl_->acc ? impl_->acc->micro_batch() : 0; }
int64_t Trainer::accumulation() const { return impl_->acc ? impl_->acc->accumulation() : 0; }
int64_t Trainer::oom_recoveries() const { return impl_->acc ? impl_->acc->recoveries() : 0; }

double Trainer::take_mean_loss() {
  Impl& m = *impl_;
  if (m.loss_steps == 0) return std::numeric_limits<double>::quiet_NaN();
  const double mean = m.loss_sum.item<double>() / static_cast<double>(m.loss_steps);
  m.loss_sum.zero_();
  m.loss_steps = 0;
  return mean;
}

void Trainer::detach_pilot() {
  if (impl_->dist) impl_->dist->detach();
  impl_->acc.reset();  // its knob leaves the Pilot that goes
  impl_->acc_pilot = nullptr;
  // Destroyed rather than kept: TunableLoader has no detach, and its Pilot pointer must not
  // outlive the Pilot; train() makes a new one (from the epoch's start) for the next Pilot.
  impl_->loader.reset();
  impl_->loader_pilot = nullptr;
  if (impl_->offload_pilot != nullptr) {
    impl_->offload_pilot->knobs().remove_prefix("offload.");
    impl_->offload_pilot = nullptr;
  }
}

void Trainer::set_grad_sync(bool overlap, double bucket_mb) {
  Impl& m = *impl_;
  m.options.grad_overlap = overlap;
  m.options.bucket_mb = bucket_mb;
  if (m.dist) {
    m.dist->set_overlap(overlap);
    m.dist->set_bucket_mb(bucket_mb);
  }
}

void Trainer::set_host_ms(double ms) { impl_->options.host_ms = ms; }

void Trainer::synchronize() {
  if (impl_->device.is_cuda()) torch::cuda::synchronize(impl_->device.index());
}

const TrainOptions& Trainer::options() const { return impl_->options; }

GptShape Trainer::shape() const {
  GptShape s;
  s.vocab = impl_->model->config().vocab;
  s.d_model = impl_->options.d_model;
  s.layers = impl_->options.layers;
  s.seq = impl_->options.seq;
  s.batch = impl_->options.batch;
  return s;
}

std::string Trainer::device() const { return impl_->device.str(); }
bool Trainer::on_cuda() const { return impl_->device.is_cuda(); }
bool Trainer::fused_attention() const { return impl_->model->attention() == Attention::kFused; }
Precision Trainer::precision() const { return impl_->precision; }
Optimizer Trainer::optimizer() const { return impl_->optimizer_kind; }
int64_t Trainer::parameter_count() const { return impl_->model->parameter_count(); }
int64_t Trainer::corpus_size() const { return impl_->corpus_tokens; }
std::string Trainer::comm_backend() const { return impl_->dist ? impl_->dist->backend() : ""; }
torchpilot::ActivationOffload* Trainer::offload() const { return impl_->offload.get(); }

}  // namespace gpt_example
