#!/usr/bin/env bash
# torchpilot-analyze's command line: --help, errors with status 2 and one line naming the problem,
# (a file's: one line; a flag's: CLI11's message naming the flag), and advice on a real trace (tests/fixtures/kineto). Usage: analyze_test.sh TOOL SOURCE_DIR
set -uo pipefail
tool=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() {  # check NAME EXPECTED_STATUS PATTERN -- command...
  local name=$1 want=$2 pattern=$3
  shift 4
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [[ $rc -ne $want ]]; then
    echo "FAIL $name: status $rc, expected $want"; cat "$tmp/out" "$tmp/err"; fail=1; return
  fi
  if ! grep -qE -- "$pattern" "$tmp/out" "$tmp/err"; then
    echo "FAIL $name: no '$pattern' in the output"; cat "$tmp/out" "$tmp/err"; fail=1; return
  fi
  if [[ $name == file_* && $(wc -l <"$tmp/err") -ne 1 ]]; then
    echo "FAIL $name: expected one error line"; cat "$tmp/err"; fail=1; return
  fi
  echo "ok   $name"
}
fixtures=$src/tests/fixtures/kineto
echo '{"a": 1}' >"$tmp/other.json"
echo 'not json' >"$tmp/bad.json"
printf '\x1f\x8b\x08garbage' >"$tmp/bad.json.gz"
check help 0 'TRACE' -- "$tool" --help
check file_missing 2 'nope\.json: cannot open' -- "$tool" "$tmp/nope.json"
check file_not_kineto 2 'not a Kineto trace' -- "$tool" "$tmp/other.json"
check file_not_json 2 'not JSON' -- "$tool" "$tmp/bad.json"
check file_bad_gzip 2 'gzip' -- "$tool" "$tmp/bad.json.gz"
check no_trace 2 'TRACE' -- "$tool"
check bad_peak 2 '--peak-tflops' -- "$tool" "$fixtures/healthy.json.gz" --peak-tflops -1
check nan_peak 2 '--peak-tflops' -- "$tool" "$fixtures/healthy.json.gz" --peak-tflops nan
check missing_config 2 '--config' -- "$tool" "$fixtures/healthy.json.gz" --config "$tmp/none.yaml"
check unknown_flag 2 '--frobnicate' -- "$tool" "$fixtures/healthy.json.gz" --frobnicate
check host_sync 0 'ADVICE \[high\] host_sync' -- "$tool" "$fixtures/host_sync.json.gz"
check pm_said 0 'PM sampling: not in a Kineto trace' -- "$tool" "$fixtures/host_sync.json.gz"
check json 0 '"type":"epoch"' -- "$tool" "$fixtures/data_wait.json.gz" --json
check peak 0 'of 100 peak' -- "$tool" "$fixtures/fp32_matmul.json.gz" --peak-tflops 100
echo 'advisors: {host_sync: {threshold: 0.9}}' >"$tmp/quiet.yaml"
"$tool" "$fixtures/host_sync.json.gz" --config "$tmp/quiet.yaml" >"$tmp/out" 2>&1
if grep -q 'ADVICE.*host_sync' "$tmp/out"; then echo "FAIL config: threshold ignored"; fail=1; else echo "ok   config"; fi
exit $fail
