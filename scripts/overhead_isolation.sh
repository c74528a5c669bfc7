#!/usr/bin/env bash
# The always-on cost on NCCL ranks (WORLD, default 2; 1: one rank through a process group) with
# one part of torchpilot changed at a time (the overhead budget of issues 11 and 12):
# bench/collectives --suite overhead, each variant its own run of interleaved off/advise rounds.
# VARIANTS: "NAME=VAR=VALUE[,VAR=VALUE] ..." (default below); STEPS per run (default 30; PM
# sampling's duty cycle needs runs longer than its period); results to $OUT.
#   OUT=dir [WORLD=1] [STEPS=100] scripts/overhead_isolation.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/runs/gpu-out}
ROUNDS=${ROUNDS:-7}
WORLD=${WORLD:-2}
MACHINE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-')
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
variants=${VARIANTS:-"default=NONE=1 markers_off=TORCHPILOT_GPU_STEP_MARKERS=false nvtx_off=TORCHPILOT_GPU_NVTX=false nvml_off=TORCHPILOT_GPU_NVML=false pm_10ms=TORCHPILOT_GPU_PM_INTERVAL_MS=10 pm_off=TORCHPILOT_GPU_PM_SAMPLING=false"}
for v in $variants; do
  name=${v%%=*}
  assign=${v#*=}
  echo "== $(date -u +%H:%M:%S) overhead variant $name ($assign)"
  env ${assign//,/ } ./build-gpu/bench/collectives --world-size "$WORLD" --suite overhead --d-model 1024 \
    --layers 8 --heads 16 --seq 1024 --batch 16 --rounds "$ROUNDS" --steps "${STEPS:-30}" --warmup 5 \
    --machine "$MACHINE-x$WORLD" --commit "${COMMIT:-unknown}" \
    --out "$OUT/overhead-w$WORLD-$name.json" > "$OUT/overhead-w$WORLD-$name.log" 2>&1
  grep -E "advise_over_off" "$OUT/overhead-w$WORLD-$name.log" | tail -1
done
