// CUPTI activity records as CUPTI hands them over: zeroed, but for the fields a test gives.
#pragma once

#include <cupti_activity.h>

#include <cstdint>
#include <cstring>

namespace torchpilot {
namespace test {

// A record of kind `kind` over [start, end] (CUPTI's clock), every other field zero.
template <class R>
R timed_record(CUpti_ActivityKind kind, uint64_t start, uint64_t end) {
  R r;
  std::memset(&r, 0, sizeof r);
  r.kind = kind;
  r.start = start;
  r.end = end;
  return r;
}

// A kernel of `blocks` x 1 x 1 blocks of `threads` x 1 x 1 threads.
inline CUpti_ActivityKernel10 cupti_kernel(uint64_t start, uint64_t end, const char* name,
                                           int32_t blocks, int32_t threads) {
  auto k = timed_record<CUpti_ActivityKernel10>(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, start, end);
  k.gridX = blocks;
  k.gridY = k.gridZ = 1;
  k.blockX = threads;
  k.blockY = k.blockZ = 1;
  k.name = name;
  return k;
}

// A copy of `bytes` from memory of kind `src` to `dst`.
inline CUpti_ActivityMemcpy6 cupti_memcpy(uint8_t copy_kind, uint8_t src, uint8_t dst,
                                          uint64_t bytes, uint64_t start, uint64_t end) {
  auto m = timed_record<CUpti_ActivityMemcpy6>(CUPTI_ACTIVITY_KIND_MEMCPY, start, end);
  m.copyKind = copy_kind;
  m.srcKind = src;
  m.dstKind = dst;
  m.bytes = bytes;
  return m;
}

}  // namespace test
}  // namespace torchpilot
