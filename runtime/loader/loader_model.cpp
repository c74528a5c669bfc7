#include "torchpilot/runtime/loader/loader_model.h"

#include <algorithm>
#include <cmath>

namespace torchpilot {

WorkerEstimate estimate_workers(double ratio, double cpu_share, int cpus) {
  WorkerEstimate e;
  const double bounded =
      std::isfinite(ratio) ? std::clamp(ratio, 1.0, double{kLoaderMaxWorkersEstimate}) : 1.0;
  e.needed = static_cast<int>(std::ceil(bounded));
  e.cpu_bound = std::isfinite(cpu_share) && cpu_share >= kLoaderCpuBoundShare;
  e.useful = e.cpu_bound ? std::min(e.needed, std::max(1, cpus)) : e.needed;
  return e;
}

}  // namespace torchpilot
