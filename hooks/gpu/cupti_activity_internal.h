// The process-wide routing of CUPTI's buffer and API callbacks to the activity collector, shared
// by cupti_activity_routing.cpp (the callbacks) and cupti_activity_trace.cpp (the collector).
#pragma once

#include <cupti.h>
#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>

#include <cstddef>
#include <cstdint>
#include <shared_mutex>

#include "cupti_activity_trace.h"

namespace torchpilot::detail::activity_internal {

// The collector CUPTI's callbacks reach (nullptr: none), under its mutex.
std::shared_mutex& route_mutex();
ActivityCollector*& route();

// A zeroed buffer registered to collector `owner`; nullptr when out of memory.
uint8_t* allocate_buffer(size_t bytes, uint64_t owner);
// 0 when the buffer is not one of ours.
uint64_t owner_of(uint8_t* buffer);
// Frees a buffer of ours; one that is not ours is left alone.
void free_buffer(uint8_t* buffer);

// CUPTI's buffer callbacks (cuptiActivityRegisterCallbacks).
void CUPTIAPI on_buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records);
void CUPTIAPI on_buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t size,
                                  size_t valid_size);

// The synchronizing API calls whose thread the collector notes (enable() turns them on).
struct SyncCallbackId {
  CUpti_CallbackDomain domain;
  CUpti_CallbackId cbid;
};
inline constexpr SyncCallbackId kSyncCallbacks[] = {
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_ptsz_v7000},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaThreadSynchronize_v3020},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize_v2},
};

// Copies the host may wait in (to or from pageable memory, the host waits inside the call): their
// op is named like a synchronize's (copy_gets_op_scope). The runtime's copies only: LibTorch
// copies through it.
inline constexpr SyncCallbackId kCopyCallbacks[] = {
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_ptds_v7000},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000},
};

// Whether a copy call of `kind` (cudaMemcpyKind) gets an op scope: one the host may wait in. To
// the host (into pageable memory the call returns once the data is there); from the host (from
// pageable memory the call stages the data, and a copy_'s synchronize follows: with the copy's
// scope the two are one op call, whose wait is the pageable copy's, not a host sync, also when
// the GPU ran the copy before the synchronize began); or of a kind the runtime infers.
inline bool copy_gets_op_scope(int kind) {
  return kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyHostToHost;
}

// On the calling thread, inside the call: which thread made it, by its correlation id (a runtime
// call and the driver call inside it each have one; the sync record carries one of them); and the
// op it was made from.
void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                          const void* data);

}  // namespace torchpilot::detail::activity_internal
