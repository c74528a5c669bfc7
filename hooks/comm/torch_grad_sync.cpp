// GradSync (hooks/comm/grad_sync.h).
#include "torchpilot/hooks/comm/grad_sync.h"

#if __has_include(<torch/csrc/distributed/c10d/Work.hpp>)
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <exception>
#include <stdexcept>
#include <utility>

#include "comm_observer.h"

// GPU timing of the syncs: CUDA builds of LibTorch 2.x (Work::getDuration).
#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA && TORCH_VERSION_MAJOR >= 2
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#define TORCHPILOT_GRAD_SYNC_GPU_TIMING 1
#else
#define TORCHPILOT_GRAD_SYNC_GPU_TIMING 0
#endif

namespace torchpilot {

#if TORCHPILOT_GRAD_SYNC_GPU_TIMING
namespace {
// A Work's GPU duration in ms where c10d has Work::getDuration (throws without timing enabled).
template <typename W>
auto work_duration_ms(const W& w, int) -> decltype(static_cast<double>(w.getDuration())) {
  return static_cast<double>(w.getDuration());
}
template <typename W>
double work_duration_ms(const W&, long) {
  throw std::runtime_error("c10d::Work has no getDuration in this LibTorch");
}
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }
}  // namespace
#endif

struct GradSync::State {
  struct Bucket {
    std::vector<size_t> params;  // indices into State::params
    std::vector<int64_t> offsets;
    int64_t numel = 0;
    at::Tensor buffer;
    c10::intrusive_ptr<c10d::Work> work;
    size_t pending = 0;  // gradients not ready yet in this backward
    bool issued = false;
  };
  std::vector<at::Tensor> params;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<uintptr_t> hook_keys;
  AllReduce all_reduce;
  int world_size = 1;
  bool overlap = true;
  bool average = true;
  double bucket_mb = 25;
  std::mutex mu;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;  // by parameter
  size_t next_issue = 0;
  std::string failure;  // an all-reduce that could not be issued

#if TORCHPILOT_GRAD_SYNC_GPU_TIMING
  // One synchronize() on the GPU: `begin` recorded on the compute stream once backward and every
  // bucket's copy are queued, `end` after the stream was made to wait for the all-reduces. end -
  // begin is the compute stream's wait for communication after backward (exposed); each Work's
  // own duration (NCCL's start and end events) is its GPU time. Resolved in later calls, once
  // `end` completed: never waited for. (An event on a side stream made to wait for the last
  // all-reduce would not count a host late to queue `end`, but it cost 2% of the step on one
  // H100, NCCL world size 1: 39.4 against 38.6 ms.)
  struct Timed {
    at::cuda::CUDAEvent begin{cudaEventDefault};
    at::cuda::CUDAEvent end{cudaEventDefault};
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    int64_t bytes = 0;
    int64_t sync = 0;  // syncs before this one in the process: the same on every rank
  };
  std::deque<std::unique_ptr<Timed>> timed;
  static constexpr size_t kMaxTimed = 16;  // unresolved beyond this: the oldest is dropped
  bool timing_failed = false;              // a Work without durations: timing stays off

  // Reports the completed syncs, oldest first, to `monitor`.
  void resolve(CommMonitor* monitor) {
    while (!timed.empty()) {
      Timed& t = *timed.front();
      if (!t.end.query()) break;
      Nanos busy = 0;
      std::vector<Nanos> durations;
      for (const auto& w : t.works) {
        durations.push_back(static_cast<Nanos>(work_duration_ms(*w, 0) * 1e6));
        busy += durations.back();
      }
      const auto exposed = std::max<Nanos>(
          0, static_cast<Nanos>(static_cast<double>(t.begin.elapsed_time(t.end)) * 1e6));
      if (monitor != nullptr) {
        CommMonitor::GpuTiming g;
        g.op = CommOp::kAllReduce;
        g.collectives = static_cast<int64_t>(t.works.size());
        g.bytes = t.bytes;
        g.busy_ns = busy;
        g.exposed_ns = exposed;
        g.sync = t.sync;
        g.durations = std::move(durations);
        monitor->add_gpu_timing(g);
      }
      timed.pop_front();
    }
    while (timed.size() > kMaxTimed) timed.pop_front();
  }
#endif

  void build() {
    buckets.clear();
    bucket_of.assign(params.size(), 0);
    const double limit = bucket_mb * 1024.0 * 1024.0;
    // Reverse order: backward produces the last layers' gradients first.
    for (size_t k = params.size(); k-- > 0;) {
      const at::Tensor& p = params[k];
      const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
      bool fits = !buckets.empty();
      if (fits) {
        const Bucket& b = buckets.back();
        const at::Tensor& first = params[b.params.front()];
        fits = first.scalar_type() == p.scalar_type() && first.device() == p.device() &&
               static_cast<double>((b.numel + p.numel()) * p.element_size()) <= limit;
      }
      if (!fits) buckets.emplace_back();
      Bucket& b = buckets.back();
      b.params.push_back(k);
      b.offsets.push_back(b.numel);
      b.numel += p.numel();
      bucket_of[k] = buckets.size() - 1;
      (void)bytes;
    }
    reset();
  }

  void reset() {
    for (Bucket& b : buckets) {
      b.pending = b.params.size();
      b.issued = false;
      b.work.reset();
    }
    next_issue = 0;
  }

  // mu held. Copies the bucket's gradients (zeros for a missing one) and starts its all-reduce.
  void issue(Bucket& b) {
    fill(b);
    start(b);
  }

  // mu held. The bucket's gradients (zeros for a missing one) into its buffer.
  void fill(Bucket& b) {
    at::NoGradGuard no_grad;
    const at::Tensor& first = params[b.params.front()];
    if (!b.buffer.defined() || b.buffer.numel() != b.numel || b.buffer.device() != first.device()) {
      b.buffer = at::empty({b.numel}, first.options().requires_grad(false));
    }
    for (size_t i = 0; i < b.params.size(); ++i) {
      const at::Tensor& p = params[b.params[i]];
      at::Tensor slice = b.buffer.narrow(0, b.offsets[i], p.numel());
      const at::Tensor& g = p.grad();
      if (g.defined()) {
        slice.copy_(g.reshape({-1}));
      } else {
        slice.zero_();
      }
    }
  }

  // mu held. Starts the all-reduce of a filled bucket.
  void start(Bucket& b) {
    std::vector<at::Tensor> t{b.buffer};
    b.issued = true;
    // Counted here when no observer sees the backend's collectives (NCCL by default).
    if (auto monitor = detail::observing_comm_monitor(); monitor && monitor->hooks_count()) {
      monitor->collective_counted(CommOp::kAllReduce, "grad_sync:all_reduce",
                                  b.numel * static_cast<int64_t>(b.buffer.element_size()),
                                  std::string(c10::toString(b.buffer.scalar_type())));
    }
    try {
      b.work = all_reduce(t);
    } catch (const std::exception& e) {
      if (failure.empty()) failure = e.what();
    } catch (...) {
      if (failure.empty()) failure = "unknown exception";
    }
  }

  // mu held. Issues buckets in order while they are complete.
  void issue_ready() {
    while (next_issue < buckets.size() && buckets[next_issue].pending == 0) {
      issue(buckets[next_issue++]);
    }
  }

  void ready(size_t param) {
    std::lock_guard<std::mutex> lock(mu);
    if (!overlap || param >= bucket_of.size()) return;
    Bucket& b = buckets[bucket_of[param]];
    if (b.pending > 0) --b.pending;
    issue_ready();
  }
};

namespace {

class ReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::weak_ptr<GradSync::State> state, size_t param)
      : state_(std::move(state)), param_(param) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    if (auto s = state_.lock()) {
      try {
        s->ready(param_);
      } catch (...) {  // never into backward: synchronize() issues what is left
      }
    }
    return outputs;
  }

 private:
  std::weak_ptr<GradSync::State> state_;
  size_t param_;
};

}  // namespace

GradSync::GradSync(std::vector<at::Tensor> params, AllReduce all_reduce, int world_size,
                   GradSyncOptions options)
    : state_(std::make_shared<State>()), options_(options) {
  State& s = *state_;
  for (auto& p : params) {
    if (p.requires_grad()) s.params.push_back(p);
  }
  s.all_reduce = std::move(all_reduce);
  s.world_size = std::max(1, world_size);
  s.overlap = options.overlap;
  s.average = options.average;
  s.bucket_mb = std::max(0.0, options.bucket_mb);
  s.build();
  for (size_t k = 0; k < s.params.size(); ++k) {
    // The parameter holds its accumulator weakly: keep it alive, or the hook goes with it.
    auto acc = torch::autograd::impl::grad_accumulator(s.params[k]);
    s.hook_keys.push_back(acc->add_post_hook(std::make_unique<ReadyHook>(state_, k)));
    s.accumulators.push_back(std::move(acc));
  }
}

GradSync::~GradSync() {
  State& s = *state_;
  for (size_t k = 0; k < s.accumulators.size(); ++k) {
    s.accumulators[k]->del_post_hook(s.hook_keys[k]);
  }
}

void GradSync::synchronize() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
#if TORCHPILOT_GRAD_SYNC_GPU_TIMING
  // Timed only while a Collectives observes, on CUDA, and while the Works have durations.
  std::shared_ptr<CommMonitor> monitor;
  std::unique_ptr<State::Timed> timed;
  // Counted whether timed or not, over every GradSync of the process (one rebuilt, or one per
  // model): ranks that run the same program agree on each sync's number.
  static std::atomic<int64_t> syncs{0};
  const int64_t sync_number = syncs.fetch_add(1, std::memory_order_relaxed);
  // No durations (timing not enabled on the group) or no events: timing off for good, said once.
  auto timing_off = [&](const std::string& why) {
    s.timing_failed = true;
    s.timed.clear();
    timed.reset();
    monitor->gpu_timing_unavailable(why);
  };
  if (!s.timing_failed && !s.params.empty() && s.params.front().is_cuda()) {
    monitor = detail::observing_comm_monitor();
    if (monitor) {
      try {
        s.resolve(monitor.get());
        timed = std::make_unique<State::Timed>();
        timed->sync = sync_number;
      } catch (const std::exception& e) {
        timing_off(first_line(e.what()));
      } catch (...) {
        timing_off("an unknown error");
      }
    }
  }
#endif
  // Whatever backward did not reach (overlap off, unused parameters), in order: all copies
  // first, so that from `begin` on the compute stream only waits (a detailed window's
  // "communication with no compute kernel running"; copies between the all-reduces made the
  // events read 10% off the window's without overlap, either way).
  for (size_t i = s.next_issue; i < s.buckets.size(); ++i) s.fill(s.buckets[i]);
#if TORCHPILOT_GRAD_SYNC_GPU_TIMING
  if (timed) {
    try {
      timed->begin.record(at::cuda::getCurrentCUDAStream(s.params.front().device().index()));
    } catch (const std::exception& e) {
      timing_off(first_line(e.what()));
    } catch (...) {
      timing_off("an unknown error");
    }
  }
#endif
  while (s.next_issue < s.buckets.size()) s.start(s.buckets[s.next_issue++]);
  std::string failure = s.failure;
  for (size_t i = 0; i < s.buckets.size() && failure.empty(); ++i) {
    State::Bucket& b = s.buckets[i];
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (const std::exception& e) {
      failure = "bucket " + std::to_string(i) + ": " + e.what();
    }
  }
  if (!failure.empty()) {
    s.failure.clear();
    s.reset();
    TORCH_CHECK(false, "torchpilot::GradSync: the gradient all-reduce failed: ", failure);
  }
#if TORCHPILOT_GRAD_SYNC_GPU_TIMING
  if (timed) {
    try {
      // The waits above made the compute stream wait for the all-reduces: this event completes
      // when they have.
      timed->end.record(at::cuda::getCurrentCUDAStream(s.params.front().device().index()));
      for (State::Bucket& b : s.buckets) {
        if (!b.work) continue;
        timed->works.push_back(b.work);
        timed->bytes += b.numel * static_cast<int64_t>(b.buffer.element_size());
      }
      s.timed.push_back(std::move(timed));
    } catch (const std::exception& e) {
      timing_off(first_line(e.what()));
    } catch (...) {
      timing_off("an unknown error");
    }
  }
#endif
  at::NoGradGuard no_grad;
  for (State::Bucket& b : s.buckets) {
    if (s.average && s.world_size > 1) b.buffer.div_(s.world_size);
    for (size_t i = 0; i < b.params.size(); ++i) {
      at::Tensor& p = s.params[b.params[i]];
      at::Tensor slice = b.buffer.narrow(0, b.offsets[i], p.numel()).view(p.sizes());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(slice);
      } else {
        p.mutable_grad() = slice.clone();
      }
    }
  }
  if (s.bucket_mb != options_.bucket_mb) {
    s.bucket_mb = options_.bucket_mb;
    s.build();
  } else {
    s.reset();
  }
  s.overlap = options_.overlap;
}

void GradSync::set_bucket_mb(double mb) { options_.bucket_mb = std::max(0.0, mb); }
void GradSync::set_overlap(bool overlap) { options_.overlap = overlap; }

int GradSync::buckets() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return static_cast<int>(state_->buckets.size());
}

Knob GradSync::knob(std::vector<int64_t> choices) {
  Knob k;
  k.name = "grad_sync.bucket_mb";
  std::sort(choices.begin(), choices.end());
  k.domain = std::move(choices);
  k.get = [this] { return static_cast<int64_t>(options_.bucket_mb); };
  k.set = [this](int64_t v) { set_bucket_mb(static_cast<double>(v)); };
  return k;
}

}  // namespace torchpilot
#endif
