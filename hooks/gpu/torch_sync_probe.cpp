// The sync probe (docs/metrics.md, "Outliers" and "Host syncs"): what a recurring slow step does
// that waits for the GPU or copies to the host. Once the stall tracker knows a period, the steps
// around each periodic stall (from the step after one whose record says at_period, while records
// say so, and one more) are probed; so are a few ordinary steps after a trace window that saw host
// syncs (records marked probe_syncs by the GPU monitor: how long the host waits in them untraced).
// A RecordFunction observer, enabled only for those steps and counting only the training thread,
// times the ops that synchronize with the GPU:
//   aten::_local_scalar_dense of a CUDA tensor (item()),
//   aten::copy_ from a CUDA tensor into host memory (.cpu(), .to(kCPU), torch::save's copies),
// and sums the bytes copied to the host. The probed steps' records carry sync.ms, sync.ops,
// sync.d2h_mb and sync.probed; the stall tracker compares the stalls with the ordinary steps
// probed beside them. Off those steps the callback stays disabled and costs nothing.
//
// A default collector (one per Pilot), registered at static initialization; the anchor is named
// on the link line (CMake, torchpilot). Nothing here throws into the training loop.
#include <ATen/record_function.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "torchpilot/runtime/core/anchor.h"
#include "torchpilot/runtime/core/collector.h"

namespace torchpilot {
namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One probed step's tally: written by the callbacks on the training thread only, read there too.
struct Tally {
  std::thread::id thread;
  int64_t ns = 0;
  int64_t ops = 0;
  int64_t d2h_bytes = 0;
};

std::atomic<Tally*> g_tally{nullptr};  // the probing Pilot's tally; null: nobody probes
std::mutex g_install_mu;
bool g_installed = false;
at::CallbackHandle g_handle = 0;

struct ProbeScope final : at::ObserverContext {
  int64_t start_ns = 0;
  int64_t bytes = 0;
};

bool is_cuda_tensor(const c10::IValue& v) { return v.isTensor() && v.toTensor().is_cuda(); }

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  Tally* t = g_tally.load(std::memory_order_acquire);
  if (t == nullptr || std::this_thread::get_id() != t->thread) return nullptr;
  try {
    const char* name = fn.name();
    if (name == nullptr) return nullptr;
    int64_t bytes = 0;
    const auto inputs = fn.inputs();
    if (std::strcmp(name, "aten::_local_scalar_dense") == 0) {
      if (inputs.empty() || !is_cuda_tensor(inputs[0])) return nullptr;
    } else if (std::strcmp(name, "aten::copy_") == 0) {
      // copy_(self, src, non_blocking): into host memory from the device.
      if (inputs.size() < 2 || !inputs[0].isTensor() || inputs[0].toTensor().is_cuda() ||
          !is_cuda_tensor(inputs[1])) {
        return nullptr;
      }
      bytes = static_cast<int64_t>(inputs[1].toTensor().nbytes());
    } else {
      return nullptr;
    }
    auto scope = std::make_unique<ProbeScope>();
    scope->bytes = bytes;
    scope->start_ns = steady_ns();
    return scope;
  } catch (...) {
    return nullptr;
  }
}

void on_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  Tally* t = g_tally.load(std::memory_order_acquire);
  if (t == nullptr || std::this_thread::get_id() != t->thread) return;
  const auto* scope = static_cast<const ProbeScope*>(ctx);
  t->ns += steady_ns() - scope->start_ns;
  t->ops += 1;
  t->d2h_bytes += scope->bytes;
}

class SyncProbe final : public Collector {
 public:
  ~SyncProbe() override { stop(); }
  std::string name() const override { return "sync_probe"; }
  // Called at the steps marked at_period or probe_syncs; at every step while probing.
  unsigned step_hooks() const override { return kHookPeriodStepEnd; }
  void attach(CollectorHost* host) override {
    host_ = host;
    if (host == nullptr) stop();
  }
  void on_step_end(StepRecord& r) override {
    if (probing_) {
      r.metrics.set("sync", "probed", 1);
      r.metrics.set("sync", "ms", static_cast<double>(tally_.ns) / 1e6);
      r.metrics.set("sync", "ops", static_cast<double>(tally_.ops));
      r.metrics.set("sync", "d2h_mb", static_cast<double>(tally_.d2h_bytes) / 1e6);
      tally_ = Tally{tally_.thread};
    }
    // The next step sits at the period (or is the one after it), or was asked for: probe it,
    // boundary to boundary.
    const bool want = r.at_period || r.probe_syncs;
    if (want && !probing_) {
      start();
    } else if (!want && probing_) {
      stop();
    }
  }

 private:
  void start() {
    if (failed_) return;
    try {
      {
        std::lock_guard<std::mutex> lock(g_install_mu);
        if (!g_installed) {
          g_handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                               .needsInputs(true)
                                               .scopes({at::RecordScope::FUNCTION}));
          at::disableCallback(g_handle);
          g_installed = true;
        }
      }
      tally_ = Tally{std::this_thread::get_id()};
      Tally* expected = nullptr;
      // Another Pilot probing at the same moment keeps the observer: this one skips.
      if (!g_tally.compare_exchange_strong(expected, &tally_)) return;
      at::reenableCallback(g_handle);
      probing_ = true;
      if (host_ != nullptr) host_->set_step_hooks(*this, kHookStepEnd);
    } catch (...) {
      failed_ = true;  // no observer: stalls keep their other figures
      g_tally.store(nullptr);
    }
  }
  void stop() {
    if (!probing_) return;
    probing_ = false;
    if (host_ != nullptr) host_->set_step_hooks(*this, kHookPeriodStepEnd);
    try {
      at::disableCallback(g_handle);
    } catch (...) {
    }
    g_tally.store(nullptr, std::memory_order_release);
  }

  Tally tally_;
  CollectorHost* host_ = nullptr;
  bool probing_ = false;
  bool failed_ = false;
};

std::unique_ptr<Collector> make_sync_probe(CollectorHost& host) {
  if (host.config().mode == Mode::kOff) return nullptr;
  return std::make_unique<SyncProbe>();
}

}  // namespace

TORCHPILOT_REGISTRATION(sync_probe) {
  // After the GPU monitor (0), which marks probe_syncs in its on_step_end.
  register_default_collector("sync_probe", 10, &make_sync_probe);
}

}  // namespace torchpilot
