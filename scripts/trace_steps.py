#!/usr/bin/env python3
"""Per-step GPU and host durations of torchpilot's window trace files (report.trace_dir), to tell
a window that slows every step (a per-launch cost) from one with a few stalled steps.
  scripts/trace_steps.py DIR_OR_FILE...
"""
import glob
import json
import os
import statistics
import sys


def steps(events, pid):
    return [e for e in events if e.get("ph") == "X" and e.get("pid") == pid
            and str(e.get("name", "")).startswith("step ")]


def main(paths):
    files = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "**", "*.json"), recursive=True)) if os.path.isdir(p) else [p]
    for f in files:
        with open(f) as fh:
            d = json.load(fh)
        ev = d["traceEvents"] if isinstance(d, dict) else d
        gpu = [s["dur"] / 1e3 for s in steps(ev, 2)]
        host = [s["dur"] / 1e3 for s in steps(ev, 1)]
        kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev
                         if e.get("ph") == "X" and e.get("pid") == 2 and e.get("tid", 0) > 2)
        gaps, end = [], None
        for b, e in kernels:
            if end is not None and b > end:
                gaps.append((b - end) / 1e3)
            end = e if end is None else max(end, e)
        line = {"file": os.path.relpath(f), "kernels": len(kernels)}
        for name, v in (("gpu_step_ms", gpu), ("host_step_ms", host)):
            if v:
                med = statistics.median(v)
                line[name] = {"n": len(v), "median": round(med, 3), "max": round(max(v), 3),
                              "excess_over_median": round(sum(max(0, x - med) for x in v), 3),
                              "first3": [round(x, 2) for x in v[:3]]}
        gaps.sort(reverse=True)
        line["gpu_idle_ms"] = round(sum(gaps), 3)
        line["largest_gaps_ms"] = [round(g, 3) for g in gaps[:5]]
        print(json.dumps(line))


if __name__ == "__main__":
    main(sys.argv[1:] or ["."])
