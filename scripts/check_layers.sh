#!/usr/bin/env bash
# The layering rules of docs/architecture.md, checked on the source tree (a CTest test, label
# unit): prints each violation and exits 1 if there is any.
#   - runtime/ and advisors/ include nothing from hooks/, LibTorch or a vendor (CUDA, CUPTI, NVML,
#     NVTX, NCCL);
#   - no header in runtime/ or advisors/ includes the trial engine;
#   - advisors/ are rules over records: no Pilot, sinks, collectors or trial engine;
#   - the repository stands on its own: it cites no file outside itself (../shared/).
set -uo pipefail
cd "${1:-$(dirname "$0")/..}"
fail=0
report() {
  echo "layering: $1"
  fail=1
}
vendor='#include *[<"](torch/|ATen/|c10/|cuda|cupti|nvml|nvtx|nccl|nvToolsExt|spdlog/.*\.h)'
while IFS= read -r hit; do
  case "$hit" in
    *spdlog*) [[ "$hit" == runtime/src/* ]] && continue ;;  # the core logs with spdlog
  esac
  report "vendor or LibTorch header in a pure layer: $hit"
done < <(grep -rnE "$vendor" runtime advisors --include='*.h' --include='*.cpp')
while IFS= read -r hit; do report "hooks/ reached from a lower layer: $hit"; done \
  < <(grep -rn '#include "torchpilot/hooks/' runtime advisors)
while IFS= read -r hit; do report "a header includes the trial engine: $hit"; done \
  < <(grep -rn 'trial_engine\.h' runtime/include advisors/include)
while IFS= read -r hit; do report "an advisor depends on the Pilot's machinery: $hit"; done \
  < <(grep -rnE '#include "torchpilot/runtime/(pilot|sink|collector|trial_engine|gpu_monitor)\.h"' advisors)
while IFS= read -r hit; do report "cites a file outside the repository: $hit"; done \
  < <(git grep -nE '(\.\./)+shared/|DESIGN\.md|GPU-NOTES' -- . ':!scripts/check_layers.sh' 2>/dev/null)
[ "$fail" -eq 0 ] && echo "layering: runtime/, advisors/ and hooks/ keep their rules"
exit "$fail"
