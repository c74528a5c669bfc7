#!/usr/bin/env python3
"""The layering rules of docs/architecture.md, checked on the source tree (a CTest test, label unit).

runtime/, advisors/ and hooks/ are each sliced by subsystem: <layer>/<sub>/. Includes are followed
transitively ("torchpilot/<layer>/<sub>/<file>.h", or a bare name from the includer's own folder).
  1. vendor and LibTorch headers (torch, ATen, c10, CUDA, CUPTI, NVML, NVTX, NCCL) only under hooks/;
     spdlog only in runtime/ sources (the core logs with it);
  2. runtime/ and advisors/ reach nothing under hooks/;
  3. runtime/core/ and advisors/core/ reach no subsystem, except the edges listed in KNOWN_UP below
     (the kernel's remaining reach, to be cut: the list may only shrink);
  4. no subsystem includes another subsystem's private header (PRIVATE below; core's are shared);
  5. advisors are rules over records: they reach no Pilot, sink, collector host or trial engine;
  6. the repository cites no file outside itself (../shared/).
Prints each violation and exits 1 if there is any.
"""
import os
import re
import subprocess
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
os.chdir(root)
LAYERS = ("runtime", "advisors", "hooks")
VENDOR = re.compile(r'#include\s*[<"](torch/|ATen/|c10/|cuda|cupti|nvml|nvtx|nccl|nvToolsExt|spdlog/)')
INCLUDE = re.compile(r'#include\s*"([^"]+)"')
# Headers internal to their folder: another subsystem must not include them.
PRIVATE = {"hooks/gpu/" + n for n in (
    "cuda_driver.h", "cuda_markers.h", "cupti_activity_internal.h", "cupti_activity_trace.h",
    "cupti_api.h", "cupti_backend.h", "cupti_backend_internal.h", "cupti_pm_sampling.h",
    "marker_stream.h", "nvml_sampler.h", "op_symbols.h", "own_thread.h", "cupti_fixture.h")} | {
    "hooks/comm/comm_observer.h", "hooks/reports/prometheus_exporter.h",
    "hooks/memory/activation_offload_internal.h"}
# The kernel's includes of subsystems that remain (issue 38: each subsystem registers itself instead).
KNOWN_UP = {
    # The advisor catalog declares every subsystem's rules; the gain models are shared by them.
    ("advisors/core/advisors.h", "runtime/flops/flop_records.h"),
    ("advisors/core/advisors.h", "runtime/gpu/gpu_records.h"),
    ("advisors/core/advisors.h", "runtime/loader/loader_records.h"),
    ("advisors/core/advisors.h", "runtime/stalls/step_outliers.h"),
    ("advisors/core/gain_models.cpp", "runtime/flops/device_peaks.h"),
    ("advisors/core/gain_models.cpp", "runtime/flops/flop_records.h"),
    ("advisors/core/gain_models.cpp", "runtime/gpu/gpu_records.h"),
    ("advisors/core/gain_models.cpp", "runtime/gpu/kernel_classes.h"),
    ("advisors/core/gain_models.cpp", "runtime/loader/loader_records.h"),
    ("advisors/core/gain_models.cpp", "runtime/stalls/step_outliers.h"),
}

files = [f for f in subprocess.check_output(["git", "ls-files", "--cached", "--others", "--exclude-standard", *LAYERS], text=True).split()
         if f.endswith((".h", ".cpp"))]
if not files:  # not a git checkout (a source archive): walk the folders
    files = [os.path.join(d, n) for layer in LAYERS for d, _, ns in os.walk(layer) for n in ns
             if n.endswith((".h", ".cpp"))]
text = {f: open(f, encoding="utf-8", errors="replace").read() for f in files}


def resolve(includer, name):
    if name.startswith("torchpilot/") and name[len("torchpilot/"):] in text:
        return name[len("torchpilot/"):]
    local = os.path.join(os.path.dirname(includer), name)
    return local if local in text else None


edges = {f: [t for t in (resolve(f, n) for n in INCLUDE.findall(s)) if t] for f, s in text.items()}


def sub(f):
    parts = f.split("/")
    return (parts[0], parts[1]) if len(parts) > 2 else (parts[0], "")


def reach(start):
    """Every file `start` reaches, with the path to it."""
    seen, todo = {start: [start]}, [start]
    while todo:
        f = todo.pop()
        for t in edges[f]:
            if t not in seen:
                seen[t] = seen[f] + [t]
                todo.append(t)
    return seen


problems = []
for f, s in sorted(text.items()):
    layer, name = sub(f)
    for m in VENDOR.finditer(s):
        if layer == "hooks" or (m.group(1) == "spdlog/" and layer == "runtime" and f.endswith(".cpp")):
            continue
        problems.append(f"vendor or LibTorch header in a pure layer: {f}: {m.group(0)}")
    for t in edges[f]:
        tl, tn = sub(t)
        if layer != "hooks" and tl == "hooks":
            problems.append(f"hooks/ reached from a lower layer: {f} includes {t}")
        if name == "core" and layer != "hooks" and tn != "core" and (f, t) not in KNOWN_UP:
            problems.append(f"the kernel includes a subsystem: {f} includes {t} (register it instead)")
        if t in PRIVATE and (tl, tn) != (layer, name):
            problems.append(f"another subsystem's private header: {f} includes {t}")
    if layer == "advisors":
        for t, path in reach(f).items():
            if re.search(r"runtime/(core/(pilot|sink|collector)|tune/trial_engine|gpu/gpu_monitor)\.h$", t):
                problems.append("an advisor depends on the Pilot's machinery: " + " -> ".join(path))
for edge in sorted(KNOWN_UP):
    if edge[1] not in edges.get(edge[0], []):
        problems.append(f"KNOWN_UP lists an edge that is gone (remove it from the list): {edge}")

cites = subprocess.run(["git", "grep", "-nE", r"(\.\./)+shared/|DESIGN\.md|GPU-NOTES", "--", ".",
                        ":!scripts/check_layers.py"], capture_output=True, text=True).stdout
problems += [f"cites a file outside the repository: {c}" for c in cites.splitlines()]

for p in sorted(set(problems)):
    print("layering:", p)
if problems:
    sys.exit(1)
print(f"layering: {len(text)} files of runtime/, advisors/ and hooks/ keep their rules "
      f"({len(KNOWN_UP)} known kernel includes left)")
