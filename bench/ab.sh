#!/usr/bin/env bash
# A/B of one benchmark program between an older commit and this tree, on the GPU machine, in one
# call: the older tree is carried as .old/ (git archive <commit> | tar x -C .old; .old/ listed in
# .git/info/exclude; carry [".deps", ".old"]). Both are built (this tree by scripts/gpu_run.sh
# build, reusing a warm build-gpu/), then the program runs for the old tree and for this one with
# the same arguments; each run's JSON and log go to $OUT.
#   bench/ab.sh <program> [args...]   e.g. bench/ab.sh planted_pairs --rounds 3 --budget-s 170
# AB_SIDES="old" or "new" runs one side (two calls on one warm machine when both do not fit).
set -uo pipefail
prog=$1; shift
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
[[ " ${AB_SIDES:-old new} " == *" old "* ]] && ( cd .old && cmake -S . -B build-old -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DTORCHPILOT_BUILD_TESTS=OFF >/dev/null 2>&1 &&
  cmake --build build-old -j "$(nproc)" --target "$prog" 2>&1 | tail -1 ) &
export COMMIT=${COMMIT:-new}
[ -x build-gpu/bench/"$prog" ] || scripts/gpu_run.sh build > "$OUT/build-new.txt" 2>&1
wait
machine=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
for side in ${AB_SIDES:-old new}; do
  bin=build-gpu/bench/$prog; c=$COMMIT
  [ $side = old ] && bin=.old/build-old/bench/$prog && c=${OLD_COMMIT:-old}
  echo "== $side ($c): $prog $*"
  $bin --machine "$machine" --commit "$c" "$@" --out "$OUT/$prog-$side.json" > "$OUT/$prog-$side.log" 2>&1
  tail -${AB_TAIL:-14} "$OUT/$prog-$side.log"
done
