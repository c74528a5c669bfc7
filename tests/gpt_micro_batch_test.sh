#!/usr/bin/env bash
# The GPT example with gradient accumulation in mode autotune, on the CPU (tests/CMakeLists.txt):
#   one rank   micro-batch 2 x 4 at the start, the line that says memory figures are missing,
#              torchpilot's decision on batch.micro, the micro-batch it ends with;
#   two ranks  both take the same decision (their JSON records).
# Usage: gpt_micro_batch_test.sh GPT_TRAINER one|two
set -euo pipefail
bin=$1
# Short trial windows and a warm-up budget in steps so that the search decides within the run
# (steps of a few ms here; with two ranks the bucket size is tuned too), however loaded the machine.
export TORCHPILOT_AUTOTUNE_MIN_WINDOW_MS=50
export TORCHPILOT_AUTOTUNE_WARMUP_STEPS=90 TORCHPILOT_AUTOTUNE_WARMUP_SECONDS=0
sizes=(--device cpu --d-model 32 --layers 1 --heads 2 --seq 16 --batch 8 --micro-batch 2
       --steps 60 --epochs 2 --no-flops --mode autotune)
case $2 in
  one)
    "$bin" "${sizes[@]}" 2>&1 | tee gpt-micro.log
    grep -q 'gpt: gradient accumulation: micro-batch 2 x 4 of batch 8' gpt-micro.log
    grep -q 'micro-batch search: memory figures missing' gpt-micro.log
    grep -q 'autotune decision: \[batch.micro=' gpt-micro.log
    grep -q 'gpt: micro-batch at the end' gpt-micro.log
    ;;
  two)
    rm -f gpt-ddp-micro.jsonl.rank*
    "$bin" "${sizes[@]}" --world-size 2 --json gpt-ddp-micro.jsonl 2>&1 | tee gpt-ddp-micro.log
    ! grep -q 'a rank exited' gpt-ddp-micro.log
    chosen() { grep '"type":"tuning_decision"' "$1" | grep -o '"chosen":{[^}]*}'; }
    a=$(chosen gpt-ddp-micro.jsonl.rank0)
    b=$(chosen gpt-ddp-micro.jsonl.rank1)
    echo "rank 0 decided $a, rank 1 $b"
    [[ -n $a && $a == "$b" && $a == *batch.micro* ]]
    ;;
  *) echo "usage: $0 GPT_TRAINER one|two" >&2; exit 2 ;;
esac
