// Collectives: the RecordFunction observer of c10d backends' collectives, the c10d store adapter
// and the cross-rank pieces' wiring (hooks/comm/collectives.h).
#include <ATen/record_function.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm_observer.h"
#include "torchpilot/hooks/comm/collectives.h"
#include "torchpilot/hooks/gpu/nvlink_peak.h"

#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
#include <cuda_runtime_api.h>
#endif

#if TORCHPILOT_HAVE_C10D
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

namespace torchpilot {

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return (*end == '\0' && x >= 0 && x < (1L << 30)) ? static_cast<int>(x) : -1;
}

}  // namespace

DistEnv dist_env() {
  DistEnv e;
  e.rank = env_int("RANK");
  e.world_size = env_int("WORLD_SIZE");
  e.local_rank = env_int("LOCAL_RANK");
  if (const char* a = std::getenv("MASTER_ADDR")) e.master_addr = a;
  e.master_port = env_int("MASTER_PORT");
  return e;
}

#if TORCHPILOT_HAVE_C10D

namespace {

// --- the observer --------------------------------------------------------------------------------
// RecordFunction takes plain function pointers: the monitor is reached through a global, and each
// scope keeps the monitor alive until its end callback.
std::shared_ptr<CommMonitor> g_monitor;  // std::atomic_load/store
std::atomic<bool> g_installed{false};
at::CallbackHandle g_handle = 0;
std::mutex g_install_mu;

struct CollectiveScope final : at::ObserverContext {
  std::shared_ptr<CommMonitor> monitor;
  int64_t seq = 0;
};

// "gloo:all_reduce" -> kind 1 (timed on the backend's thread); "nccl:*" -> 2 (the scope covers the
// launch only: counted, not timed; GPU time comes from the kernels); others 0.
int backend_kind(const char* name) {
  if (std::strncmp(name, "gloo:", 5) == 0 || std::strncmp(name, "mpi:", 4) == 0) return 1;
  if (std::strncmp(name, "nccl:", 5) == 0 || std::strncmp(name, "ucc:", 4) == 0) return 2;
  return 0;
}

void payload(const at::RecordFunction& fn, int64_t& bytes, std::string& dtype) {
  auto add = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    bytes += static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
    if (dtype.empty()) dtype = std::string(c10::toString(t.scalar_type()));
  };
  for (const c10::IValue& v : fn.inputs()) {
    if (v.isTensor()) {
      add(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) add(t);
    }
  }
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const char* name = fn.name();
  const int kind = name != nullptr ? backend_kind(name) : 0;
  if (kind == 0) return nullptr;
  std::shared_ptr<CommMonitor> monitor = std::atomic_load(&g_monitor);
  if (!monitor) return nullptr;
  try {
    int64_t bytes = 0;
    std::string dtype;
    payload(fn, bytes, dtype);
    const CommOp op = comm_op_from_name(name);
    if (kind == 2) {
      monitor->collective_counted(op, name, bytes, std::move(dtype));
      return nullptr;
    }
    auto scope = std::make_unique<CollectiveScope>();
    scope->seq = monitor->collective_begin(op, name, bytes, std::move(dtype));
    scope->monitor = std::move(monitor);
    return scope;
  } catch (...) {  // the collective goes unobserved; never into the backend
    return nullptr;
  }
}

void on_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  auto* s = static_cast<CollectiveScope*>(ctx);
  if (s->monitor) s->monitor->collective_end(s->seq);
}

// The monitor hooks report to (GradSync), and with `callback` the RecordFunction observer of
// every collective: a global callback makes LibTorch build a RecordFunction for every op, which
// cost 0.2-1.3% (median 0.6%) of a two-GPU GPT trainer's step
// (bench/baselines/collectives/h100x2.json).
void install_observer(std::shared_ptr<CommMonitor> monitor, bool callback) {
  std::lock_guard<std::mutex> lock(g_install_mu);
  std::atomic_store(&g_monitor, std::move(monitor));
  if (!callback) {
    if (g_installed.exchange(false)) at::removeCallback(g_handle);
    return;
  }
  if (g_installed.exchange(true)) return;
  // USER_SCOPE only: the backends' profiling titles. Inputs are boxed for these scopes alone.
  g_handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                       .needsInputs(true)
                                       .scopes({at::RecordScope::USER_SCOPE}));
}

void uninstall_observer() {
  std::lock_guard<std::mutex> lock(g_install_mu);
  std::atomic_store(&g_monitor, std::shared_ptr<CommMonitor>());
  if (g_installed.exchange(false)) at::removeCallback(g_handle);
}

// --- the store -----------------------------------------------------------------------------------
class C10dStore final : public KeyValueStore {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  bool check(const std::vector<std::string>& keys) override { return store_->check(keys); }
  std::string get(const std::string& key) override {
    const std::vector<uint8_t> v = store_->get(key);
    return std::string(v.begin(), v.end());
  }
  bool remove(const std::string& key) override { return store_->deleteKey(key); }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

std::string what_of(const std::exception& e) { return e.what(); }

// The NVLink peak of this rank's GPU (LOCAL_RANK, else the current device) as the comm section's
// link, said once either way.
void detect_link(CommMonitor& monitor, Pilot& pilot, const std::string& who, int local_rank) {
#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
  int device = local_rank;
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) device = 0;
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) bus[0] = '\0';
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    major = 0;
  }
  std::string error;
  const detail::NvlinkPeak p = detail::nvlink_peak_of(device, bus, major, &error);
  if (p.links > 0) {
    const std::string name = "NVLink, " + std::to_string(p.links) + " links";
    monitor.set_link(name, p.bytes_per_s);
    pilot.log(LogLevel::kInfo, who + "link " + name + ", " +
                                   std::to_string(static_cast<int>(p.bytes_per_s / 1e9)) +
                                   " GB/s per direction (the bus-bandwidth reference)");
    return;
  }
  pilot.log(
      LogLevel::kInfo,
      who + "no NVLink seen on GPU " + std::to_string(device) +
          (error.empty() ? std::string() : " (" + error + ")") +
          ": bus bandwidth is not compared with a link's peak (comm.link_peak_gbps sets one)");
#else
  (void)monitor, (void)pilot, (void)who, (void)local_rank;
#endif
}

}  // namespace

namespace detail {
std::shared_ptr<CommMonitor> observing_comm_monitor() { return std::atomic_load(&g_monitor); }
}  // namespace detail

std::shared_ptr<KeyValueStore> adapt_store(c10::intrusive_ptr<c10d::Store> store) {
  return store ? std::make_shared<C10dStore>(std::move(store)) : nullptr;
}

Collectives::Collectives(Pilot& pilot, GroupInfo group, c10::intrusive_ptr<c10d::Store> store)
    : pilot_(&pilot) {
  const Config& config = pilot.config();
  const DistEnv env = dist_env();
  rank_ = group.rank >= 0 ? group.rank : std::max(0, env.rank);
  world_size_ = group.world_size > 0 ? group.world_size : std::max(1, env.world_size);
  if (config.mode == Mode::kOff || !config.comm.enabled) return;
  const std::string who =
      "collectives (rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) + "): ";

  monitor_ = std::make_shared<CommMonitor>();
  monitor_->set_group(group.backend, rank_, world_size_);
  if (config.comm.link_peak_gbps > 0) {
    monitor_->set_link("configured link", config.comm.link_peak_gbps * 1e9);
  } else if (group.backend == "nccl" && world_size_ > 1) {
    detect_link(*monitor_, pilot, who, env.local_rank);
  }
  pilot.add_collector(monitor_);
  // NCCL scopes cover only the launch: the observer would count them and pay a RecordFunction
  // for every op of the trainer. GradSync counts and times its own all-reduces instead.
  const bool callback = group.backend != "nccl" || config.comm.observe_nccl_ops;
  monitor_->set_hooks_count(!callback);
  install_observer(monitor_, callback);
  observing_ = true;
  if (group.backend == "nccl") {
    pilot.log(LogLevel::kInfo,
              who +
                  (callback ? "NCCL collectives are counted from their launches (a "
                              "RecordFunction observer, comm.observe_nccl_ops); "
                            : "torchpilot::GradSync's all-reduces are counted; other NCCL "
                              "collectives are seen in trace windows (comm.observe_nccl_ops "
                              "counts them all, through a RecordFunction on every op); ") +
                  "GradSync's are timed on the GPU (CUDA events)");
  }

  if (world_size_ < 2) {
    pilot.log(LogLevel::kInfo, who + "world size 1: no cross-rank exchange");
    return;
  }
  if (!store && !env.master_addr.empty() && env.master_port > 0) {
    try {
      c10d::TCPStoreOptions opts;
      opts.port = static_cast<std::uint16_t>(env.master_port);
      opts.isServer = false;
      opts.waitWorkers = false;
      opts.timeout =
          std::chrono::milliseconds(static_cast<int64_t>(config.comm.exchange_timeout_ms));
      store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
    } catch (const std::exception& e) {
      pilot.log(LogLevel::kWarn, who + "no store at " + env.master_addr + ":" +
                                     std::to_string(env.master_port) + " (" + what_of(e) +
                                     "): per-rank table, stragglers, joint tuning and the "
                                     "collective watchdog are off");
      return;
    }
  }
  if (!store) {
    pilot.log(LogLevel::kWarn, who +
                                   "no store given and no MASTER_ADDR/MASTER_PORT: per-rank "
                                   "table, stragglers, joint tuning and the collective watchdog "
                                   "are off");
    return;
  }
  const auto timeout = static_cast<Nanos>(config.comm.exchange_timeout_ms * 1e6);
  // Keys of this Collectives' exchanges: a later one (a new Pilot on the same store) must not
  // read the epochs and trials an earlier one posted. Every rank creates its Collectives in the
  // same order, so the count is the same on every rank.
  static std::atomic<int> generation{0};
  const std::string prefix = "torchpilot/" + std::to_string(generation++) + "/";
  exchange_ =
      std::make_shared<RankExchange>(adapt_store(store), rank_, world_size_, timeout, prefix);
  ranks_ = std::make_shared<RankCollector>(exchange_, config.advisors.straggler_rank.threshold,
                                           static_cast<Nanos>(config.comm.ranks_wait_ms * 1e6));
  pilot.add_collector(ranks_);
  Pilot* p = &pilot;
  pilot.set_trial_agreement(
      make_trial_agreement(exchange_, [p](const std::string& m) { p->log(LogLevel::kWarn, m); }));
  pilot.set_interval_agreement(make_interval_agreement(exchange_));
  if (config.comm.watchdog_ms > 0) {
    // The watchdog's thread logs through the Pilot, which outlives this object.
    watchdog_ = std::make_unique<CommWatchdog>(
        exchange_, monitor_.get(), static_cast<Nanos>(config.comm.watchdog_ms * 1e6),
        [p](const std::string& m) { p->log(LogLevel::kWarn, m); });
  }
}

Collectives::~Collectives() {
  watchdog_.reset();
  if (observing_) uninstall_observer();
  if (exchange_ && pilot_ != nullptr) {
    pilot_->set_trial_agreement(nullptr);
    pilot_->set_interval_agreement(nullptr);
  }
}

#endif  // TORCHPILOT_HAVE_C10D

}  // namespace torchpilot
