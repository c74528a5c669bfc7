// The NVLink bandwidth of a GPU (the gpu subsystem's NVML reading, for the comm subsystem's bus
// bandwidth): vendor-free, so another subsystem may include it.
#pragma once

#include <string>

namespace torchpilot::detail {

// The NVLink bandwidth of one GPU, per direction: its active links x the per-link rate of its
// generation (25 GB/s per direction for NVLink 2 to 4, i.e. Volta to Hopper; 50 for NVLink 5,
// Blackwell, compute capability 10 and up). The reference for an all-reduce's bus bandwidth
// (nccl-tests compare busbw with it). links 0: no NVLink seen (PCIe only, or NVML cannot tell).
struct NvlinkPeak {
  int links = 0;
  double bytes_per_s = 0;
};
// The peak of the CUDA device found by PCI bus id (else index), through libnvidia-ml; `error` says
// why not (no NVML, no device).
NvlinkPeak nvlink_peak_of(int cuda_index, const std::string& pci_bus_id, int compute_major,
                          std::string* error);

}  // namespace torchpilot::detail
