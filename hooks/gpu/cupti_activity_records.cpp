// CUPTI activity records -> vendor-neutral events: the pure converters (kernels, copies, memsets,
// syncs) and the demangled-name cache.
#include <cxxabi.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "cupti_activity_trace.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"

namespace torchpilot {
namespace detail {

// --- Pure converters ---------------------------------------------------------------------------

std::string demangle(const char* name) {
  if (name == nullptr) return "<unknown>";
  if (std::strncmp(name, "_Z", 2) != 0) return name;
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || out == nullptr) {
    std::free(out);
    return name;
  }
  std::string result(out);
  std::free(out);
  return result;
}

CopyKind to_copy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA:
      return CopyKind::kHostToDevice;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH:
      return CopyKind::kDeviceToHost;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return CopyKind::kDeviceToDevice;
    default:
      return CopyKind::kOther;
  }
}

std::string DemangleCache::get(const char* mangled) {
  if (mangled == nullptr) return "<unknown>";
  std::string key(mangled);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = names_.find(key);
    if (it != names_.end()) return it->second;
  }
  std::string name = demangle(mangled);  // outside the lock: it can take microseconds
  std::lock_guard<std::mutex> lock(mutex_);
  if (names_.size() >= capacity_) names_.clear();
  names_.emplace(std::move(key), name);
  return name;
}

namespace {

bool valid_interval(uint64_t start, uint64_t end) { return start != 0 && end != 0 && end >= start; }

}  // namespace

std::optional<KernelRecord> to_kernel(const CUpti_ActivityKernel10& r, const TimeBase& tb,
                                      DemangleCache* names) {
  if (!valid_interval(r.start, r.end)) return std::nullopt;
  KernelRecord k;
  k.begin = tb.to_steady(r.start);
  k.end = tb.to_steady(r.end);
  k.blocks = static_cast<int64_t>(r.gridX) * r.gridY * r.gridZ;
  k.block_threads = r.blockX * r.blockY * r.blockZ;
  k.stream = r.streamId;
  k.name = names != nullptr ? names->get(r.name) : demangle(r.name);
  k.communication = is_communication_kernel(k.name);
  return k;
}

namespace {

// What memcpy and memset records share: the interval and the bytes; nullopt for an invalid
// interval.
template <class Record>
std::optional<CopyRecord> copy_like(const Record& r, const TimeBase& tb) {
  if (!valid_interval(r.start, r.end)) return std::nullopt;
  CopyRecord c;
  c.begin = tb.to_steady(r.start);
  c.end = tb.to_steady(r.end);
  c.bytes = static_cast<int64_t>(r.bytes);
  return c;
}

}  // namespace

std::optional<CopyRecord> to_copy(const CUpti_ActivityMemcpy6& r, const TimeBase& tb) {
  std::optional<CopyRecord> c = copy_like(r, tb);
  if (!c) return c;
  c->kind = to_copy_kind(r.copyKind);
  const bool src_pageable = r.srcKind == CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE;
  const bool dst_pageable = r.dstKind == CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE;
  // The host side's memory: the source's to the device, the destination's to the host, else either.
  c->pageable = c->kind == CopyKind::kHostToDevice   ? src_pageable
                : c->kind == CopyKind::kDeviceToHost ? dst_pageable
                                                     : src_pageable || dst_pageable;
  c->memset = false;
  return c;
}

std::optional<CopyRecord> to_memset(const CUpti_ActivityMemset4& r, const TimeBase& tb) {
  std::optional<CopyRecord> c = copy_like(r, tb);
  if (!c) return c;
  c->kind = CopyKind::kOther;
  c->pageable = false;
  c->memset = true;
  return c;
}

std::optional<SyncRecord> to_sync(const CUpti_ActivitySynchronization2& r, const TimeBase& tb) {
  if (r.type == CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT) return std::nullopt;
  if (!valid_interval(r.start, r.end)) return std::nullopt;
  SyncRecord s;
  s.begin = tb.to_steady(r.start);
  s.end = tb.to_steady(r.end);
  s.correlation_id = r.correlationId;
  if (r.streamId != CUPTI_SYNCHRONIZATION_INVALID_VALUE) s.stream_id = r.streamId;
  if (r.cudaEventId != CUPTI_SYNCHRONIZATION_INVALID_VALUE) s.event_id = r.cudaEventId;
  switch (r.type) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE:
      s.api = SyncApi::kEventSynchronize;
      break;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE:
      s.api = SyncApi::kStreamSynchronize;
      break;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE:
      s.api = SyncApi::kDeviceSynchronize;
      break;
    default:
      s.api = SyncApi::kUnknown;
      break;
  }
  return s;
}

bool convert_record(const CUpti_Activity& record, const TimeBase& tb, GpuEventBatch& out,
                    DemangleCache* names) {
  switch (record.kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      if (auto k = to_kernel(reinterpret_cast<const CUpti_ActivityKernel10&>(record), tb, names)) {
        out.kernels.push_back(std::move(*k));
        return true;
      }
      return false;
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      if (auto c = to_copy(reinterpret_cast<const CUpti_ActivityMemcpy6&>(record), tb)) {
        out.copies.push_back(*c);
        return true;
      }
      return false;
    case CUPTI_ACTIVITY_KIND_MEMSET:
      if (auto c = to_memset(reinterpret_cast<const CUpti_ActivityMemset4&>(record), tb)) {
        out.copies.push_back(*c);
        return true;
      }
      return false;
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
      if (auto s = to_sync(reinterpret_cast<const CUpti_ActivitySynchronization2&>(record), tb)) {
        out.syncs.push_back(*s);
        return true;
      }
      return false;
    default:
      return false;
  }
}

}  // namespace detail
}  // namespace torchpilot
