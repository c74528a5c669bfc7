#!/usr/bin/env bash
# torchpilot-analyze on a long trace: 20,000 synthetic steps (scripts/make_long_kineto_trace.py,
# about 150 MB of JSON) analysed to the end. A hang bound, not a speed test: the analysis is
# n log n in the events (docs/analyze.md, "Limits and refusals"); a per-step scan of the whole
# trace took minutes here. Usage: analyze_long_test.sh TOOL SOURCE_DIR
set -uo pipefail
tool=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$src/scripts/make_long_kineto_trace.py" --steps 20000 --out "$tmp/long.json" || exit 1
start=$(date +%s)
timeout -s KILL 150 "$tool" "$tmp/long.json" >"$tmp/out" 2>"$tmp/err"
rc=$?
echo "analysed in $(($(date +%s) - start)) s (status $rc)"
if [[ $rc -ne 0 ]] || ! grep -q '^trace .*: 20000 profiled steps' "$tmp/out"; then
  echo "FAIL long_trace: status $rc"; head -c 2000 "$tmp/out" "$tmp/err"; exit 1
fi
echo "ok   long_trace"
