#!/usr/bin/env bash
# A/B of torchpilot's overhead between an older commit and this tree, on the GPU machine, in one
# call: the older tree is carried as .old/ (git archive <commit> | tar x -C .old; .old/ listed in
# .git/info/exclude; carry [".deps", ".old"]), both are built, then bench/gpt_overhead runs for
# each, one after the other. Used for the layering change (a6fe81f against 1040932 on an H100).
set -uo pipefail
R=$OUT; export OUT=/tmp/o; mkdir -p $OUT
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
( cd .old && cmake -S . -B build-old -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DTORCHPILOT_BUILD_TESTS=OFF >/dev/null 2>&1 && cmake --build build-old -j 16 --target gpt_overhead 2>&1 | tail -2 ) &
export COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo new)}
scripts/gpu_run.sh build > $OUT/build-new.txt 2>&1
wait
echo "== new: profiler test"; (cd build-gpu && ctest -R GpuProfiler --output-on-failure -V 2>&1) > $OUT/ctest-profiler.log; grep -E "Passed|Failed|before|during|after|skipped|line up" $OUT/ctest-profiler.log | head -20
echo "== old ${OLD_COMMIT:-old}: gpt_overhead"; .old/build-old/bench/gpt_overhead --machine H100-16cpu --commit ${OLD_COMMIT:-old} --out $OUT/overhead-old.json 2>&1 | tail -9
echo "== new $COMMIT: gpt_overhead"; build-gpu/bench/gpt_overhead --machine H100-16cpu --commit $COMMIT --out $OUT/overhead-new.json 2>&1 | tail -9
cd /tmp && tar czf $R/gpu-out.tgz o
