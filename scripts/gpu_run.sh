#!/usr/bin/env bash
# One call on the GPU machine: configure and build against the PyTorch wheel's LibTorch, run the
# whole test suite (GPU tests included), the example, and the auto-tune benchmark; results and
# logs go to $OUT (default bench/runs/gpu-out, git-ignored; curated baselines: bench/baselines/).
#   scripts/gpu_run.sh [all|build|test|gputest|capture|pmprobe|kineto|clocks|example|bench|gpt|gptab|overhead|planted|shortepochs|shortsteps|spreads|launchheavy|shortparts|gpureport|kinetocxx|kinetofixes|secondopinion|collectives1|collectives2|collectives4|memory|offload|loader2]...
#   (default: all; collectives2 and loader2 need two GPUs, collectives4 four; collectives1, memory, offload,
#   loader2, pmprobe and gptab only when named)
# gputest: the gpu-labelled tests only, verbose; gpt: the GPT example (healthy and planted runs,
# and the per-parameter AdamW beside the default fused one); overhead: bench/gpt_overhead
# (torchpilot off vs advise vs a detailed window); planted: bench/planted_pairs (the advice on
# planted bottlenecks and its estimated gain against the measured gain of the fix); shortepochs:
# bench/short_epochs (a small CNN with a stock loader, epochs of a fraction of a second: the
# default configuration against no torchpilot, interleaved); shortparts: the same with one GPU
# collector off at a time, for the per-part cost (only when named); memory: bench/memory (the micro-batch
# search from micro 2 x accumulation 16 against a grid, then large micro-batches that run out of
# memory; docs/memory.md) and the GPT example tuning its micro-batch; offload: bench/gpt_offload (activation
# offloading on the GPT example: peak memory and step time with and without, the largest
# micro-batch each fits).
# Dependencies the machine lacks (libjpeg, ...) may be carried as Debian packages unpacked into
# .deps/root (scripts/fetch_gpu_deps.sh); the machine's own installs are preferred.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/runs/gpu-out}
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
want() { for s in "${steps[@]}"; do [ "$s" = all ] || [ "$s" = "$1" ] && return 0; done; return 1; }
named() { for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
log() { echo "== $(date -u +%H:%M:%S) $*"; }
# bench_run BIN RESULT LOG [FLAGS...]: build-gpu/bench/BIN with --machine, --commit, FLAGS and
# --out $OUT/RESULT-$MACHINE.json; its output on stdout and in $OUT/LOG.log.
bench_run() {
  local bin=$1 result=$2 logname=$3
  shift 3
  ./build-gpu/bench/"$bin" --machine "$MACHINE" --commit "$COMMIT" "$@" \
    --out "$OUT/$result-$MACHINE.json" 2>&1 | tee "$OUT/$logname.log"
}

DEPS=$PWD/.deps/root
if [ -d "$DEPS" ]; then
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$DEPS/usr/lib/x86_64-linux-gnu"
fi
# The device machine's copy of the tree has no .git: pass COMMIT=<sha> from the caller.
if [ -z "${COMMIT:-}" ]; then
  COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  [ -n "$(git status --porcelain 2>/dev/null)" ] && COMMIT="$COMMIT+dirty"
fi
MACHINE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-')
MACHINE="${MACHINE:-nogpu}-$(nproc)cpu"

if want build; then
  log "machine $MACHINE, commit $COMMIT"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/machine.txt"
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/machine.txt"
  for h in spdlog/spdlog.h yaml-cpp/yaml.h nlohmann/json.hpp gtest/gtest.h jpeglib.h CLI/CLI.hpp zlib.h; do
    if [ -e /usr/include/$h ] || [ -e /usr/local/include/$h ]; then echo "system: $h"
    elif [ -e "$DEPS/usr/include/$h" ]; then echo ".deps: $h"; else echo "MISSING: $h"; fi
  done | tee -a "$OUT/machine.txt"
  TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  extra=()
  if [ ! -e /usr/include/jpeglib.h ] && [ -d "$DEPS" ]; then
    extra+=(-DJPEG_INCLUDE_DIR="$DEPS/usr/include;$DEPS/usr/include/x86_64-linux-gnu"
            -DJPEG_LIBRARY="$DEPS/usr/lib/x86_64-linux-gnu/libjpeg.so")
  fi
  log configure
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;/usr;$DEPS/usr" "${extra[@]}" 2>&1 | tee "$OUT/configure.log" | tail -5
  log build
  # BUILD_TARGETS: only these targets (e.g. "short_epochs" for shortparts), not everything.
  cmake --build build-gpu -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} -- -k 0 2>&1 |
    tee "$OUT/build.log" | grep -E "error|warning|FAILED" | head -40
  [ -n "${BUILD_TARGETS:-}" ] || [ -x build-gpu/examples/jpeg_classifier ] ||
    { log "build failed"; tail -50 "$OUT/build.log"; exit 1; }
fi

if want test; then
  log "tests (all labels, gpu included)"
  (cd build-gpu && ctest --output-on-failure -j 4 2>&1) | tee "$OUT/ctest.log" | tail -25
fi

if want collectives; then
  log "collectives: NCCL world size 1 (GPU test, verbose)"
  ./build-gpu/tests/torchpilot_collectives_gpu_tests 2>&1 | tee "$OUT/collectives-gpu.log" | tail -15
fi

if named collectives1; then
  # The always-on cost with communication measured, NCCL world size 1 (issue 11): the reference
  # model of collectives2 on one GPU through a one-rank process group. COLL1_RUNS: "WARMUP/STEPS"
  # pairs, one run each (a short run weighs each fresh Pilot's start-up more).
  for ws in ${COLL1_RUNS:-5/30 20/100}; do
    log "collectives1: NCCL world size 1, off vs advise, warm-up ${ws%/*}, ${ws#*/} steps"
    ./build-gpu/bench/collectives --world-size 1 --suite overhead --d-model 1024 --layers 8 \
      --heads 16 --seq 1024 --batch 16 --rounds ${COLL1_ROUNDS:-7} --warmup "${ws%/*}" \
      --steps "${ws#*/}" --machine "$MACHINE" --commit "$COMMIT" ${COLL1_ARGS:-} \
      --out "$OUT/collectives1-w${ws%/*}-s${ws#*/}-$MACHINE.json" 2>&1 \
      | tee "$OUT/collectives1-w${ws%/*}-s${ws#*/}.log" | grep -E "advise_over_off|advise/off|error" | tail -4
  done
fi

# collectives_suite N: the suite below on N GPUs of one host (collectives2, collectives4).
collectives_suite() {
  local n=$1
  log "collectives$n: $(nvidia-smi -L | wc -l) GPUs; topology:"
  nvidia-smi topo -m 2>&1 | tee "$OUT/topology.txt" | head -8
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  ./build-gpu/bench/collectives --world-size "$n" --suite ${COLL_SUITE:-full} --compare-observer \
    --d-model 1024 --layers 8 --heads 16 \
    --seq 1024 --batch 16 --rounds 7 --steps 30 --warmup 5 --buckets 4 --buckets 16 \
    --buckets 25 --buckets 64 --buckets 128 --autotune-start 4 --autotune-warmup 150 \
    --straggler-ms 20 --machine "$MACHINE-x$n" \
    --commit "$COMMIT" ${COLL_ARGS:-} --out "$OUT/collectives-$MACHINE-x$n.json" 2>&1 \
    | tee "$OUT/collectives$n.log" | grep -vE "^\s*$" | tail -40
}

if want collectives2 && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -lt 2 ]; then
  log "collectives2: skipped (fewer than 2 GPUs)"
elif want collectives2; then
  # Two GPUs of one host (issue 12): the data-parallel GPT example on 2 NCCL ranks, bf16. The
  # suite: off vs advise, overlap vs no overlap (always-on and window figures, the advisor's
  # estimate against the measured gain), bucket sizes and bus bandwidth against NVLink, the bucket
  # auto-tune, a planted straggler. COLL_ARGS overrides the model or rounds; COLL_SUITE=overlap
  # runs the overlap part alone.
  collectives_suite 2
fi

if named collectives4 && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -lt 4 ]; then
  log "collectives4: skipped (fewer than 4 GPUs)"
elif named collectives4; then
  # The same suite on four GPUs of one host (issue 43), beside the two-GPU results.
  collectives_suite 4
fi

if named loader2 && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -lt 2 ]; then
  log "loader2: skipped (fewer than 2 GPUs)"
elif named loader2; then
  # The GPT example's host data loader auto-tuned on 2 NCCL ranks (one process per GPU, each its
  # own log): the reference model of collectives2 (~41 ms/step on an H100 pair) with 10 ms of CPU
  # work per sample, 160 ms a batch of 16 on the training thread at 0 workers, so the GPU starves
  # until the search (warm-up: autotune.warmup_steps 200 / warmup_seconds 10) moves loading into
  # workers. 4 epochs of 100 steps leave ~200 steps after the decision. Both ranks must decide the
  # same setting at the same step (their JSON records). LOADER2_ARGS overrides or adds flags.
  log "loader2: GPT example, --host-loader on 2 ranks, mode autotune from 0 workers"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  rm -f "$OUT"/loader2.jsonl.rank*
  pids=()
  for r in 0 1; do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=${LOADER2_PORT:-29533} WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r \
      ./build-gpu/examples/gpt_trainer --d-model 1024 --layers 8 --heads 16 --seq 1024 \
      --batch 16 --precision bf16 --host-loader --loader-sample-us 10000 --loader-workers 0 \
      --mode autotune --steps 100 --epochs 4 --json "$OUT/loader2.jsonl" ${LOADER2_ARGS:-} \
      > "$OUT/loader2-rank$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || log "loader2: a rank exited with status $?"; done
  grep -E "^gpt:|autotune (trial|decision)|data wait|loader \(gpt\)" "$OUT/loader2-rank0.log" \
    | tail -40
  for r in 0 1; do
    echo "loader2 rank $r decision: $(grep '"type":"tuning_decision"' "$OUT/loader2.jsonl.rank$r" \
      | grep -oE '"chosen":\{[^}]*\}|"decided_at_step":[0-9]+' | tr '\n' ' ')"
  done
fi

if want clocks; then
  log "clocks: what a clock read costs here"
  cmake --build build-gpu --target clock_cost > "$OUT/clock-cost-build.log" 2>&1 &&
    bench_run clock_cost clock-cost clock-cost
fi

if want kineto; then
  # PyTorch profiler traces of small planted trainers: torchpilot-analyze's fixtures
  # (tests/fixtures/kineto, committed from $OUT/kineto).
  log "kineto: profiler traces for torchpilot-analyze"
  python3 scripts/make_kineto_fixtures.py --out "$OUT/kineto" 2>&1 | tee "$OUT/kineto.log" | tail -12
fi

if named kinetofixes; then
  # Each fixture's case against its fix, without the profiler: the analyzer's estimates checked.
  log "kinetofixes: the fixtures' cases against their fixes"
  python3 scripts/make_kineto_fixtures.py --measure-fixes "$OUT/kineto-fixes-$MACHINE.json" 2>&1 \
    | tee "$OUT/kineto-fixes.log" | tail -6
fi

if named kinetocxx; then
  # The C++-made profiler trace of tests/fixtures/kineto (cxx_host_sync.json.gz): LibTorch's C++
  # profiler over a small CUDA trainer (tests/fixtures/kineto/make_cxx_trace.cpp).
  log "kinetocxx: a LibTorch C++ profiler trace"
  cmake --build build-gpu --target make_cxx_kineto_trace -- -k 0 2>&1 | tail -3
  mkdir -p "$OUT/kineto"
  ./build-gpu/tests/make_cxx_kineto_trace "$OUT/kineto/cxx_host_sync.json" 2>&1 | tail -3
  gzip -9 -f "$OUT/kineto/cxx_host_sync.json" && ls -la "$OUT/kineto"
fi

if want gputest; then
  log "gpu-labelled tests, verbose"
  (cd build-gpu && ctest -L gpu ${GPUTEST_REGEX:+-R "$GPUTEST_REGEX"} --output-on-failure -V 2>&1) | tee "$OUT/ctest-gpu.log" \
    | grep -E "^\[|collector|torch profiler|traced steps|Passed|Failed|Skipped|tests passed|SKIP" | tail -60
fi

if named gpureport; then
  # A GPU run's reports for the docs (docs/images/report-gpu.png is its HTML in headless
  # Chromium): the GPT example in fp32 with unfused attention and a host loader of 1 worker that
  # auto-tune moves, every report on; windows allowed (cost.budget 1: a 30 s run's 1% does not
  # pay for a window of 75 ms steps). GPUREPORT_ARGS adds flags.
  log "gpureport: GPT example, fp32, unfused attention, host loader tuned from 1 worker"
  rm -rf "$OUT/gpureport"; mkdir -p "$OUT/gpureport/traces"
  TORCHPILOT_COST_BUDGET=1 TORCHPILOT_REPORT_HTML_PATH="$OUT/gpureport/report-gpu.html" \
  TORCHPILOT_REPORT_TRACE_DIR="$OUT/gpureport/traces" \
    ./build-gpu/examples/gpt_trainer --d-model 1024 --layers 4 --heads 16 --seq 1024 --batch 8 \
    --precision fp32 --attention unfused --host-loader --loader-sample-us 3000 \
    --loader-workers 1 --mode autotune --steps 80 --epochs 4 \
    --json "$OUT/gpureport/report-gpu.jsonl" ${GPUREPORT_ARGS:-} > "$OUT/gpureport/gpt.log" 2>&1
  log "gpureport: exit $?; $(ls "$OUT/gpureport/traces" | wc -l) trace files"
  grep -E "^gpt: epoch|advice|autotune decision" "$OUT/gpureport/gpt.log" | tail -20
fi

if named pmprobe; then
  # What PM sampling costs the GPU work around it, by metric set, and what turning it on and off
  # costs (hooks/gpu/pm_cost_probe.cpp); PMPROBE_ARGS: "[cycles] [steps]".
  log "pmprobe: PM sampling's cost by phase"
  ./build-gpu/bench/pm_cost_probe ${PMPROBE_ARGS:-} > "$OUT/pm-cost-probe-$MACHINE.jsonl" 2> "$OUT/pm-cost-probe.log"
  tail -12 "$OUT/pm-cost-probe-$MACHINE.jsonl"
fi

if want capture; then
  # Real CUPTI output for the replay test (tests/fixtures/cupti/README.md): recorded into the
  # tree's fixture folder, replayed by the unit test at once, and copied to $OUT to be committed.
  log "capture: CUPTI activity records and PM samples of a short workload"
  ./build-gpu/bench/cupti_capture --out tests/fixtures/cupti 2>&1 | tee "$OUT/capture.log" | tail -15
  ./build-gpu/tests/torchpilot_gpu_backend_tests --gtest_filter='CuptiReplay.*' 2>&1 \
    | tee -a "$OUT/capture.log" | grep -E "OK|FAILED|SKIPPED|Failure|PASSED" | tail -15
  mkdir -p "$OUT/cupti" && cp tests/fixtures/cupti/*.json* "$OUT/cupti/" 2>/dev/null
fi

if want gpt; then
  GPT=./build-gpu/examples/gpt_trainer
  log "gpt: d=1024 L=12 T=1024 batch 8, bf16, fused attention (the issue's reference config)"
  $GPT --d-model 1024 --layers 12 --heads 16 --seq 1024 --batch 8 --precision bf16 \
    --attention fused --steps ${GPT_STEPS:-60} --epochs 3 --json "$OUT/gpt-bf16-fused.jsonl" 2>&1 \
    | tee "$OUT/gpt-bf16-fused.log" | grep -vE "^\s*$" | tail -40
  log "gpt: the same with the per-parameter AdamW (torch::optim::AdamW, the default before)"
  $GPT --d-model 1024 --layers 12 --heads 16 --seq 1024 --batch 8 --precision bf16 \
    --attention fused --optimizer per-parameter --steps ${GPT_STEPS:-60} --epochs 3 \
    --json "$OUT/gpt-bf16-fused-perparam.jsonl" 2>&1 \
    | tee "$OUT/gpt-bf16-fused-perparam.log" | grep -E "^gpt:|MFU|ADVICE" | tail -20
  log "gpt planted: fp32 matmuls and unfused attention (d=1024 L=4 T=1024 batch 4)"
  $GPT --d-model 1024 --layers 4 --heads 16 --seq 1024 --batch 4 --precision fp32 \
    --attention unfused --steps 30 --epochs 2 --json "$OUT/gpt-fp32-unfused.jsonl" 2>&1 \
    | tee "$OUT/gpt-fp32-unfused.log" | grep -vE "^\s*$" | tail -40
  log "the same GPT in Python PyTorch (MFU reference on this GPU)"
  python3 scripts/gpt_reference.py --out "$OUT/gpt-python-reference.json" 2>&1 | tail -3
fi

if named gptab; then
  # The example against the Python reference, interleaved: per round the C++ example (advise; and
  # torchpilot off; and advise with --linear module, the frontend's Linear) and the Python
  # reference (foreach and fused AdamW), order rotated; the same
  # steps (GPTAB_STEPS; wall time per step: the example's epochs 1-2 after a warm-up epoch, the
  # reference's back-to-back steps after 10 warm-up steps); medians over GPTAB_ROUNDS rounds.
  GPT=./build-gpu/examples/gpt_trainer
  rounds=${GPTAB_ROUNDS:-3}; gsteps=${GPTAB_STEPS:-100}; ab=$OUT/gptab; mkdir -p "$ab"
  log "gptab: C++ example vs Python reference, $rounds rounds x $gsteps steps, interleaved"
  cxx() {  # $1 mode, $2 linear, $3 log: epoch 0 warms up (and counts FLOPs); epochs 1-2 measured
    $GPT --d-model 1024 --layers 12 --heads 16 --seq 1024 --batch 8 --precision bf16 \
      --attention fused --linear "$2" --mode "$1" --epochs 3 --steps "$gsteps" > "$3" 2>&1
  }
  py() { python3 scripts/gpt_reference.py --steps "$gsteps" --warmup 10 --optimizers foreach,fused --out "$1" > "$1.log" 2>&1; }
  for r in $(seq 1 "$rounds"); do
    order=(advise off module python); k=$(( (r - 1) % 4 ))
    order=("${order[@]:$k}" "${order[@]:0:$k}")
    for c in "${order[@]}"; do
      case $c in
        python) py "$ab/python-$r.json" ;;
        module) cxx advise module "$ab/cxx-module-$r.log" ;;
        *) cxx "$c" aten "$ab/cxx-$c-$r.log" ;;
      esac
    done
  done
  python3 - "$ab" "$rounds" "$MACHINE" "$COMMIT" "$OUT/gpt-vs-python-$MACHINE.json" <<'PY'
import json, re, statistics as st, sys, datetime
ab, rounds, machine, commit, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
flops, peak = 8671538970624, 989.5e12
def cxx(path):  # epochs 1-2: wall time per step, from the printed tokens/s (8192 tokens a step)
    rates = [float(m.group(1)) for m in re.finditer(r"^gpt: epoch [12]: .*?, ([0-9.]+) tokens/s", open(path).read(), re.M)]
    if len(rates) != 2:
        sys.exit(f"{path}: expected epochs 1 and 2")
    return st.mean(8192 / r * 1e3 for r in rates)
per = {"cxx_advise": [], "cxx_off": [], "cxx_module": [], "python_foreach": [], "python_fused": [],
       "python_foreach_synced": [], "python_fused_synced": []}
for r in range(1, rounds + 1):
    for m in ("advise", "off", "module"):
        per["cxx_" + m].append(cxx(f"{ab}/cxx-{m}-{r}.log"))
    p = json.load(open(f"{ab}/python-{r}.json"))
    for o in ("foreach", "fused"):
        per["python_" + o].append(p["adamw_" + o]["wall_step_ms"])
        per[f"python_{o}_synced"].append(p["adamw_" + o]["median_step_ms"])
res = {"bench": "gpt_vs_python", "machine": machine, "commit": commit,
       "date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"), "rounds": rounds,
       "method": "per round: the C++ example (mode advise, mode off, and mode advise with "
                 "--linear module; 3 epochs, the wall time "
                 "per step of epochs 1-2, epoch ends included) and scripts/gpt_reference.py "
                 "(foreach, fused AdamW; the wall time per step of back-to-back steps; _synced: "
                 "the median step synchronized on both sides), order rotated; medians over "
                 "rounds; MFU from the analytic FLOPs at 989.5 TFLOP/s",
       "median_step_ms": {k: st.median(v) for k, v in per.items()},
       "mfu": {k: flops / (st.median(v) / 1e3) / peak for k, v in per.items()},
       "per_round_step_ms": per}
json.dump(res, open(out, "w"), indent=1)
for k, v in per.items():
    print(f"{k:16s} median {st.median(v):7.3f} ms  MFU {flops / (st.median(v) / 1e3) / peak:.4f}  rounds {[round(x, 2) for x in v]}")
PY
fi

if want overhead; then
  log "bench: GPT overhead, off vs advise vs detailed window, interleaved"
  # OVERHEAD_ARGS: e.g. "--batch 32 --rounds 3"; OVERHEAD_TAG names the run's files.
  tag=${OVERHEAD_TAG:+-$OVERHEAD_TAG}
  bench_run gpt_overhead "gpt-overhead$tag" "overhead$tag" ${OVERHEAD_ARGS:-} | tail -25
fi

if named secondopinion; then
  log "bench: the second-opinion set (trainers modelled on public C++ LibTorch code, own fixes)"
  bench_run planted_pairs second-opinion second-opinion --set second-opinion --default-run \
    --budget-s 480 ${SO_ARGS:-} | grep -E "^(==|   |planted_pairs)" | tail -30
fi

if want planted; then
  # PLANTED_ARGS: e.g. "--pairs host_sync,optimizer --rounds 7"; --budget-s bounds the whole run.
  log "bench: planted bottleneck pairs (advice named, estimated vs measured gain)"
  bench_run planted_pairs planted planted --budget-s 900 ${PLANTED_ARGS:-} \
    | grep -E "^(==|   |planted_pairs)" | tail -40
fi

if want shortepochs; then
  # SHORT_EPOCHS_ARGS: e.g. "--rounds 7 --epochs 40".
  log "bench: short epochs, default config vs off, interleaved"
  bench_run short_epochs short-epochs short-epochs ${SHORT_EPOCHS_ARGS:-} | tail -15
fi

if named shortsteps; then
  # Issue 39's trainers: the short-epochs CNN with long epochs at batch 512 and 128 (steps of
  # about 2.2 and 1.4 ms on an H200; 500 and 1000 steps an epoch, or SHORT_STEPS): per-step cost
  # by part, default vs off, when the first trace window's advice came and what windows were
  # predicted to cost against what they cost (SHORT_STEPS_ARGS, default 3 rounds of 10 epochs:
  # runs over 10 s).
  for b in ${SHORT_STEPS_BATCHES:-512 128}; do
    steps=${SHORT_STEPS:-$([ $b = 512 ] && echo 500 || echo 1000)}
    log "short steps: batch $b, $steps steps an epoch"
    bench_run short_epochs short-steps-b$b short-steps-b$b --batch $b --steps "$steps" \
      ${SHORT_STEPS_ARGS:---rounds 3 --epochs 10} |
      grep -E "first trace|per step|default_over_off|predicted|over off"
  done
fi

if named spreads; then
  # Whether a window's idle causes stay put from window to window (issue 40): SPREAD_PAIRS
  # advised over 5 epochs with a window each, under the default config and with
  # SPREAD_VARIANT (default PM sampling off) applied to the advised runs; one A/B round each.
  pairs=${SPREAD_PAIRS:-stock_loader_cpu,stock_loader_io,linear_bias}
  variant=${SPREAD_VARIANT:-TORCHPILOT_GPU_PM_SAMPLING=false}
  log "spreads: $pairs, default"
  bench_run planted_pairs spreads-default spreads-default --pairs "$pairs" --windows 5 \
    --rounds 1 --no-advise-fixed ${SPREAD_ARGS:-} | grep -E "spread|^==" | tail -12
  log "spreads: $pairs, $variant"
  (export "$variant"; bench_run planted_pairs spreads-variant spreads-variant --pairs "$pairs" \
    --windows 5 --rounds 1 --no-advise-fixed ${SPREAD_ARGS:-}) | grep -E "spread|^==" | tail -12
fi

if named launchheavy; then
  # A launch-heavy trainer: the short-epochs CNN at batch 64 with LAUNCHES (default 12000) tiny
  # kernels a step (tens of ms a step): each window's predicted cost against its measured cost,
  # and the run's share at its end (LAUNCH_HEAVY_ARGS, default 2 rounds of 12 epochs of 40 steps).
  log "launch-heavy: ${LAUNCHES:-12000} launches a step"
  bench_run short_epochs launch-heavy launch-heavy --batch 64 --launches "${LAUNCHES:-12000}" \
    ${LAUNCH_HEAVY_ARGS:---rounds 2 --epochs 12 --steps 40} |
    grep -E "first trace|per step|default_over_off|predicted"
fi

if named shortparts; then
  # Where the always-on GPU part of a step goes: short_epochs' per-part medians under the default
  # config, then with one GPU collector off at a time (SHORT_EPOCHS_ARGS, default 2 rounds of 30
  # epochs each).
  for v in default TORCHPILOT_GPU_NVTX=false TORCHPILOT_GPU_STEP_MARKERS=false \
           TORCHPILOT_GPU_PM_SAMPLING=false TORCHPILOT_GPU_NVML=false; do
    log "short epochs parts: $v"
    name=${v%%=*}
    env ${v/#default/TORCHPILOT_MODE=advise} ./build-gpu/bench/short_epochs --machine "$MACHINE" \
      --commit "$COMMIT" ${SHORT_EPOCHS_ARGS:---rounds 2 --epochs 30} \
      --out "$OUT/short-parts-${name#TORCHPILOT_}.json" > "$OUT/short-parts-${name#TORCHPILOT_}.log" 2>&1
    grep -E "per epoch \(median|default_over_off" "$OUT/short-parts-${name#TORCHPILOT_}.log"
  done
fi

if named memory; then
  # MEMORY_RUNS: which runs (default all): start (micro 2 x 16 vs tuned vs grid), oom (trials into
  # micro-batches that do not fit), offload (the offload stage on a capped allocator), example.
  # MEMORY_ARGS / MEMORY_OOM_ARGS: extra flags for those runs (e.g. "--steps 30").
  runs=" ${MEMORY_RUNS:-start oom offload example} "
  if [[ $runs == *" start "* ]]; then
    log "bench: micro-batch search, micro 2 x accumulation 16 vs tuned vs grid"
    bench_run memory memory memory --batch 32 --micro 2 ${MEMORY_ARGS:-} \
      | grep -E "^memory:|autotune (trial|decision)|out of memory" | tail -40
  fi
  if [[ $runs == *" oom "* ]]; then
    log "bench: micro-batch search into micro-batches that do not fit"
    bench_run memory memory-oom memory-oom --batch 512 --micro 32 --grid 32,64,128,256,512 \
      --steps 10 --prime 2 ${MEMORY_OOM_ARGS:-} \
      | grep -E "^memory:|autotune (trial|decision)|out of memory" | tail -40
  fi
  if [[ $runs == *" offload "* ]]; then
    # A 16 GB device (the allocator capped at 0.2 of 80 GB): micro 32 does not fit without
    # offloading; the offload stage tries it with offloading and keeps it only if faster.
    log "bench: the offload stage of the search, allocator capped at 0.2 of the device"
    bench_run memory memory-offload memory-offload --batch 64 --micro 8 --grid 8,16,32 \
      --steps 10 --prime 2 --offload-activations --memory-fraction 0.2 \
      | grep -E "^memory:|autotune (trial|decision)|out of memory|offload" | tail -40
  fi
  if [[ $runs == *" example "* ]]; then
    log "example: gpt_trainer --batch 32 --micro-batch 2 --mode autotune"
    ./build-gpu/examples/gpt_trainer --batch 32 --micro-batch 2 --mode autotune --steps 100 \
      --epochs 3 2>&1 | tee "$OUT/gpt-micro.log" \
      | grep -E "^gpt:|autotune (trial|decision)|memory|out of memory" | tail -40
  fi
fi

if named offload; then
  # OFFLOAD_ARGS: e.g. "--batch 8 --rounds 5 --search 8,16,32,64 --memory-fraction 0.2";
  # bench/README.md, gpt_offload.
  log "bench: activation offloading on the GPT example (peak memory, step time, largest micro-batch)"
  bench_run gpt_offload offload offload ${OFFLOAD_ARGS:-} | tail -30
fi

if want example; then
  log "example: jpeg_classifier, autotune from workers 0"
  ./build-gpu/examples/jpeg_classifier --json "$OUT/example-records.jsonl" 2>&1 \
    | tee "$OUT/example.log" | grep -vE "phases|autotune trial" | tail -40
fi

if want bench; then
  log "bench: auto-tune vs exhaustive grid"
  # AUTOTUNE_ARGS: e.g. "--screen-rounds 1" (a shorter screen of the grid).
  bench_run autotune_grid autotune-grid bench ${AUTOTUNE_ARGS:-} | tail -15
fi
log done
