#!/usr/bin/env bash
# Set-up (scripts/setup.sh), then the example: the JPEG classifier starting from LibTorch's
# default loader (workers 0) in autotune mode. Extra arguments go to the example.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
./build/examples/jpeg_classifier "$@"
