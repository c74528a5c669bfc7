#!/usr/bin/env bash
# Set-up (scripts/setup.sh), then the whole test suite through CTest. GPU tests (label gpu) skip
# on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd build
t0=$SECONDS
status=0
ctest --output-on-failure -j "$(nproc)" --timeout 600 || status=$?
echo "run_tests: tests $((SECONDS - t0)) s"
exit $status
