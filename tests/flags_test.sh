#!/usr/bin/env bash
# Bad command-line flags of the examples and the benchmarks (CLI11, examples/common/cli_flags.h):
# each row runs one program with one bad flag and expects, within a few seconds, exit status 2,
# nothing on stdout (so nothing started: no data preparation, no model, no training) and the
# flag's name in the message on stderr. Then --help exits 0 and lists the flags. Rows that expect
# "accepted" run a one-step training with a value at the edge of a flag's range (0 where 0 means
# none, as its help and the README say) and expect exit status 0.
#   flags_test.sh JPEG_CLASSIFIER GPT_TRAINER [GPT_OVERHEAD] [AUTOTUNE_GRID] [PLANTED_PAIRS]
#   (empty: skipped)
set -uo pipefail

declare -A bin=([jpeg_classifier]="${1:-}" [gpt_trainer]="${2:-}" [gpt_overhead]="${3:-}"
                [autotune_grid]="${4:-}" [planted_pairs]="${5:-}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
a_file="$work/a-file"
echo "not a directory" >"$a_file"
# Small sizes: were a bad flag ever to get through, the run would be short.
data="--data $work/data"
gpt="--device cpu --d-model 16 --layers 1 --heads 2 --seq 8 --batch 2"

# program | arguments (word-split) | text the message must contain (the flag)
rows=(
  "jpeg_classifier|$data --batch 4294967297|--batch"
  "jpeg_classifier|$data --batch 1e23|--batch"
  "jpeg_classifier|$data --batch -1|--batch"
  "jpeg_classifier|$data --batch 0|--batch"
  "jpeg_classifier|$data --steps 1e23|--steps"
  "jpeg_classifier|$data --steps 99999999999999999999|--steps"
  "jpeg_classifier|$data --steps -5|--steps"
  "jpeg_classifier|$data --steps 0x10|--steps"
  "jpeg_classifier|$data --workers 4294967296|--workers"
  "jpeg_classifier|$data --workers -1|--workers"
  "jpeg_classifier|$data --workers 257|--workers"
  "jpeg_classifier|$data --prefetch 0|--prefetch"
  "jpeg_classifier|$data --classes 1|--classes"
  "jpeg_classifier|$data --images-per-class 0|--images-per-class"
  "jpeg_classifier|$data --mode bogus|--mode"
  "jpeg_classifier|$data --config $work/missing.yaml|--config"
  "jpeg_classifier|--data $a_file|--data"
  "jpeg_classifier|$data --frobnicate 1|--frobnicate"
  "jpeg_classifier|$data --steps|--steps"
  "jpeg_classifier|$data --json|--json"
  "jpeg_classifier|$data --json --steps 5|--json"

  "gpt_trainer|$gpt --batch 4294967297|--batch"
  "gpt_trainer|$gpt --steps 1e23|--steps"
  "gpt_trainer|$gpt --steps 99999999999999999999|--steps"
  "gpt_trainer|$gpt --epochs -1|--epochs"
  "gpt_trainer|$gpt --epochs 0|--epochs"
  "gpt_trainer|$gpt --heads 0|--heads"
  "gpt_trainer|$gpt --d-model 4294967312|--d-model"
  "gpt_trainer|$gpt --layers 1.5|--layers"
  "gpt_trainer|$gpt --seq -3|--seq"
  "gpt_trainer|$gpt --micro-batch -1|--micro-batch"
  "gpt_trainer|$gpt --micro-batch 3|--micro-batch"
  "gpt_trainer|$gpt --loader-workers 2|--loader-workers"
  "gpt_trainer|$gpt --host-loader --loader-sample-us -5|--loader-sample-us"
  "gpt_trainer|$gpt --host-loader --loader-workers 257|--loader-workers"
  "gpt_trainer|$gpt --lr inf|--lr"
  "gpt_trainer|$gpt --lr nan|--lr"
  "gpt_trainer|$gpt --lr -1|--lr"
  "gpt_trainer|$gpt --lr 0|--lr"
  "gpt_trainer|$gpt --lr 1e400|--lr"
  "gpt_trainer|$gpt --lr abc|--lr"
  "gpt_trainer|$gpt --corpus-mb 1e30|--corpus-mb"
  "gpt_trainer|$gpt --corpus-mb inf|--corpus-mb"
  "gpt_trainer|$gpt --corpus-mb -2|--corpus-mb"
  "gpt_trainer|$gpt --seed -1|--seed"
  "gpt_trainer|$gpt --seed 18446744073709551616|--seed"
  "gpt_trainer|$gpt --attention bogus|--attention"
  "gpt_trainer|$gpt --precision fp16|--precision"
  "gpt_trainer|$gpt --optimizer sgd|--optimizer"
  "gpt_trainer|$gpt --linear fused|--linear"
  "gpt_trainer|$gpt --device tpu|--device"
  "gpt_trainer|$gpt --device cudaX|--device"
  "gpt_trainer|$gpt --mode bogus|--mode"
  "gpt_trainer|$gpt --text $work/missing.txt|--text"
  "gpt_trainer|$gpt --config $work/missing.yaml|--config"
  "gpt_trainer|$gpt --frobnicate 1|--frobnicate"
  "gpt_trainer|$gpt --no-flops 1|not expected: 1"
  "gpt_trainer|$gpt --steps|--steps"
  "gpt_trainer|$gpt --d-model 100 --heads 3|--heads"
  "gpt_trainer|$gpt --bucket-mb -1|--bucket-mb"
  "gpt_trainer|$gpt --straggler-ms -1|--straggler-ms"
  "gpt_trainer|$gpt --host-loader --loader-io-us -1|--loader-io-us"
  "gpt_trainer|$gpt --steps 1 --epochs 1 --mode off --no-flops --bucket-mb 0 --straggler-ms 0|accepted"
  "gpt_trainer|$gpt --steps 1 --epochs 1 --mode off --no-flops --host-loader --loader-sample-us 0 --loader-io-us 0|accepted"

  "gpt_overhead|$gpt --batch 4294967297|--batch"
  "gpt_overhead|$gpt --rounds 4294967297|--rounds"
  "gpt_overhead|$gpt --rounds 99999999999|--rounds"
  "gpt_overhead|$gpt --rounds abc|--rounds"
  "gpt_overhead|$gpt --steps-per-round 1e23|--steps-per-round"
  "gpt_overhead|$gpt --steps-per-round 0|--steps-per-round"
  "gpt_overhead|$gpt --warmup 2|--warmup"
  "gpt_overhead|$gpt --warmup -1|--warmup"
  "gpt_overhead|$gpt --prime -1|--prime"
  "gpt_overhead|$gpt --precision fp16|--precision"
  "gpt_overhead|$gpt --attention x|--attention"
  "gpt_overhead|$gpt --optimizer adam|--optimizer"
  "gpt_overhead|$gpt --device tpu|--device"
  "gpt_overhead|$gpt --configs off,bogus|--configs"
  "gpt_overhead|$gpt --frobnicate 1|--frobnicate"
  "gpt_overhead|$gpt --out|--out"
  "gpt_overhead|$gpt --heads 5 --d-model 16|--heads"

  "autotune_grid|$data --screen-rounds 4294967297|--screen-rounds"
  "autotune_grid|$data --screen-rounds 0|--screen-rounds"
  "autotune_grid|$data --screen-rounds abc|--screen-rounds"
  "autotune_grid|$data --screen-steps 1e23|--screen-steps"
  "autotune_grid|$data --final-steps 99999999999|--final-steps"
  "autotune_grid|$data --final-rounds 0|--final-rounds"
  "autotune_grid|$data --top -1|--top"
  "autotune_grid|$data --top 0|--top"
  "autotune_grid|$data --max-workers -3|--max-workers"
  "autotune_grid|$data --max-workers 100000|--max-workers"
  "autotune_grid|$data --after-decision -5|--after-decision"
  "autotune_grid|$data --frobnicate 1|--frobnicate"
  "autotune_grid|$data --out|--out"
  "autotune_grid|--data $a_file|--data"

  "planted_pairs|--pairs bogus|--pairs"
  "planted_pairs|--pairs host_sync,bogus|--pairs"
  "planted_pairs|--rounds 0|--rounds"
  "planted_pairs|--steps 1e23|--steps"
  "planted_pairs|--budget-s inf|--budget-s"
  "planted_pairs|--budget-s -1|--budget-s"
  "planted_pairs|--sample-us nan|--sample-us"
  "planted_pairs|--launch-batch-factor 1|--launch-batch-factor"
  "planted_pairs|--device tpu|--device"
  "planted_pairs|--advise-steps 10|--advise-steps"
  "planted_pairs|--out|--out"
  "planted_pairs|--frobnicate 1|--frobnicate"
)

# Each case starts a program (LibTorch's libraries load in about half a second): the cases run
# four at a time, each in its own folder, and report in row order.
run_case() {  # index program expect args...
  local i=$1 prog=$2 expect=$3
  shift 3
  local dir="$work/case$i" what="$prog $*" rc
  mkdir -p "$dir" && cd "$dir" || return
  if [ "$expect" = "accepted" ]; then
    timeout 60 "${bin[$prog]}" "$@" >out.txt 2>err.txt
    rc=$?
    if [ "$rc" -ne 0 ]; then
      echo "FAIL: $what: exit status $rc, expected 0; stderr: $(head -c 300 err.txt)"
    else
      echo "ok: $what accepted"
    fi
  elif [ "$expect" = "--help" ]; then
    timeout 10 "${bin[$prog]}" --help >out.txt 2>err.txt
    rc=$?
    if [ "$rc" -ne 0 ]; then
      echo "FAIL: $prog --help: exit status $rc"
    elif ! grep -q -- "--help" out.txt || ! grep -q "Usage:" out.txt; then
      echo "FAIL: $prog --help: no usage on stdout: $(head -c 300 out.txt)"
    else
      echo "ok: $prog --help"
    fi
  else
    timeout 10 "${bin[$prog]}" "$@" >out.txt 2>err.txt
    rc=$?
    if [ "$rc" -eq 124 ]; then
      echo "FAIL: $what: still running after 10 s"
    elif [ "$rc" -ne 2 ]; then
      echo "FAIL: $what: exit status $rc, expected 2; stderr: $(head -c 300 err.txt)"
    elif [ -s out.txt ]; then
      echo "FAIL: $what: printed on stdout (started?): $(head -c 300 out.txt)"
    elif ! grep -qF -- "$expect" err.txt; then
      echo "FAIL: $what: the message does not name '$expect': $(head -c 300 err.txt)"
    else
      echo "ok: $what -> $(head -1 err.txt)"
    fi
  fi >"$work/result$i"
}

for prog in jpeg_classifier gpt_trainer gpt_overhead autotune_grid planted_pairs; do
  rows+=("$prog||--help")
done
ran=0
for row in "${rows[@]}"; do
  IFS='|' read -r prog args expect <<<"$row"
  [ -n "${bin[$prog]}" ] || continue
  ran=$((ran + 1))
  # shellcheck disable=SC2086  # the arguments are word-split on purpose
  run_case "$ran" "$prog" "$expect" $args &
  while [ "$(jobs -rp | wc -l)" -ge 4 ]; do wait -n; done
done
wait
failures=0
for ((i = 1; i <= ran; i++)); do
  cat "$work/result$i" 2>/dev/null || echo "FAIL: case $i left no result"
  grep -q "^ok: " "$work/result$i" 2>/dev/null || failures=$((failures + 1))
done
if [ -e "$work/data" ]; then
  echo "FAIL: a bad flag made the data folder $work/data"
  failures=$((failures + 1))
fi

echo "flags_test: $ran cases, $failures failed"
[ "$failures" -eq 0 ] && [ "$ran" -gt 0 ]
