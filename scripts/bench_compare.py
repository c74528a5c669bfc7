#!/usr/bin/env python3
"""Compare two result or baseline files of the same benchmark, side by side.

    scripts/bench_compare.py A.json B.json [--grep TEXT]... [--strings] [--changed]

Both files are read as JSON; their leaves are matched by key path, recursively (a list of objects
that carry a name such as "pair", "name", "setting" or "bucket_mb" is matched by that name, any
other list by index). Numbers print with the ratio B/A. The machine, commit and date of each file
come first where the file has them (bench/baselines/README.md lists them for files that do not).

  --grep TEXT   only keys containing TEXT (case-insensitive; repeat for any of several)
  --strings     text leaves too (default: numbers and booleans only)
  --changed     only leaves whose values differ

Exit status: 0 on success, 2 on unreadable input (missing file, not JSON, not an object/list).
Python 3 standard library only.
"""
import argparse
import json
import math
import signal
import sys

META_KEYS = ("bench", "benchmark", "machine", "commit", "date", "device", "libtorch", "torch")
NAME_KEYS = ("pair", "name", "setting", "variant", "bucket_mb", "micro_batch", "batch", "rank",
             "round", "config")


def fail(msg):
    print(f"bench_compare: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror or e}")
    try:
        data = json.loads(text)
    except ValueError as e:
        fail(f"{path} is not JSON ({e}); compare .json result files, not logs or JSON lines")
    if not isinstance(data, (dict, list)):
        fail(f"{path}: expected a JSON object or array at the top, got {type(data).__name__}")
    return data


def list_label(items):
    """The key that names every object of a list uniquely, if any."""
    if not items or not all(isinstance(x, dict) for x in items):
        return None
    for k in NAME_KEYS:
        vals = [x.get(k) for x in items]
        if all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in vals) \
                and len(set(vals)) == len(vals):
            return k
    return None


def flatten(node, prefix, out):
    if isinstance(node, dict):
        for k, v in node.items():
            flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(node, list):
        label = list_label(node)
        for i, v in enumerate(node):
            tag = f"[{label}={v[label]}]" if label else f"[{i}]"
            flatten(v, prefix + tag, out)
    else:
        out[prefix] = node
    return out


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        return f"{v:.6g}"
    s = str(v)
    return s if len(s) <= 40 else s[:37] + "..."


def meta(data):
    if not isinstance(data, dict):
        return {}
    return {k: data[k] for k in META_KEYS if k in data and not isinstance(data[k], (dict, list))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="first file (A)")
    ap.add_argument("b", help="second file (B)")
    ap.add_argument("--grep", action="append", default=[], help="only keys containing TEXT")
    ap.add_argument("--strings", action="store_true", help="show text leaves too")
    ap.add_argument("--changed", action="store_true", help="only leaves that differ")
    args = ap.parse_args()

    da, db = load(args.a), load(args.b)
    ma, mb = meta(da), meta(db)
    print(f"A: {args.a}")
    for k, v in ma.items():
        print(f"   {k}: {v}")
    print(f"B: {args.b}")
    for k, v in mb.items():
        print(f"   {k}: {v}")
    ba, bb = ma.get("bench", ma.get("benchmark")), mb.get("bench", mb.get("benchmark"))
    if ba and bb and ba != bb:
        print(f"note: different benchmarks ({ba} vs {bb}); matching keys anyway")

    fa, fb = flatten(da, "", {}), flatten(db, "", {})
    keys = list(fa) + [k for k in fb if k not in fa]
    greps = [g.lower() for g in args.grep]
    rows = []
    for k in keys:
        if k in META_KEYS:
            continue
        if greps and not any(g in k.lower() for g in greps):
            continue
        va, vb = fa.get(k), fb.get(k)
        numeric = any(is_number(v) or isinstance(v, bool) for v in (va, vb))
        if not numeric and not args.strings:
            continue
        if args.changed and va == vb:
            continue
        ratio = ""
        if is_number(va) and is_number(vb):
            ratio = f"{vb / va:.4f}" if va != 0 else ("1.0000" if vb == 0 else "inf")
        rows.append((k, fmt(va), fmt(vb), ratio))

    if not rows:
        print("no matching figures")
        return 0
    w = [max(len(r[i]) for r in rows + [("key", "A", "B", "B/A")]) for i in range(4)]
    w[0] = min(w[0], 90)
    print(f"{'key':<{w[0]}}  {'A':>{w[1]}}  {'B':>{w[2]}}  {'B/A':>{w[3]}}")
    for k, a, b, r in rows:
        print(f"{k:<{w[0]}}  {a:>{w[1]}}  {b:>{w[2]}}  {r:>{w[3]}}")
    only_a = sum(1 for k in fa if k not in fb)
    only_b = sum(1 for k in fb if k not in fa)
    print(f"{len(rows)} figures; {only_a} keys only in A, {only_b} only in B")
    return 0


if __name__ == "__main__":
    if hasattr(signal, "SIGPIPE"):  # quiet when piped into head
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
