// load_cuda_driver(): libcuda.so.1 through dlopen; probe_device().
#include "cuda_driver.h"

#include <dlfcn.h>

namespace torchpilot {
namespace detail {

namespace {

class DlopenCudaDriver final : public CudaDriverApi {
 public:
  explicit DlopenCudaDriver(void* handle) {
    resolve(handle, init_, "cuInit");
    resolve(handle, device_get_count_, "cuDeviceGetCount");
    resolve(handle, device_get_, "cuDeviceGet");
    resolve(handle, device_get_name_, "cuDeviceGetName");
    resolve(handle, device_get_attribute_, "cuDeviceGetAttribute");
    resolve(handle, device_get_pci_bus_id_, "cuDeviceGetPCIBusId");
    resolve(handle, get_error_name_, "cuGetErrorName");
    resolve(handle, get_error_string_, "cuGetErrorString");
    resolve(handle, ctx_get_current_, "cuCtxGetCurrent");
    resolve(handle, ctx_set_current_, "cuCtxSetCurrent");
    resolve(handle, ctx_get_device_, "cuCtxGetDevice");
    resolve(handle, ctx_push_current_, "cuCtxPushCurrent_v2");
    resolve(handle, ctx_pop_current_, "cuCtxPopCurrent_v2");
    resolve(handle, primary_ctx_get_state_, "cuDevicePrimaryCtxGetState");
    resolve(handle, primary_ctx_retain_, "cuDevicePrimaryCtxRetain");
    resolve(handle, primary_ctx_release_, "cuDevicePrimaryCtxRelease_v2");
    resolve(handle, stream_create_, "cuStreamCreate");
    resolve(handle, stream_destroy_, "cuStreamDestroy_v2");
    resolve(handle, event_create_, "cuEventCreate");
    // The legacy-default-stream entry point: a null stream is the legacy default stream.
    resolve(handle, event_record_, "cuEventRecord");
    resolve(handle, event_query_, "cuEventQuery");
    resolve(handle, event_elapsed_time_, "cuEventElapsedTime_v2");  // CUDA 12.8 and newer
    if (event_elapsed_time_ == nullptr) resolve(handle, event_elapsed_time_, "cuEventElapsedTime");
    resolve(handle, event_destroy_, "cuEventDestroy_v2");
  }
  // The handle is never closed (LibTorch shares the driver; closing it gains nothing).

  CUresult init(unsigned flags) override { return call(init_, flags); }
  CUresult device_get_count(int* count) override { return call(device_get_count_, count); }
  CUresult device_get(CUdevice* d, int ordinal) override { return call(device_get_, d, ordinal); }
  CUresult device_get_name(char* name, int len, CUdevice d) override {
    return call(device_get_name_, name, len, d);
  }
  CUresult device_get_attribute(int* v, CUdevice_attribute a, CUdevice d) override {
    return call(device_get_attribute_, v, a, d);
  }
  CUresult device_get_pci_bus_id(char* id, int len, CUdevice d) override {
    return call(device_get_pci_bus_id_, id, len, d);
  }
  CUresult get_error_name(CUresult e, const char** s) override {
    return call(get_error_name_, e, s);
  }
  CUresult get_error_string(CUresult e, const char** s) override {
    return call(get_error_string_, e, s);
  }
  CUresult ctx_get_current(CUcontext* c) override { return call(ctx_get_current_, c); }
  CUresult ctx_set_current(CUcontext c) override { return call(ctx_set_current_, c); }
  CUresult ctx_get_device(CUdevice* d) override { return call(ctx_get_device_, d); }
  CUresult ctx_push_current(CUcontext c) override { return call(ctx_push_current_, c); }
  CUresult ctx_pop_current(CUcontext* c) override { return call(ctx_pop_current_, c); }
  CUresult primary_ctx_get_state(CUdevice d, unsigned* flags, int* active) override {
    return call(primary_ctx_get_state_, d, flags, active);
  }
  CUresult primary_ctx_retain(CUcontext* c, CUdevice d) override {
    return call(primary_ctx_retain_, c, d);
  }
  CUresult primary_ctx_release(CUdevice d) override { return call(primary_ctx_release_, d); }
  CUresult stream_create(CUstream* s, unsigned flags) override {
    return call(stream_create_, s, flags);
  }
  CUresult stream_destroy(CUstream s) override { return call(stream_destroy_, s); }
  CUresult event_create(CUevent* e, unsigned flags) override {
    return call(event_create_, e, flags);
  }
  CUresult event_record(CUevent e, CUstream s) override { return call(event_record_, e, s); }
  CUresult event_query(CUevent e) override { return call(event_query_, e); }
  CUresult event_elapsed_time(float* ms, CUevent a, CUevent b) override {
    return call(event_elapsed_time_, ms, a, b);
  }
  CUresult event_destroy(CUevent e) override { return call(event_destroy_, e); }

 private:
  template <class F>
  static void resolve(void* handle, F& fn, const char* name) {
    fn = reinterpret_cast<F>(dlsym(handle, name));
  }
  template <class F, class... Args>
  static CUresult call(F fn, Args... args) {
    if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
    return fn(args...);
  }

  decltype(&::cuInit) init_ = nullptr;
  decltype(&::cuDeviceGetCount) device_get_count_ = nullptr;
  decltype(&::cuDeviceGet) device_get_ = nullptr;
  decltype(&::cuDeviceGetName) device_get_name_ = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute_ = nullptr;
  decltype(&::cuDeviceGetPCIBusId) device_get_pci_bus_id_ = nullptr;
  decltype(&::cuGetErrorName) get_error_name_ = nullptr;
  decltype(&::cuGetErrorString) get_error_string_ = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get_current_ = nullptr;
  decltype(&::cuCtxSetCurrent) ctx_set_current_ = nullptr;
  decltype(&::cuCtxGetDevice) ctx_get_device_ = nullptr;
  decltype(&::cuCtxPushCurrent) ctx_push_current_ = nullptr;  // cuCtxPushCurrent_v2
  decltype(&::cuCtxPopCurrent) ctx_pop_current_ = nullptr;    // cuCtxPopCurrent_v2
  decltype(&::cuDevicePrimaryCtxGetState) primary_ctx_get_state_ = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain_ = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) primary_ctx_release_ = nullptr;  // ..._v2
  decltype(&::cuStreamCreate) stream_create_ = nullptr;
  decltype(&::cuStreamDestroy) stream_destroy_ = nullptr;  // cuStreamDestroy_v2
  decltype(&::cuEventCreate) event_create_ = nullptr;
  decltype(&::cuEventRecord) event_record_ = nullptr;
  decltype(&::cuEventQuery) event_query_ = nullptr;
  decltype(&::cuEventElapsedTime) event_elapsed_time_ = nullptr;  // same signature in both
  decltype(&::cuEventDestroy) event_destroy_ = nullptr;           // cuEventDestroy_v2
};

}  // namespace

std::unique_ptr<CudaDriverApi> load_cuda_driver(std::string* error) {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) handle = dlopen("libcuda.so.1", RTLD_NOW);
  if (handle == nullptr) {
    if (error != nullptr) *error = "no GPU driver (libcuda.so.1 not found)";
    return nullptr;
  }
  return std::make_unique<DlopenCudaDriver>(handle);
}

std::string cuda_error_text(CudaDriverApi& api, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  std::string s;
  if (api.get_error_name(result, &name) == CUDA_SUCCESS && name != nullptr) {
    s = name;
  } else {
    s = "CUDA error";
  }
  s += " (" + std::to_string(static_cast<int>(result)) + ")";
  if (api.get_error_string(result, &text) == CUDA_SUCCESS && text != nullptr) {
    s += ": " + std::string(text);
  }
  return s;
}

void probe_visible_and_current(CudaDriverApi& api, int* visible, int* current) {
  int count = 0;
  if (api.init(0) != CUDA_SUCCESS || api.device_get_count(&count) != CUDA_SUCCESS) return;
  *visible = count;
  CUcontext ctx = nullptr;
  CUdevice have = 0;
  if (api.ctx_get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr ||
      api.ctx_get_device(&have) != CUDA_SUCCESS) {
    return;
  }
  for (int i = 0; i < count; ++i) {
    CUdevice d = 0;
    if (api.device_get(&d, i) == CUDA_SUCCESS && d == have) {
      *current = i;
      return;
    }
  }
}

ProbedDevice probe_device(CudaDriverApi& api, int index) {
  ProbedDevice p;
  p.info.index = index;
  CUresult r = api.init(0);
  if (r != CUDA_SUCCESS) {
    p.error = "cuInit failed: " + cuda_error_text(api, r);
    return p;
  }
  int count = 0;
  r = api.device_get_count(&count);
  if (r != CUDA_SUCCESS) {
    p.error = "cuDeviceGetCount failed: " + cuda_error_text(api, r);
    return p;
  }
  if (index < 0 || index >= count) {
    p.error = "no CUDA device " + std::to_string(index) + " (this process sees " +
              std::to_string(count) + (count == 1 ? " device" : " devices") +
              "; gpu.device and CUDA_VISIBLE_DEVICES choose it)";
    return p;
  }
  CUdevice dev = 0;
  r = api.device_get(&dev, index);
  if (r != CUDA_SUCCESS) {
    p.error = "cuDeviceGet(" + std::to_string(index) + ") failed: " + cuda_error_text(api, r);
    return p;
  }
  char name[256] = {0};
  if (api.device_get_name(name, sizeof name - 1, dev) == CUDA_SUCCESS) p.info.name = name;
  int sms = 0;
  r = api.device_get_attribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  if (r != CUDA_SUCCESS) {
    p.error = "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT) failed: " + cuda_error_text(api, r);
    return p;
  }
  if (sms <= 0) {
    p.error = "CUDA device " + std::to_string(index) + " reports no SMs";
    return p;
  }
  p.info.sm_count = sms;
  api.device_get_attribute(&p.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  api.device_get_attribute(&p.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  char bus[64] = {0};
  if (api.device_get_pci_bus_id(bus, sizeof bus - 1, dev) == CUDA_SUCCESS) p.pci_bus_id = bus;
  return p;
}

}  // namespace detail
}  // namespace torchpilot
