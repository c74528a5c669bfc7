// SyncScopeHook: RecordFunction scopes of ops that may synchronize -> HostOpScopes; and the
// default collector that makes one for every Pilot on a CUDA device.
#include "torchpilot/hooks/torch_sync_scopes.h"

#include <ATen/record_function.h>
#include <torch/cuda.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "torchpilot/runtime/collector.h"
#include "torchpilot/runtime/host_op_scopes.h"

namespace torchpilot {
namespace {

std::atomic<SyncScopeHook*> g_owner{nullptr};
thread_local int t_depth = 0;  // recorded scopes open on this thread

Nanos steady_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Scope final : at::ObserverContext {
  Nanos begin = 0;
  const char* op = nullptr;  // the RecordFunction's name: valid until its end callback
  bool always = false;
  bool nested = false;  // inside another recorded scope on this thread: not recorded
};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const char* name = fn.name();
  const int kind = sync_op_kind(name);
  if (kind == 0) return nullptr;
  auto s = std::make_unique<Scope>();
  s->nested = t_depth++ > 0;
  s->op = name;
  s->always = kind == 1;
  s->begin = steady_now();
  return s;
}

void on_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  auto* s = static_cast<Scope*>(ctx);
  if (t_depth > 0) --t_depth;
  if (s->nested) return;
  try {
    HostOpScope scope;
    scope.begin = s->begin;
    scope.end = steady_now();
    scope.op = s->op;
    scope.always = s->always;
    HostOpScopes::instance().push(std::move(scope));
  } catch (...) {  // bad_alloc: the scope is lost, the op goes on
  }
}

// Made by every Pilot (a default collector): owns a hook while a CUDA device is there.
class SyncScopeCollector : public Collector {
 public:
  std::string name() const override { return "sync_scopes"; }

 private:
  SyncScopeHook hook_;
};

std::unique_ptr<Collector> make_sync_scope_collector(CollectorHost& host) {
  const Config& config = host.config();
  if (config.mode == Mode::kOff || !config.gpu.enabled || !host.steady_clock()) return nullptr;
  try {
    if (!torch::cuda::is_available()) return nullptr;  // no GPU, no GPU syncs
  } catch (...) {
    return nullptr;
  }
  auto collector = std::make_unique<SyncScopeCollector>();
  return collector;
}

const bool registered = [] {
  register_default_collector(&make_sync_scope_collector);
  return true;
}();

bool starts_with(const char* s, const char* prefix) {
  return std::strncmp(s, prefix, std::strlen(prefix)) == 0;
}

}  // namespace

int sync_op_kind(const char* name) {
  // Most ops are not ours: one comparison rejects them (names are "aten::..." or other domains).
  if (name == nullptr || std::strncmp(name, "aten::", 6) != 0) return 0;
  const char* n = name + 6;
  switch (n[0]) {
    case 'i':
      return std::strcmp(n, "item") == 0 || std::strcmp(n, "is_nonzero") == 0 ? 1 : 0;
    case '_':
      if (std::strcmp(n, "_local_scalar_dense") == 0 || starts_with(n, "_unique")) return 1;
      return std::strcmp(n, "_to_copy") == 0 ? 2 : 0;
    case 'n':
      return std::strcmp(n, "nonzero") == 0 ? 1 : 0;
    case 'm':
      return std::strcmp(n, "masked_select") == 0 ? 1 : 0;
    case 'u':
      return starts_with(n, "unique") ? 1 : 0;
    case 'r':
      return std::strcmp(n, "repeat_interleave") == 0 ? 1 : 0;
    case 'e':
      return std::strcmp(n, "equal") == 0 ? 1 : 0;
    case 't':
      return std::strcmp(n, "to") == 0 ? 2 : 0;
    case 'c':
      return std::strcmp(n, "copy_") == 0 ? 2 : 0;
    default:
      return 0;
  }
}

SyncScopeHook::SyncScopeHook() {
  SyncScopeHook* expected = nullptr;
  if (!g_owner.compare_exchange_strong(expected, this)) return;
  try {
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_start, &on_end).scopes({at::RecordScope::FUNCTION}));
    at::disableCallback(handle_);
  } catch (...) {
    g_owner.store(nullptr);
    return;
  }
  active_ = true;
  const uint64_t handle = handle_;
  // The monitor switches the callback on for trace windows only.
  HostOpScopes::instance().set_switch([handle](bool on) {
    try {
      if (on) {
        at::reenableCallback(handle);
      } else {
        at::disableCallback(handle);
      }
    } catch (...) {  // the window goes on without op names
    }
  });
}

SyncScopeHook::~SyncScopeHook() {
  if (!active_) return;
  try {
    HostOpScopes::instance().set_switch({});
    at::disableCallback(handle_);
    at::removeCallback(handle_);
  } catch (...) {
  }
  g_owner.store(nullptr);
}

}  // namespace torchpilot

extern "C" int torchpilot_sync_scopes_anchor() { return torchpilot::registered ? 1 : 0; }
