// What a data loader shows the rest of torchpilot: its knob values and cumulative counters. An
// epoch's difference of two snapshots is the epoch summary's "loader" section. Plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/records.h"

namespace torchpilot {

// Knob values of a data loader at one moment.
struct LoaderSettings {
  int workers = 0;               // worker threads; 0 = the training thread loads
  int prefetch = 2;              // batches in flight per worker (at least 1 when workers = 0)
  bool pin_memory = false;       // batches copied to page-locked memory by the workers
  bool device_prefetch = false;  // batches copied to the GPU on a side stream ahead of use
};

// Cumulative counters of a data loader; epoch figures are differences of two snapshots.
struct LoaderStats {
  static constexpr const char* kSectionName = "loader";
  std::string name;  // "tunable" or "watched"
  bool tunable = false;
  LoaderSettings settings;
  int max_workers = 0;  // CPUs this process may use
  bool pin_memory_available = false;
  bool device_prefetch_available = false;
  int64_t batches = 0;        // batches handed to the training loop
  int64_t produce_count = 0;  // batches produced (by workers or inline)
  Nanos produce_ns = 0;       // wall time spent producing them, summed over threads
  Nanos produce_cpu_ns = 0;   // CPU time of the producing threads meanwhile (I/O waits not)
  // produce_ns is the workers' elapsed time, not measured per batch (a watched stock loader with
  // workers: runtime/loader/stock_loader_meter.h), and produce_cpu_ns an upper bound.
  bool production_estimated = false;
  int64_t blocked_count = 0;  // next() calls that had to wait
  Nanos wait_ns = 0;          // total time next() blocked
  // A watched stock loader's options (DataLoaderOptions), as read from it; -1: not known. When
  // settings_known is false the loader's options could not be read: `settings` are not its own.
  bool settings_known = true;
  int64_t batch_size = -1;
  int64_t max_jobs = -1;    // jobs queued ahead for the workers (LibTorch: 2 x workers)
  int64_t timeout_ms = -1;  // the wait limit for a batch; 0: none
  // LibTorch's intra-op threads (at::get_num_threads() on the training thread when the loader
  // was watched); 0: not known. Each stock worker's tensor ops run on a team of this many.
  int intra_op_threads = 0;
};

std::string section_json(const LoaderStats& loader);
void section_text(const LoaderStats& loader, const EpochSummary& epoch,
                  std::vector<std::string>& lines);

// Difference of two cumulative loader snapshots (later - earlier), settings taken from `later`.
LoaderStats loader_delta(const LoaderStats& later, const LoaderStats& earlier);

}  // namespace torchpilot
