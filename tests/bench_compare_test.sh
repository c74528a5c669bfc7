#!/usr/bin/env bash
# scripts/bench_compare.py on benchmark results: the planted pairs on the H100 against the H200
# (copies of two baselines as they were, tests/fixtures/bench_compare/, so that refreshing a
# baseline leaves this test alone), the auto-tune grid baselines, and exit status 2 on unreadable
# input.
#   tests/bench_compare_test.sh [repo root]
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cmp=("${PYTHON:-python3}" "$ROOT/scripts/bench_compare.py")
B=$ROOT/bench/baselines
F=$ROOT/tests/fixtures/bench_compare
fails=0
check() {  # $1 what, $2 output, $3 extended regex that must match a line
  if grep -qE -- "$3" <<<"$2"; then echo "ok: $1"; else echo "FAIL: $1 (no line matching: $3)"; fails=$((fails + 1)); fi
}

out=$("${cmp[@]}" "$F/planted-h100-d484916.json" "$F/planted-h200-17ee61a.json" --grep ratio); rc=$?
check "planted: exit 0" "rc=$rc" '^rc=0$'
check "planted: A's commit" "$out" '^   commit: d484916$'
check "planted: B's commit" "$out" '^   commit: 17ee61a$'
check "planted: host_sync matched by pair, with B/A" "$out" \
  '^rows\[pair=host_sync\]\.ratio +1\.1173 +0\.769269 +0\.6885$'
check "planted: a pair only in B" "$out" '^rows\[pair=linear_bias\]\.ratio +- +1\.19966 *$'

out=$("${cmp[@]}" "$B/autotune-grid/h100.json" "$B/autotune-grid/h200.json" --grep fraction_of_best); rc=$?
check "autotune: exit 0" "rc=$rc" '^rc=0$'
check "autotune: machines" "$out" '^   machine: NVIDIA-H200-16cpu$'
check "autotune: fraction of best with B/A" "$out" \
  '^autotuned_fraction_of_best +0\.961398 +0\.953932 +0\.9922$'
check "autotune: held-out fraction" "$out" '^holdout\.autotuned_fraction_of_best +0\.948273 +0\.978859 +1\.0323$'

out=$("${cmp[@]}" "$B/autotune-grid/h100.json" "$ROOT/no/such/file.json" 2>&1); rc=$?
check "missing file: exit 2" "rc=$rc" '^rc=2$'
check "missing file: message" "$out" '^bench_compare: cannot read .*no/such/file\.json'
out=$("${cmp[@]}" "$B/gpu-tests/h100.log" "$B/autotune-grid/h100.json" 2>&1); rc=$?
check "not JSON: exit 2" "rc=$rc" '^rc=2$'
check "not JSON: message" "$out" 'is not JSON'

[ "$fails" -eq 0 ] && echo "bench_compare_test: all passed" || echo "bench_compare_test: $fails failed"
exit $((fails > 0))
