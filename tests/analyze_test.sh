#!/usr/bin/env bash
# torchpilot-analyze's command line: --help, errors with status 2 and one line naming the problem,
# (a file's: one line; a flag's: CLI11's message naming the flag), and advice on a real trace
# (tests/fixtures/kineto). Hostile input (docs/analyze.md, "Limits and refusals"): under a 4 GB
# address-space limit every malformed trace exits 2 with one line within 10 s; names with control
# bytes are printed escaped. Usage: analyze_test.sh TOOL SOURCE_DIR
set -uo pipefail
tool=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() {  # check NAME EXPECTED_STATUS PATTERN -- command...
  local name=$1 want=$2 pattern=$3
  shift 4
  # The hang bound and the memory bound: 10 s, 4 GB of address space. Under AddressSanitizer
  # (scripts/sanitize.sh sets ASAN_OPTIONS) no address-space limit (its shadow memory reserves
  # terabytes of it) and 30 s: the tool's own bounds are what is tested there.
  if [[ -n ${ASAN_OPTIONS:-} ]]; then
    timeout -s KILL 30 "$@" >"$tmp/out" 2>"$tmp/err"
  else
    (ulimit -v 4194304; exec timeout -s KILL 10 "$@") >"$tmp/out" 2>"$tmp/err"
  fi
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
check version 0 '^torchpilot-analyze [0-9]+\.[0-9]+\.[0-9]+$' -- "$tool" --version
check frontend_python 0 'actions for Python: Python.s torch.profiler' -- "$tool" "$fixtures/data_wait.json.gz"
check frontend_python_action 0 'DataLoader\(\.\.\., num_workers=N' -- "$tool" "$fixtures/data_wait.json.gz"
check frontend_cxx 0 'action: check the loader' -- "$tool" --frontend cxx "$fixtures/data_wait.json.gz"
check frontend_bad 2 'frontend' -- "$tool" --frontend java "$fixtures/data_wait.json.gz"
check file_missing 2 'nope\.json: cannot open' -- "$tool" "$tmp/nope.json"
check file_not_kineto 2 'not a Kineto trace' -- "$tool" "$tmp/other.json"
check file_not_json 2 'not JSON' -- "$tool" "$tmp/bad.json"
check file_bad_gzip 2 'gzip' -- "$tool" "$tmp/bad.json.gz"
# Not regular files: refused before they are read (a FIFO would block, /dev/zero never ends).
mkfifo "$tmp/fifo"
check file_fifo 2 'fifo: not a regular file \(a FIFO\)' -- "$tool" "$tmp/fifo"
check file_dev_zero 2 '/dev/zero: not a regular file \(a character device\)' -- "$tool" /dev/zero
check file_directory 2 'not a regular file \(a directory\)' -- "$tool" "$tmp"
# A gzip bomb: 2 MB that inflates to 2 GB of zeros (generated, not committed).
python3 -c '
import sys, zlib
z = zlib.compressobj(9, zlib.DEFLATED, 31)
chunk = bytes(1 << 24)
with open(sys.argv[1], "wb") as f:
    for _ in range(128):
        f.write(z.compress(chunk))
    f.write(z.flush())' "$tmp/bomb.json.gz"
check file_gzip_bomb 2 'decompresses to more than 512 MB \(--max-input-mb\)' -- "$tool" "$tmp/bomb.json.gz"
check file_too_big 2 'is 2 MB, above --max-input-mb 1' -- "$tool" "$tmp/bomb.json.gz" --max-input-mb 1
: >"$tmp/empty.json"
check file_empty 2 'empty file: expected a Kineto trace' -- "$tool" "$tmp/empty.json"
head -c 100 "$fixtures/host_sync.json.gz" >"$tmp/cut.json.gz"
check file_truncated_gzip 2 'truncated gzip' -- "$tool" "$tmp/cut.json.gz"
# The wrong shapes of JSON: each message names what was expected and where.
wrong() {  # wrong NAME PATTERN JSON
  printf '%s' "$3" >"$tmp/$1.json"
  check "file_$1" 2 "$2" -- "$tool" "$tmp/$1.json"
}
step='{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 1000, "dur": 1000, "tid": 1}'
kernel() {  # a kernel event with $1 as its duration and $2 as its name
  printf '{"ph": "X", "cat": "kernel", "name": "%s", "ts": 1100, "dur": %s, "tid": 7, "args": {"stream": 7, "correlation": 1, "grid": [1, 1, 1], "block": [128, 1, 1]}}' "$2" "$1"
}
wrong top_array 'expected a JSON object with a "traceEvents" array, got an array' '[1, 2]'
wrong no_events 'no "traceEvents" key: expected a JSON object with a "traceEvents" array' '{"a": 1}'
wrong events_object '"traceEvents" is an object: expected an array of events' '{"traceEvents": {}}'
wrong event_number 'traceEvents\[1\] is a number: expected an event \(a JSON object\)' "{\"traceEvents\": [$step, 5]}"
wrong ts_string 'traceEvents\[0\]\.ts is a string: expected a number \(microseconds\)' '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": "1"}]}'
wrong name_number 'traceEvents\[0\]\.name is a number: expected a string' '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": 5, "ts": 1}]}'
wrong ph_number 'traceEvents\[0\]\.ph is a number: expected a string' '{"traceEvents": [{"ph": 1}]}'
wrong device_name 'deviceProperties\[0\]\.name is a number: expected a string' "{\"deviceProperties\": [{\"name\": 5}], \"traceEvents\": [$step]}"
wrong truncated 'truncated JSON: the text ends inside a value' "{\"traceEvents\": [$step"
wrong syntax 'not JSON: syntax error at line 1, column 18' '{"traceEvents": [x]}'
wrong no_steps 'no profiler steps' '{"traceEvents": []}'
# Impossible values: errors naming the event and the value, never advice from them.
wrong negative_dur 'traceEvents\[1\]\.dur is -300: expected a duration of 0 to' "{\"traceEvents\": [$step, $(kernel -300 k)]}"
wrong nan_ts 'traceEvents\[0\]\.ts is 1e\+300: expected a time of 0 to' '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1e300}]}'
wrong huge_shape 'traceEvents\[1\]\.args\."Input Dims"\[0\] has 1e\+16 elements: expected at most' "{\"record_shapes\": 1, \"traceEvents\": [$step, {\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::mm\", \"ts\": 1100, \"dur\": 10, \"tid\": 1, \"args\": {\"Input Dims\": [[100000000, 100000000], [100000000, 100000000]], \"Input type\": [\"float\", \"float\"]}}]}"
wrong fast_flops 'ProfilerStep#1 \(traceEvents\[0\]\) counts 2e\+18 FLOPs in 0\.001 s \(2e\+21 FLOP/s\): above 1e\+18' "{\"record_shapes\": 1, \"traceEvents\": [$step, {\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::mm\", \"ts\": 1100, \"dur\": 10, \"tid\": 1, \"args\": {\"Input Dims\": [[1000000, 1000000], [1000000, 1000000]], \"Input type\": [\"float\", \"float\"]}}]}"
wrong negative_dim 'traceEvents\[1\]\.args\."Input Dims"\[0\]\[1\] is -64: expected a size of 0 or more' "{\"record_shapes\": 1, \"traceEvents\": [$step, {\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::mm\", \"ts\": 1100, \"dur\": 10, \"tid\": 1, \"args\": {\"Input Dims\": [[64, -64], [64, 64]], \"Input type\": [\"float\", \"float\"]}}]}"
check too_many_events 2 'more than 1000 events \(--max-events 1000\)' -- "$tool" "$fixtures/host_sync.json.gz" --max-events 1000
python3 -c 'print("{\"traceEvents\": " + "[" * 100000 + "]" * 100000 + "}")' >"$tmp/deep.json"
check file_deep 2 'nested deeper than 64 levels' -- "$tool" "$tmp/deep.json"
# Control bytes in names reach the terminal escaped; the JSON output stays valid JSON.
printf '{"deviceProperties": [{"name": "GPU\\u001b]0;owned\\u0007", "numSms": 132}], "traceEvents": [%s, %s]}' \
  "$step" "$(kernel 300 'evil\u001b[2J\u009b31m')" >"$tmp/escape.json"
check escape_text 0 'on GPU\\x1b\]0;owned\\x07' -- "$tool" "$tmp/escape.json"
if grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$tmp/out" || grep -q $'\xc2\x9b' "$tmp/out"; then
  echo "FAIL escape_text: a raw control byte in the output"; fail=1
fi
check escape_json 0 '"type":"epoch"' -- "$tool" "$tmp/escape.json" --json
if ! python3 -c 'import json, sys; json.loads(open(sys.argv[1]).read())' "$tmp/out"; then
  echo "FAIL escape_json: not valid JSON"; fail=1
fi
check no_trace 2 'TRACE' -- "$tool"
check bad_peak 2 '--peak-tflops' -- "$tool" "$fixtures/healthy.json.gz" --peak-tflops -1
check nan_peak 2 '--peak-tflops' -- "$tool" "$fixtures/healthy.json.gz" --peak-tflops nan
check missing_config 2 '--config' -- "$tool" "$fixtures/healthy.json.gz" --config "$tmp/none.yaml"
check unknown_flag 2 '--frobnicate' -- "$tool" "$fixtures/healthy.json.gz" --frobnicate
check host_sync 0 'ADVICE \[info\] host_sync' -- "$tool" "$fixtures/host_sync.json.gz"
check pm_said 0 'PM sampling: not in a Kineto trace' -- "$tool" "$fixtures/host_sync.json.gz"
check json 0 '"type":"epoch"' -- "$tool" "$fixtures/data_wait.json.gz" --json
check peak 0 'of 100 peak' -- "$tool" "$fixtures/fp32_matmul.json.gz" --peak-tflops 100
echo 'advisors: {host_sync: {threshold: 0.9}}' >"$tmp/quiet.yaml"
"$tool" "$fixtures/host_sync.json.gz" --config "$tmp/quiet.yaml" >"$tmp/out" 2>&1
if grep -q 'ADVICE.*host_sync' "$tmp/out"; then echo "FAIL config: threshold ignored"; fail=1; else echo "ok   config"; fi
exit $fail
