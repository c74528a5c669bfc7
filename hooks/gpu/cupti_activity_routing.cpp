// The process-wide routing of CUPTI's buffer callbacks and of its API callbacks on synchronizing
// calls (the calling thread, the op a call was made from) to the activity collector.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <unordered_map>

#include "cupti_activity_internal.h"
#include "op_symbols.h"
#include "own_thread.h"
#include "torchpilot/runtime/gpu/host_op_scopes.h"

namespace torchpilot {
namespace detail {
namespace activity_internal {

// --- Process-wide routing of CUPTI's buffer callbacks -------------------------------------------
//
// CUPTI's buffer callbacks carry no user data, so they reach the collector through a process-wide
// pointer. Every buffer torchpilot hands to CUPTI is registered with its owner's id, so a buffer
// that comes back after its collector is gone (or to another collector) is freed, and a buffer that
// is not ours is never touched.

namespace {

struct BufferRegistry {
  std::mutex mutex;
  std::unordered_map<uint8_t*, uint64_t> owner;  // buffer -> collector id
};
BufferRegistry& registry() {
  static BufferRegistry r;
  return r;
}

bool is_copy_call(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  return std::any_of(std::begin(kCopyCallbacks), std::end(kCopyCallbacks),
                     [&](const SyncCallbackId& c) { return c.domain == domain && c.cbid == cbid; });
}

// Whether this copy call gets an op scope, by its kind (the four copy calls' parameters begin
// alike: dst, src, count, kind).
bool copy_with_scope(const CUpti_CallbackData& info) {
  static_assert(
      offsetof(cudaMemcpyAsync_v3020_params, kind) == offsetof(cudaMemcpy_v3020_params, kind),
      "copy parameters differ");
  static_assert(
      offsetof(cudaMemcpy_ptds_v7000_params, kind) == offsetof(cudaMemcpy_v3020_params, kind),
      "copy parameters differ");
  static_assert(
      offsetof(cudaMemcpyAsync_ptsz_v7000_params, kind) == offsetof(cudaMemcpy_v3020_params, kind),
      "copy parameters differ");
  const auto* p = static_cast<const cudaMemcpy_v3020_params*>(info.functionParams);
  return p == nullptr || copy_gets_op_scope(p->kind);
}

// The op a synchronizing call (or a copy to or from the host) was made from, while a window wants
// op names (HostOpScopes enabled): its stack at the call's entry, a scope from entry to exit. A
// call made inside another (the driver's synchronize inside the runtime's) is part of the outer
// one.
struct CallCapture {
  bool open = false;
  CUpti_CallbackDomain domain = CUPTI_CB_DOMAIN_INVALID;
  CUpti_CallbackId cbid = 0;
  bool copy = false;
  Nanos begin = 0;
  OpCall call;
};
thread_local CallCapture t_capture;
// The last scope's op call on this thread: a synchronize right after a copy from the same call
// (an item(): the value's copy, then the wait) is the same op call.
struct LastCall {
  uintptr_t pc = 0, cfa = 0;
  uint64_t id = 0;
  bool copy = false;
};
thread_local LastCall t_last_call;
std::atomic<uint64_t> next_call_id{1};
constexpr Nanos kStaleCapture = 10'000'000'000;  // an exit never seen (callbacks switched off)

void capture_enter(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, bool copy) {
  CallCapture& c = t_capture;
  const Nanos now = steady_now_ns();
  if (c.open && now - c.begin < kStaleCapture) return;  // inside an outer call
  c.open = false;
  if (!HostOpScopes::instance().enabled() || on_own_thread()) return;
  const OpCall call = outermost_op_call();
  if (call.op == nullptr) return;  // no op on the stack: the sync keeps its API's name
  c.open = true;
  c.domain = domain;
  c.cbid = cbid;
  c.copy = copy;
  c.begin = now;
  c.call = call;
}

void capture_exit(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  CallCapture& c = t_capture;
  if (!c.open || c.domain != domain || c.cbid != cbid) return;
  c.open = false;
  LastCall& last = t_last_call;
  const bool same = !c.copy && last.copy && last.pc == c.call.pc && last.cfa == c.call.cfa;
  const uint64_t id = same ? last.id : next_call_id.fetch_add(1, std::memory_order_relaxed);
  last = {c.call.pc, c.call.cfa, id, c.copy};
  HostOpScope scope;
  scope.begin = c.begin;
  scope.end = steady_now_ns();
  scope.op = *c.call.op;
  scope.always = false;  // counted only where CUPTI saw the host wait
  scope.call = id;
  HostOpScopes::instance().push(std::move(scope));
}

}  // namespace

std::shared_mutex& route_mutex() {
  static std::shared_mutex m;
  return m;
}
ActivityCollector*& route() {
  static ActivityCollector* collector = nullptr;
  return collector;
}

uint8_t* allocate_buffer(size_t bytes, uint64_t owner) {
  // CUPTI wants 8-byte alignment (ACTIVITY_RECORD_ALIGNMENT); calloc gives 16, and zeroes:
  // CUPTI is told it need not (CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER).
  auto* buffer = static_cast<uint8_t*>(std::calloc(1, bytes));
  if (buffer == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().owner[buffer] = owner;
  return buffer;
}

// 0 when the buffer is not one of ours.
uint64_t owner_of(uint8_t* buffer) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  const auto it = registry().owner.find(buffer);
  return it == registry().owner.end() ? 0 : it->second;
}

void free_buffer(uint8_t* buffer) {
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    if (registry().owner.erase(buffer) == 0) return;  // not ours: leave it alone
  }
  std::free(buffer);
}

void CUPTIAPI on_buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  std::shared_lock<std::shared_mutex> lock(route_mutex());
  if (route() != nullptr) {
    try {  // CUPTI's thread, through C frames: nothing may unwind out of here
      route()->buffer_requested(buffer, size, max_records);
      return;
    } catch (...) {
    }
  }
  *buffer = nullptr;
  *size = 0;
  *max_records = 0;
}

void CUPTIAPI on_buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t size,
                                  size_t valid_size) {
  std::shared_lock<std::shared_mutex> lock(route_mutex());
  if (route() != nullptr) {
    try {
      route()->buffer_completed(buffer, size, valid_size);
    } catch (...) {
      // The records are lost; the buffer may already be back in the pool.
    }
    return;
  }
  free_buffer(buffer);
}

// On the calling thread, inside the call: which thread made it, by its correlation id (a runtime
// call and the driver call inside it each have one; the sync record carries one of them); and the
// op it was made from.
void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                          const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info == nullptr) return;
  try {  // inside the program's CUDA call: nothing may unwind out of here
    const bool copy = is_copy_call(domain, cbid);
    if (info->callbackSite == CUPTI_API_EXIT) {
      capture_exit(domain, cbid);
      return;
    }
    if (info->callbackSite != CUPTI_API_ENTER) return;
    if (copy && !copy_with_scope(*info)) return;
    capture_enter(domain, cbid, copy);
    if (copy) return;  // a copy has no sync record to tag
    std::shared_lock<std::shared_mutex> lock(route_mutex());
    if (route() == nullptr) return;
    route()->note_sync_call(info->correlationId, on_own_thread());
  } catch (...) {
  }
}

}  // namespace activity_internal
}  // namespace detail
}  // namespace torchpilot
