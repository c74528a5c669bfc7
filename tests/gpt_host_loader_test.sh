#!/usr/bin/env bash
# The GPT example with its host data loader (--host-loader), on the CPU (tests/CMakeLists.txt):
#   advise     one process at 0 workers: the epoch line reports data wait, the loader's line names
#              the loader "gpt" at 0 workers, and the JSON epoch record carries a positive wait;
#   autotune2  two ranks (Gloo) in mode autotune starting at 0 workers: both ranks' JSON records
#              hold a tuning decision, the same setting at the same step, with loader.workers > 0.
# The per-sample cost is mostly --loader-io-us (a sleep standing for storage latency): this machine
# may have as few cores as there are ranks, and only waiting, not CPU work, is hidden by workers
# there. The small --loader-sample-us keeps the CPU path (thread CPU time hashing) exercised.
# The wait (20 ms a batch) is well above what CPU contention costs a worker on two loaded cores:
# at 8 ms a batch a loaded CI machine once measured 0 workers faster (3,612 against 2,821 samples/s).
# Usage: gpt_host_loader_test.sh GPT_TRAINER advise|autotune2
set -euo pipefail
bin=$1
sizes=(--device cpu --d-model 32 --layers 1 --heads 2 --seq 16 --batch 8 --no-flops
       --host-loader --loader-sample-us 50 --loader-io-us 2500)
case $2 in
  advise)
    rm -f gpt-loader.jsonl
    "$bin" "${sizes[@]}" --steps 20 --epochs 2 --mode advise --json gpt-loader.jsonl 2>&1 \
      | tee gpt-loader.log
    grep -q 'gpt: host loader: 8 windows of T+1 tokens a batch' gpt-loader.log
    grep -q 'epoch 1: 20 steps in .* data wait [0-9.]*% of step time' gpt-loader.log
    grep -q 'loader (gpt): workers 0' gpt-loader.log
    grep -q 'gpt: epoch 1: 20 steps, loss' gpt-loader.log
    # Every sample sleeps on the training thread at 0 workers: the wait cannot be zero.
    # grep -m1, not `| head -1`: under pipefail a grep cut off by head's exit fails the script.
    wait_s=$(grep -m1 '"type":"epoch"' gpt-loader.jsonl | grep -o '"data_wait_s":[0-9.e+-]*' \
      | cut -d: -f2)
    echo "epoch 0 data wait: ${wait_s:-none} s"
    awk -v w="${wait_s:-0}" 'BEGIN { exit !(w > 0) }'
    ;;
  autotune2)
    # Short trial windows and a warm-up budget in steps, so that the search decides within the
    # run however loaded the machine (as collectives_test's "tune" scenario).
    export TORCHPILOT_AUTOTUNE_WARMUP_STEPS=60 TORCHPILOT_AUTOTUNE_WARMUP_SECONDS=0
    export TORCHPILOT_AUTOTUNE_SETTLE_STEPS=1 TORCHPILOT_AUTOTUNE_MEASURE_STEPS=4
    export TORCHPILOT_AUTOTUNE_MIN_WINDOW_MS=0 TORCHPILOT_AUTOTUNE_MAX_WORKERS=4
    rm -f gpt-loader2.jsonl.rank*
    "$bin" "${sizes[@]}" --steps 40 --epochs 3 --mode autotune --world-size 2 \
      --json gpt-loader2.jsonl 2>&1 | tee gpt-loader2.log
    ! grep -q 'a rank exited' gpt-loader2.log
    grep -q 'autotune decision: \[.*loader.workers=' gpt-loader2.log
    decision() { grep '"type":"tuning_decision"' "$1"; }
    chosen() { decision "$1" | grep -o '"chosen":{[^}]*}'; }
    at() { decision "$1" | grep -o '"decided_at_step":[0-9]*'; }
    a=$(chosen gpt-loader2.jsonl.rank0); b=$(chosen gpt-loader2.jsonl.rank1)
    sa=$(at gpt-loader2.jsonl.rank0); sb=$(at gpt-loader2.jsonl.rank1)
    echo "rank 0 decided $a ($sa), rank 1 $b ($sb)"
    [[ -n $a && $a == "$b" && -n $sa && $sa == "$sb" ]]
    # The start was 0 workers; the decision loads in workers.
    decision gpt-loader2.jsonl.rank0 | grep -q '"baseline":{[^}]*"loader.workers":0'
    [[ $a == *'"loader.workers":'* && $a != *'"loader.workers":0'* ]]
    ;;
  *) echo "usage: $0 GPT_TRAINER advise|autotune2" >&2; exit 2 ;;
esac
