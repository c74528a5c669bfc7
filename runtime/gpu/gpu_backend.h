// The GPU backend: the one interface between the vendor-free runtime and the GPU collectors in
// hooks/ (CUPTI PM sampling and activity, NVML, NVTX). The runtime's GpuMonitor drives it; tests
// drive the monitor with a fake backend (tests/unit/gpu_monitor_test.cpp).
//
// Events are vendor-neutral and carry times on the steady clock (the Pilot's default clock), in ns.
// Failure behaviour: nothing here throws. A collector that cannot run reports why in status() and
// the rest keep working. Thread-safety: the monitor calls every method from the training thread;
// backends collect on their own threads and hand events over in drain().
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/gpu/gpu_records.h"

namespace spdlog {
class logger;
}

namespace torchpilot {

struct GpuDeviceInfo {
  int index = 0;
  std::string name;  // e.g. "NVIDIA H200"
  std::string chip;  // e.g. "GH100" (CUPTI's chip name)
  int sm_count = 0;
};

// Which GPU a process observes (gpu.device; docs/configuration.md). Set: that one. Auto (-1):
// LOCAL_RANK when it names a visible device (torchrun's one GPU per local rank; other launchers'
// variables are not read), else the device of the CUDA context current on the thread that makes
// the Pilot, else 0. Pure: `local_rank` is
// the variable's text (null: unset), `visible` the devices this process sees (-1: unknown, no
// driver), `current` the current context's device (-1: none).
struct GpuDeviceChoice {
  int index = 0;
  std::string source;  // "gpu.device", "LOCAL_RANK", "current device", "default"
};
GpuDeviceChoice choose_gpu_device(int configured, const char* local_rank, int visible, int current);
// hooks/ registers how to ask the driver (visible devices, the current context's device); without
// one (no GPU collectors in this build) both are unknown.
using GpuDeviceProbe = void (*)(int* visible, int* current);
void register_gpu_device_probe(GpuDeviceProbe probe);
GpuDeviceProbe gpu_device_probe();

// A kernel execution (activity trace).
struct KernelRecord {
  Nanos begin = 0, end = 0;
  int64_t blocks = 0;  // grid size in blocks
  int32_t block_threads = 0;
  uint32_t stream = 0;
  bool communication = false;  // an NCCL kernel
  std::string name;
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kOther };

// A memcpy or memset (activity trace).
struct CopyRecord {
  Nanos begin = 0, end = 0;
  int64_t bytes = 0;
  CopyKind kind = CopyKind::kOther;
  bool pageable = false;  // the host side is pageable memory (staged by the driver, blocking)
  bool memset = false;
};

// The call a host sync blocked in.
enum class SyncApi {
  kUnknown,            // an op scope known to synchronize, outside a trace window
  kStreamSynchronize,  // cudaStreamSynchronize (also inside .item(), blocking copies)
  kEventSynchronize,   // cudaEventSynchronize
  kDeviceSynchronize,  // cudaDeviceSynchronize (CUPTI: context synchronize)
  kBlockingCopy,       // a device-to-host copy into pageable memory (the host waits for it)
};
const char* to_string(SyncApi api);

// The thread a synchronizing call was made on (CUPTI's callback on the call, matched to the
// activity record by correlation id; CUPTI's records carry no thread).
enum class SyncThread {
  kUnknown,  // no callback seen for it (callbacks unavailable, or a call CUPTI made itself)
  kTrainer,  // the thread that runs the steps (the one that started the trace window)
  kOther,    // another thread of the program (autograd's device threads, a loader's)
  kOwn,      // a thread of torchpilot's (never a host sync of the training loop)
  // No program call made it: the callbacks saw every synchronizing call of the window and none
  // had its correlation id (CUPTI's or the driver's own; seen on the H100 once per traced step,
  // an event synchronize of ~0.7 ms with no API call on any thread). Never a host sync.
  kInternal,
};
const char* to_string(SyncThread thread);

// The host blocked in a synchronizing call (activity trace), or, resolved per step
// (gpu_step_stats), in an op that synchronizes. A stream waiting for an event
// (cudaStreamWaitEvent) makes the GPU wait, not the host: never a SyncRecord.
struct SyncRecord {
  Nanos begin = 0, end = 0;  // the host's wait, steady clock
  SyncApi api = SyncApi::kUnknown;
  std::string cause;  // the op that synchronized (e.g. "aten::item"), else the API's name
  std::string phase;  // the Pilot's phase it began in; empty outside phases
  SyncThread thread = SyncThread::kUnknown;
  // CUPTI's ids, for diagnosis (-1: not applicable or unknown): the stream synchronized (stream
  // syncs), the CUDA event waited for (event syncs), the API call's correlation id.
  int64_t stream_id = -1, event_id = -1, correlation_id = -1;
};

// The host-side extent of an op that may synchronize (RecordFunction hook, hooks/; drained from
// HostOpScopes by the monitor). A CUPTI sync record inside it takes the op as its cause.
struct HostOpScope {
  Nanos begin = 0, end = 0;
  std::string op;      // e.g. "aten::item", "aten::to"
  bool always = true;  // synchronizes whenever its tensor is on the GPU (item, nonzero); false:
                       // only sometimes (copies: when CUPTI shows it blocked)
  std::string phase;   // set by the monitor
  uint64_t call = 0;   // nonzero: scopes with the same value are one op call (an item()'s copy
                       // and its synchronize), merged into one scope
};

// One PM-sampling interval (always on). Fractions in [0, 1]; NaN where the counter is missing.
// Each field has the name of the GpuStats figure it becomes (one name per quantity, from the
// counter to the log: docs/metrics.md has the table).
struct PmSample {
  Nanos begin = 0, end = 0;
  double counter_utilization = kNotMeasured;  // gr__cycles_active.avg.pct_of_peak_sustained_elapsed
  double sm_efficiency = kNotMeasured;        // sm__cycles_active.avg.pct_of_peak_sustained_elapsed
  double tensor_activity = kNotMeasured;      // sm__pipe_tensor_cycles_active.avg.pct_of_peak...
  double dram_throughput = kNotMeasured;      // dram__throughput.avg.pct_of_peak_sustained_elapsed
  double achieved_occupancy = kNotMeasured;   // sm__warps_active.avg.pct_of_peak_sustained_elapsed
  double pcie_read_bytes = kNotMeasured;      // pcie__read_bytes.sum in the interval
  double pcie_write_bytes = kNotMeasured;     // pcie__write_bytes.sum
};

// One NVML utilization.gpu reading (always on).
struct UtilSample {
  Nanos time = 0;
  double utilization = 0;  // fraction
  // NVML's SM clock at the reading (MHz; NaN: not read) and whether a limit held it down then
  // (power cap, thermal or hardware slowdown, power brake; -1: not read).
  double sm_clock_mhz = std::numeric_limits<double>::quiet_NaN();
  int clock_limited = -1;
};

// A step-boundary marker the GPU reached (GpuBackend::record_marker): `time` is when the GPU
// executed it, on the steady clock.
struct MarkerRecord {
  uint64_t id = 0;
  Nanos time = 0;
};

struct GpuEventBatch {
  std::vector<KernelRecord> kernels;
  std::vector<CopyRecord> copies;
  std::vector<SyncRecord> syncs;
  std::vector<HostOpScope> scopes;  // from HostOpScopes, not from the backend
  std::vector<PmSample> pm;
  std::vector<UtilSample> nvml;
  std::vector<MarkerRecord> markers;  // in the order they were resolved
  int64_t dropped = 0;                // records lost to full buffers since the last drain
  // PM samples ending before this steady time have all been delivered (0: unknown): set while PM
  // sampling pauses between bursts (gpu.pm_duty), when no sample is coming for a while.
  Nanos pm_final_until = 0;
  // `pm` is in order of begin and of end (the monitor keeps its batch so, and says whether the
  // ends are): a step's samples are found by binary search instead of a pass over all held.
  bool pm_by_begin = false;
  void clear() {
    markers.clear();
    kernels.clear();
    copies.clear();
    syncs.clear();
    scopes.clear();
    pm.clear();
    nvml.clear();
    dropped = 0;
    pm_final_until = 0;
    pm_by_begin = false;
  }
};

class GpuBackend {
 public:
  virtual ~GpuBackend() = default;
  // Device found; sm_count == 0 when there is none (then nothing else does anything).
  virtual GpuDeviceInfo device() const = 0;
  // One entry per collector (pm_sampling, activity, nvml, nvtx): active or the reason it is off.
  virtual std::vector<CollectorStatus> status() const = 0;
  // Starts the always-on collectors (PM sampling, NVML).
  virtual void start() = 0;
  // Detailed window: starts/stops the activity trace. start_trace() returns false when tracing
  // is unavailable.
  virtual bool start_trace() = 0;
  // After start_trace() returned false, or at start-up with the activity collector off: another
  // client (PyTorch's profiler, Nsight Systems) holds the trace for now, and a later start may
  // succeed once it lets go.
  virtual bool trace_busy() const { return false; }
  virtual void stop_trace() = 0;
  // After a window's last records were flushed: detaches the trace from the process entirely.
  // CUPTI keeps slowing kernel launches while attached, even with every activity kind disabled
  // (measured on the H200: a GPT step 34 -> 46 ms after one window), and while we hold its
  // subscription PyTorch's profiler cannot get one. Always-on collectors resume after it.
  // May return before the release is done (its final flush and the always-on collectors' restart
  // run off the training thread); trace_releasing() is true until then, and the window's last
  // records reach drain() by the time it turns false. finish_release() waits for it.
  virtual void release_trace() = 0;
  virtual bool trace_releasing() const { return false; }
  virtual void finish_release() {}
  // Makes what has completed so far available to drain(): flushes CUPTI's activity buffers and
  // decodes pending PM samples. May take a few milliseconds; called at window and epoch ends.
  virtual void flush() = 0;
  // Asks the collectors' own threads to make what has completed available soon (PM samples
  // decoded now rather than at the next period); returns at once. Short epochs' ends.
  virtual void request_flush() {}
  // Moves the events that arrived since the last call into `out` (appends).
  virtual void drain(GpuEventBatch& out) = 0;
  // Step-boundary markers (docs/metrics.md, "GPU time of a step"): records marker `id` on the
  // stream the trainer launches on, without synchronizing; once the GPU has executed everything
  // queued before it, drain() returns it as a MarkerRecord. Returns false when it was not recorded
  // (no CUDA context current on the calling thread yet, none left in flight, not supported). Ids
  // increase. Cheap: called at every step boundary on the training thread.
  virtual bool record_marker(uint64_t id) { return false; }
  // The same for a marker that may be left out (a phase boundary's, docs/metrics.md "GPU time of
  // a phase"): never takes the last events that step markers need.
  virtual bool record_optional_marker(uint64_t id) { return record_marker(id); }
  // Blocks until marker `id` has been resolved (drain() returns it) or `timeout_ns` passed.
  // Epoch ends only, so that a closing window or epoch keeps its last steps' GPU work.
  virtual void await_marker(uint64_t id, Nanos timeout_ns) {}
  // Stops everything; drain() still returns what was collected.
  virtual void stop() = 0;
  // NVTX ranges in the "torchpilot" domain (no-ops without a tool such as Nsight Systems).
  virtual void range_push(const char* name) = 0;
  virtual void range_pop() = 0;
};

struct GpuConfig;

// A backend with no device whose status() gives `reason` for every collector.
std::unique_ptr<GpuBackend> make_unavailable_gpu_backend(std::string reason);

}  // namespace torchpilot
