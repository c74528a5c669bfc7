#!/usr/bin/env python3
"""scripts/check_docs.py on a small tree of its own (a CTest test, docs_check_selftest, label unit):
the tree as written passes; each edit that breaks one thing the check guards (a link, a heading, a
config key, a flag, a figure of a JSON, JSON-lines or log baseline, a test count, the
sanitizer passes' share of it, a snippet) makes it fail, naming that thing.

  check_docs_test.py SOURCE_ROOT
"""
import json
import os
import stat
import subprocess
import sys
import tempfile

source_root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
checker = os.path.join(source_root, "scripts", "check_docs.py")
CONFIGURATION = "cupti=1 httplib=1 gloo=1 torch_cuda=0 examples=1 bench=1 tools=1"

README = """# Tool

See [the guide](docs/guide.md#reading-the-log) and `docs/guide.md`, "Reading the log".
Set `report.html_path` or `advisors.data_starvation.threshold: 0.1`; the section `gpu.*`.
The step metric `comm.time_ms` is a record field.
Run `prog --alpha 3` or:

```sh
build/prog --beta
```

<!-- flags: prog complete -->
| flag | meaning |
|---|---|
| `--alpha N` | alpha |
| `--beta` | beta |

The cost was <!-- baseline: cost/m.json ratios.advise_vs_off x100 -->+0.83% and
<!-- baseline: cost/m.json samples -->1,874 samples/s, the peak <!-- baseline: cost/m.json peak_bytes /1073741824 -->9.0 GiB;
a probe's second line: <!-- baseline: probe/m.jsonl [1].slowdown x100 -->46% slower; a log's:
<!-- baseline-log: gpu/m.log ^bf16 depth 0: .*\((\d\.\d+)x\)$ -->0.49×. The suite has <!-- tests: all -->6 tests,
the sanitizer passes run <!-- tests: sanitizer -->1 of them.
"""
GUIDE = """# Guide

## Reading the log

<!-- snippet: examples/s.cpp loop -->
```cpp
for (int i = 0; i < 3; ++i) {
  step(i);
}
```
"""
FILES = {
    "README.md": README,
    "docs/guide.md": GUIDE,
    "bench/README.md": "# Benchmarks\n\n`bench/baselines/cost/m.json`\n",
    "bench/baselines/README.md": "# Baselines\n",
    "bench/baselines/cost/m.json": json.dumps(
        {"ratios": {"advise_vs_off": 0.00829596980533398}, "samples": 1873.6856540381234,
         "peak_bytes": 9685351424}),
    "bench/baselines/probe/m.jsonl": '{"slowdown": 0.02}\n{"slowdown": 0.4612}\n',
    "bench/baselines/gpu/m.log": "fp32 depth 0: peak 673.2 MiB (0.47x)\n"
                                 "bf16 depth 0: peak 676.2 MiB (0.49x)\n",
    "configs/default.yaml": "mode: advise\nreport:\n  html_path: \"\"\nadvisors:\n"
                            "  data_starvation:\n    threshold: 0.05\ngpu:\n  device: -1\n"
                            "comm:\n  link_peak_gbps: 0\n",
    "runtime/comm/comm.cpp": 'set("comm", "time_ms", t);\n',
    "examples/s.cpp": "int main() {\n  // [snippet loop]\n  for (int i = 0; i < 3; ++i) {\n"
                      "    step(i);\n  }\n  // [end loop]\n}\n",
    "scripts/sanitize.sh": "cmake -S . -B build-asan -DTORCHPILOT_BUILD_EXAMPLES=OFF\n"
                           "targets=(torchpilot_unit_tests)\n"
                           "ctest -L '^(unit|integration)$' -E 'Flaky' --output-on-failure\n",
    # Two unit tests a sanitizer pass lacks: one registered under an option it turns off, one
    # under a target that only that option makes (examples/, added under the option).
    "CMakeLists.txt": "if(TORCHPILOT_BUILD_EXAMPLES)\n  add_subdirectory(examples)\nendif()\n",
    "examples/CMakeLists.txt": "add_library(example_io io.cpp)\n",
    "tests/CMakeLists.txt": "function(shell_test name label)\n  add_test(NAME ${name} COMMAND true)\n"
                            "endfunction()\nif(TORCHPILOT_BUILD_EXAMPLES)\n"
                            "  shell_test(example_unit unit)\nendif()\nif(TARGET example_io)\n"
                            "  shell_test(example_io_unit unit)\nendif()\n",
}
PROGRAM = "#!/bin/sh\necho 'Usage: prog [OPTIONS]'\necho '  --help'\necho '  --alpha N'\n" \
          "echo '  --beta'\n"
CTEST = {"tests": [
    {"name": "A.One", "command": ["/b/tests/torchpilot_unit_tests"],
     "properties": [{"name": "LABELS", "value": ["unit"]}]},
    {"name": "A.Flaky", "command": ["/b/tests/torchpilot_unit_tests"],
     "properties": [{"name": "LABELS", "value": ["unit"]}]},
    {"name": "B.MultiProcess", "command": ["/b/tests/torchpilot_collectives_tests"],
     "properties": [{"name": "LABELS", "value": ["integration"]}]},
    {"name": "smoke", "command": ["bash"], "properties": [{"name": "LABELS", "value": ["example"]}]},
    {"name": "example_unit", "command": ["true"], "backtrace": 2,
     "properties": [{"name": "LABELS", "value": ["unit"]}]},
    {"name": "example_io_unit", "command": ["true"], "backtrace": 4,
     "properties": [{"name": "LABELS", "value": ["unit"]}]},
], "backtraceGraph": {
    "commands": ["add_test", "shell_test"], "files": ["TREE/tests/CMakeLists.txt"],
    "nodes": [{"file": 0}, {"command": 1, "file": 0, "line": 5, "parent": 0},
              {"command": 0, "file": 0, "line": 2, "parent": 1},
              {"command": 1, "file": 0, "line": 8, "parent": 0},
              {"command": 0, "file": 0, "line": 2, "parent": 3}]}}

# (what is broken, file, text replaced, replacement, words the failure must contain)
BREAKS = [
    ("a link's file", "README.md", "(docs/guide.md#", "(docs/gone.md#", "no file docs/gone.md"),
    ("a link's anchor", "README.md", "#reading-the-log", "#reading-logs", "no heading #reading-logs"),
    ("a quoted heading", "docs/guide.md", "## Reading the log", "## Logs", '"Reading the log"'),
    ("a path", "bench/README.md", "cost/m.json", "cost/n.json", "bench/baselines/cost/n.json"),
    ("a config key", "README.md", "report.html_path", "report.html_file", "report.html_file"),
    ("a nested key", "README.md", "data_starvation.threshold", "data_starvation.treshold",
     "advisors.data_starvation.treshold"),
    ("a section's field", "README.md", "comm.time_ms", "comm.tme_ms", "comm.tme_ms"),
    ("a flag in prose", "README.md", "prog --alpha 3", "prog --gamma 3", "prog --gamma"),
    ("a flag in a code block", "README.md", "build/prog --beta", "build/prog --delta",
     "prog --delta"),
    ("a flag in the table", "README.md", "| `--beta` |", "| `--beta-x` |", "prog --beta-x"),
    ("a flag left out of the table", "README.md", "| `--beta` | beta |\n", "",
     "prog --beta: in --help, missing"),
    ("a percent figure", "README.md", "+0.83%", "+0.84%", "the docs print 0.84"),
    ("a rounded figure", "README.md", "1,874 samples", "1,873 samples", "the docs print 1,873"),
    ("a baseline key", "README.md", "ratios.advise_vs_off", "ratios.window_vs_off",
     "cannot read it"),
    ("a scaled figure", "README.md", "9.0 GiB", "9.1 GiB", "the docs print 9.1"),
    ("a JSON line's figure", "README.md", "46% slower", "47% slower", "the docs print 47"),
    ("a JSON line's index", "README.md", "[1].slowdown", "[2].slowdown", "cannot read it"),
    ("a log's figure", "README.md", "0.49×", "0.48×", "the docs print 0.48"),
    ("a log line the regex misses", "README.md", "^bf16 depth", "^bf61 depth", "no line matches"),
    ("the test count", "README.md", "6 tests", "5 tests", "this build has 6"),
    ("the sanitizer count", "README.md", "sanitizer -->1", "sanitizer -->2", "this build has 1"),
    ("a test under an option the sanitizer pass turns off", "scripts/sanitize.sh",
     " -DTORCHPILOT_BUILD_EXAMPLES=OFF", "", "this build has 3"),
    ("a test under a target of a folder that option leaves out", "CMakeLists.txt",
     "if(TORCHPILOT_BUILD_EXAMPLES)", "if(TORCHPILOT_BUILD_TOOLS)", "this build has 2"),
    ("a snippet", "docs/guide.md", "  step(i);", "  step(i + 1);", "differs from examples/s.cpp"),
]


def write_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def executable(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def run(tmp, files):
    root = os.path.join(tmp, "tree")
    subprocess.run(["rm", "-rf", root], check=True)
    write_tree(root, files)
    return subprocess.run(
        [sys.executable, checker, "--root", root, "--build", tmp, "--ctest",
         os.path.join(tmp, "ctest"), "--configuration", CONFIGURATION, "--programs", "prog",
         "--bin", "prog=" + os.path.join(tmp, "prog")],
        capture_output=True, text=True, timeout=60)


def main():
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        executable(os.path.join(tmp, "prog"), PROGRAM)
        listing = json.dumps(CTEST).replace("TREE", os.path.join(tmp, "tree"))
        executable(os.path.join(tmp, "ctest"), "#!/bin/sh\ncat <<'EOF'\n" + listing + "\nEOF\n")
        out = run(tmp, FILES)
        if out.returncode != 0:
            print(f"FAIL: the intact tree: exit {out.returncode}\n{out.stdout}{out.stderr}")
            failed += 1
        else:
            print("ok: the intact tree passes")
        for what, rel, old, new, expect in BREAKS:
            files = dict(FILES)
            assert old in files[rel], (what, old)
            files[rel] = files[rel].replace(old, new, 1)
            out = run(tmp, files)
            if out.returncode != 1 or expect not in out.stdout:
                print(f"FAIL: {what}: exit {out.returncode}, expected 1 and '{expect}'\n"
                      f"{out.stdout}{out.stderr}")
                failed += 1
            else:
                line = next(l for l in out.stdout.splitlines() if expect in l)
                print(f"ok: {what}: {line}")
    print(f"check_docs_test: {len(BREAKS) + 1} cases, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
