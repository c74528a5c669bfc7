// How many loader workers keep a step fed: one model shared by the data_starvation advice
// (advisors/loader) and the loader's tuning policy (loader_policy.cpp), so the advice names the
// count the search tries first and the two never size workers differently.
// Pure functions; nothing here throws.
#pragma once

namespace torchpilot {

// Production that spends at least this share of its wall time on the CPU counts as CPU-bound:
// more workers than CPUs cannot make it faster. Below it the workers mostly wait (disk, network)
// and more workers than CPUs help.
constexpr double kLoaderCpuBoundShare = 0.5;
// The largest count the model names (a ratio from a step that computes nearly nothing).
constexpr int kLoaderMaxWorkersEstimate = 1000000;

struct WorkerEstimate {
  int needed = 1;          // workers that produce a batch as fast as the step consumes one
  int useful = 1;          // what to use: `needed`, at most the CPUs when CPU-bound
  bool cpu_bound = false;  // cpu_share >= kLoaderCpuBoundShare
};

// `ratio`: the time one worker takes to produce a batch over the time the step takes to consume
// one (batch production time / compute time per step; equally, the consumer's rate over one
// worker's capacity). `cpu_share`: the producing threads' CPU time over their wall time (negative
// or NaN: unknown, taken as not CPU-bound). `cpus`: the CPUs the process may use (at least 1 is
// assumed). needed = ceil(ratio), at least 1, at most kLoaderMaxWorkersEstimate.
WorkerEstimate estimate_workers(double ratio, double cpu_share, int cpus);

}  // namespace torchpilot
