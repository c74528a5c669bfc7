#!/usr/bin/env python3
"""The docs say only what is true (a CTest test, docs_check, label unit). Standard library only.

Checked in README.md, docs/*.md, bench/README.md and bench/baselines/README.md:
  1. links: every relative Markdown link resolves (the file, and for #anchor a heading of it), as
     does every cross-reference in the docs' own style, `docs/metrics.md`, "Cost" (the file and a
     heading that starts with the quoted words), and every repository path written in backticks
     (`scripts/gpu_run.sh`, `bench/baselines/memory/h100.json`) exists;
  2. config keys: every `section.key` in backticks whose section is a config section names a key
     or a section of configs/default.yaml (read here rather than asking a built tool: the unit test
     ConfigTest.EveryKeyIsDocumentedInDefaultYaml keeps that file equal to the schema that the
     subsystems register, both ways, and reading it needs no build, so the check runs in every
     configuration, even one without LibTorch);
  3. flags: every --flag written after a program's name (a code span or a line of a code block
     that names the program) or in a flag table marked <!-- flags: PROGRAM --> is in that
     program's --help output, and a table marked <!-- flags: PROGRAM complete --> lists every flag
     of it (the programs given with --bin NAME=PATH; one not given is said and
     skipped: a build without examples or benchmarks);
  4. figures: every figure marked <!-- baseline: FILE KEY [SCALE] --> (FILE under bench/baselines/,
     KEY a dotted path into its JSON (names may hold spaces), [i] for a list item, or for a
     .jsonl file [i] first for its line i+1; SCALE x100 for a fraction printed as a percent, xN
     or /N for another unit, /1073741824 for bytes printed in GiB) equals the file's value at the
     printed rounding; the figure is the number right after the marker ("+0.83%", "1,874",
     "×9.0" read as 0.83, 1874, 9.0). A figure a log baseline prints is marked
     <!-- baseline-log: FILE REGEX -->: the first group of the regex's first match in the file;
  5. test counts: a figure marked <!-- tests: all --> (ctest -N) or <!-- tests: sanitizer --> (the
     tests scripts/sanitize.sh runs: labels unit and integration, less its -E pattern and the
     tests of executables built only with the examples) equals this build's count, when the build
     is the documented configuration (--configuration; otherwise said and skipped);
  6. quoted output: every line of a code block after <!-- output: PROGRAM ARGS... --> is a line of
     what the built program prints with those arguments (paths relative to the root; abridged
     quotes are fine, changed lines are not): for deterministic programs, torchpilot-analyze on
     the committed fixtures;
  7. snippets: a code block after <!-- snippet: FILE NAME --> equals the lines between
     "// [snippet NAME]" and "// [end NAME]" in FILE (dedented), so quoted code is code that
     compiles.
Prints every failure as FILE:LINE: message and exits 1 if there is any.

  check_docs.py [--root DIR] [--build DIR --ctest CTEST --configuration TEXT] [--bin NAME=PATH]...
"""
import argparse
import concurrent.futures
import glob
import json
import os
import re
import subprocess
import sys

DOCS = ["README.md", "docs/*.md", "bench/README.md", "bench/baselines/README.md"]
# The configuration the documented test counts hold for: what scripts/setup.sh gives on Debian 12
# (CUDA 13 headers, Gloo's headers and cpp-httplib found; Debian's LibTorch, without CUDA).
DOCUMENTED_CONFIGURATION = "cupti=1 httplib=1 gloo=1 torch_cuda=0 examples=1 bench=1 tools=1"
# Top-level folders whose paths, written in backticks, must exist.
SOURCE_DIRS = ("advisors/", "bench/", "cmake/", "configs/", "docs/", "examples/", "hooks/",
               "include/", "runtime/", "scripts/", "tests/", "tools/", ".ci/")

failures = []


def fail(path, line, message):
    failures.append(f"{path}:{line}: {message}")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


class Doc:
    """A Markdown file: its lines, which of them are inside fenced code blocks, its headings."""

    def __init__(self, root, rel):
        self.rel = rel
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            self.lines = f.read().split("\n")
        self.in_code = []
        fenced = False
        for line in self.lines:
            if line.lstrip().startswith("```"):
                self.in_code.append(True)
                fenced = not fenced
            else:
                self.in_code.append(fenced)
        self.headings = [re.sub(r"^#+\s*", "", l).strip() for l, c in zip(self.lines, self.in_code)
                         if not c and re.match(r"^#{1,6}\s", l)]
        # What a quoted cross-reference may name: a heading, a paragraph's bold title
        # ("**Calibration** (...)") or a table row's first cell ("communication overlap").
        self.titles = [re.sub(r"[`*]", "", h) for h in self.headings]
        for line, code in zip(self.lines, self.in_code):
            if code:
                continue
            bold = re.match(r"^\*\*(.+?)\*\*", line)
            if bold:
                self.titles.append(bold.group(1).rstrip(".").replace("`", ""))
            if line.startswith("|"):
                self.titles.append(line.split("|")[1].strip().replace("`", ""))
        # The rows of tables whose first column lists old names ("was", "Old key"): not checked.
        self.old_name_rows = set()
        header = ""
        for i, line in enumerate(self.lines):
            if not line.startswith("|"):
                header = ""
            elif not header:
                header = line.split("|")[1].strip().lower()
            elif header.startswith(("was", "old")):
                self.old_name_rows.add(i + 1)

    def prose(self):
        """(line number, text) of the lines outside code blocks."""
        return [(i + 1, l) for i, l in enumerate(self.lines) if not self.in_code[i]]

    def has_title(self, words):
        return any(t == words or t.startswith(words) for t in self.titles)

    def checked_text(self, n, line):
        """The line less a first cell that names an old name."""
        return "|".join(line.split("|")[2:]) if n in self.old_name_rows else line


def load_docs(root):
    rels = []
    for pattern in DOCS:
        rels += sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, pattern)))
    return {rel: Doc(root, rel) for rel in rels}


def code_spans(text):
    return re.findall(r"`([^`]+)`", text)


# --- 1. links ---------------------------------------------------------------------------------

def check_links(root, docs, programs):
    heading_cache = {}

    def doc_at(rel):
        if rel not in heading_cache:
            heading_cache[rel] = docs.get(rel) or (Doc(root, rel) if rel.endswith(".md") else None)
        return heading_cache[rel]

    for doc in docs.values():
        here = os.path.dirname(doc.rel)
        for n, line in doc.prose():
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"^[a-z]+:", target) or target.startswith("<"):
                    continue  # https:, mailto:: not checked (no network)
                path, _, anchor = target.partition("#")
                rel = os.path.normpath(os.path.join(here, path)) if path else doc.rel
                if not os.path.exists(os.path.join(root, rel)):
                    fail(doc.rel, n, f"link to {target}: no file {rel}")
                    continue
                if anchor:
                    d = doc_at(rel)
                    if d is None or anchor not in {slug(h) for h in d.headings}:
                        fail(doc.rel, n, f"link to {target}: no heading #{anchor} in {rel}")
            # `docs/metrics.md`, "Cost": the docs' own cross-reference style.
            for rel, words in re.findall(
                    r"`?((?:docs/[a-z_-]+|bench/README|README)\.md)`?,? \"([^\"]+)\"", line):
                words = words.rstrip(".,;:")
                d = doc_at(rel) if os.path.exists(os.path.join(root, rel)) else None
                if d is None:
                    fail(doc.rel, n, f"reference to {rel}: no such file")
                elif not d.has_title(words):
                    fail(doc.rel, n, f"reference to {rel}, \"{words}\": no such heading, "
                                     f"bold title or table row")
            for span in code_spans(doc.checked_text(n, line)):
                for token in span.split():
                    token = token.rstrip(".,;:)")
                    if not token.startswith(SOURCE_DIRS) or re.search(r"[<*{$]|\.\.\.", token):
                        continue
                    path = token.split(":")[0].split("#")[0]
                    if path.startswith("bench/runs/"):
                        continue  # the benchmarks' output, git-ignored
                    # bench/gpt_offload, hooks/gpu/cupti_reattach_probe: a program, by its name
                    # or its source.
                    if os.path.basename(path) in programs:
                        continue
                    if not any(os.path.exists(os.path.join(root, path + ext)) for ext in ("", ".cpp")):
                        fail(doc.rel, n, f"`{token}`: no such file or folder")


# --- 2. config keys -----------------------------------------------------------------------------

def yaml_paths(text):
    """Every key path of an indented YAML mapping (configs/default.yaml's subset of YAML)."""
    paths, stack = set(), []
    for line in text.split("\n"):
        m = re.match(r"^( *)([A-Za-z_][A-Za-z0-9_]*):", line)
        if not m:
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        paths.add(".".join(name for _, name in stack))
    return paths


def source_literals(root):
    """Every "identifier" string literal of the library's sources and the test extensions."""
    names = set()
    for folder in ("runtime", "hooks", "advisors", "tests/extensions"):
        for path in glob.glob(os.path.join(root, folder, "**", "*.[ch]*"), recursive=True):
            with open(path, encoding="utf-8", errors="replace") as f:
                names.update(re.findall(r'"([a-z_][a-z0-9_.]*)"', f.read()))
    return names


def check_keys(root, docs):
    with open(os.path.join(root, "configs/default.yaml"), encoding="utf-8") as f:
        paths = yaml_paths(f.read())
    sections = {p for p in paths if "." not in p}
    literals = None
    for doc in docs.values():
        for n, line in doc.prose():
            for span in code_spans(doc.checked_text(n, line)):
                m = re.match(r"^([a-z_]+(?:\.[a-z0-9_]+)+)(\.\*)?(?::|\s|$)", span)
                if not m or m.group(1).split(".")[0] not in sections or m.group(1) in paths:
                    continue
                name = m.group(1)
                if re.search(r"\.(h|cpp|md|json|jsonl|py|sh|yaml|log)$", name):
                    continue  # a file: advisors.h
                # A section's JSON field shares the section's name (`comm.exposed_ms`, `flops.mfu`):
                # a two-part name is one when the code writes its field name (config keys are
                # spelled by the schema's macros, never as such a literal). Deeper names must be
                # keys: `advisors.<rule>.<key>`.
                if literals is None:
                    literals = source_literals(root)
                parts = name.split(".")
                if len(parts) == 2 and (parts[1] in literals or name in literals):
                    continue
                fail(doc.rel, n, f"`{span}`: {name} is not a key of configs/default.yaml")


# --- 3. flags -----------------------------------------------------------------------------------

def help_flags(bins):
    """{program: set of its --flags}, from each program's --help (run in parallel)."""
    def run(item):
        name, path = item
        try:
            out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return name, None, str(e)
        if out.returncode != 0:
            return name, None, f"--help exited {out.returncode}"
        return name, set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", out.stdout + out.stderr)), None

    flags = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        for name, found, error in pool.map(run, bins.items()):
            if error:
                fail(bins[name], 0, f"{name}: {error}")
            else:
                flags[name] = found | {"--help"}
    return flags


def check_flags(docs, bins, programs):
    flags = help_flags(bins)
    skipped = set()

    def check(doc, n, program, flag):
        if program not in flags:
            skipped.add(program)
        elif flag not in flags[program]:
            fail(doc.rel, n, f"{program} {flag}: not in {program} --help")

    def table_complete(doc, n, program, listed):
        if program in flags:
            for flag in sorted(flags[program] - listed - {"--help"}):
                fail(doc.rel, n, f"{program} {flag}: in --help, missing from the flag table")

    name_pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, programs)) + r")(?![\w-])")
    for doc in docs.values():
        table_program, complete, listed, marker_line = None, False, set(), 0
        for i, line in enumerate(doc.lines + [""]):
            n = i + 1
            m = re.search(r"<!-- flags: (\S+)( complete)? -->", line)
            if m:
                table_program, complete, listed, marker_line = m.group(1), bool(m.group(2)), set(), n
                if table_program not in programs:
                    fail(doc.rel, n, f"flags marker names {table_program}, not a program")
                continue
            if table_program and line.startswith("|"):
                first_cell = line.split("|")[1]
                for flag in re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", first_cell):
                    listed.add(flag)
                    check(doc, n, table_program, flag)
                continue
            if table_program and line.strip() and not line.startswith("|") or i == len(doc.lines):
                if table_program and complete:
                    table_complete(doc, marker_line, table_program, listed)
                table_program = None
            if i == len(doc.lines):
                break
            pieces = [line] if doc.in_code[i] else code_spans(line)
            for piece in pieces:
                # A flag belongs to the last program named before it in the piece.
                names = [(m.end(), m.group(1)) for m in name_pattern.finditer(piece)]
                if not names:
                    continue
                for m in re.finditer(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", piece):
                    owner = [p for end, p in names if end <= m.start()]
                    if owner:
                        check(doc, n, owner[-1], m.group(1))
    for program in sorted(skipped):
        print(f"check_docs: {program} not built here: its documented flags not checked")


# --- 4. figures from baselines -----------------------------------------------------------------

NUMBER = re.compile(r"^[\s*_+×~≈]*([−-]?)(\d[\d,]*(?:\.\d+)?)")


def json_value(data, key):
    """data at KEY: names joined by dots ("ratio_within_0.5_2" is one name where the file has
    it), [i] for a list item."""
    while key:
        item = re.match(r"^\[(\d+)\]\.?", key)
        if item:
            data, key = data[int(item.group(1))], key[item.end():]
            continue
        names = [n for n in data if key == n or key.startswith(n + ".") or key.startswith(n + "[")]
        if not names:
            raise KeyError(key.split(".")[0])
        name = max(names, key=len)
        data, key = data[name], key[len(name):].lstrip(".")
    return data


def load_baseline(path):
    """A JSON file, or a JSON-lines file as the list of its lines' values (KEY [i] is line i+1)."""
    with open(path, encoding="utf-8") as f:
        if path.endswith(".jsonl"):
            return [json.loads(line) for line in f if line.strip()]
        return json.load(f)


def scaled(value, scale):
    """value under a marker's scale: x100 (a fraction printed as a percent), xN, or /N (bytes
    printed in GiB: /1073741824)."""
    if not scale:
        return value
    factor = float(scale[1:])
    return value * factor if scale[0] == "x" else value / factor


def check_figure(doc, n, line, end, value, what):
    """The figure right after a marker (at column end) equals value at its printed rounding."""
    figure = NUMBER.match(line[end:])
    if not figure:
        fail(doc.rel, n, f"{what}: no figure right after the marker")
        return
    text = figure.group(2).replace(",", "")
    printed = float(text) * (-1 if figure.group(1) else 1)
    decimals = len(text.split(".")[1]) if "." in text else 0
    if abs(value - printed) > 0.5 * 10 ** -decimals + 1e-9:
        fail(doc.rel, n, f"{what} is {value:.{decimals + 2}f}; "
                         f"the docs print {figure.group(1)}{figure.group(2)}")


def check_figures(root, docs):
    marker = re.compile(r"<!-- baseline: (\S+) (.+?)(?: ([x/]\d[\d.e+-]*))? -->")
    # A figure a log prints: the first group of REGEX's first match in the file (a line's text;
    # a figure in several lines of the same form is that line's, so the regex names the line).
    log_marker = re.compile(r"<!-- baseline-log: (\S+) (.+?) -->")
    for doc in docs.values():
        for n, line in doc.prose():
            for m in marker.finditer(line):
                rel, key, scale = m.group(1), m.group(2), m.group(3)
                what = f"baseline {rel} {key}"
                try:
                    value = json_value(load_baseline(os.path.join(root, "bench/baselines", rel)), key)
                    value = scaled(float(value), scale)
                except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
                    fail(doc.rel, n, f"{what}: cannot read it ({type(e).__name__}: {e})")
                    continue
                check_figure(doc, n, line, m.end(), value, what)
            for m in log_marker.finditer(line):
                rel, pattern = m.group(1), m.group(2)
                what = f"baseline {rel} /{pattern}/"
                try:
                    with open(os.path.join(root, "bench/baselines", rel), encoding="utf-8") as f:
                        found = re.search(pattern, f.read(), re.MULTILINE)
                    if not found:
                        raise ValueError("no line matches")
                    value = float(found.group(1).replace(",", ""))
                except (OSError, ValueError, IndexError, re.error) as e:
                    fail(doc.rel, n, f"{what}: cannot read it ({type(e).__name__}: {e})")
                    continue
                check_figure(doc, n, line, m.end(), value, what)


# --- 5. test counts ----------------------------------------------------------------------------

def ctest_tests(ctest, build):
    """The tests this build registers: [(name, labels, executable, sites)], sites the (file, line)
    of each CMake call that registered it (add_test and the functions around it; none for tests
    that GoogleTest discovered); None if any executable is not built."""
    out = subprocess.run([ctest, "--show-only=json-v1"], cwd=build, capture_output=True,
                         text=True, timeout=120)
    listing = json.loads(out.stdout)
    graph = listing.get("backtraceGraph", {"files": [], "nodes": []})
    tests = []
    for t in listing["tests"]:
        if t["name"].endswith("_NOT_BUILT"):
            return None
        labels = []
        for p in t.get("properties", []):
            if p["name"] == "LABELS":
                labels = p["value"]
        command = t.get("command") or [""]
        sites, node = [], t.get("backtrace")
        while node is not None:
            frame = graph["nodes"][node]
            if "line" in frame:
                sites.append((graph["files"][frame["file"]], frame["line"]))
            node = frame.get("parent")
        tests.append((t["name"], labels, os.path.basename(command[0]), sites))
    return tests


def sanitizer_selection(root):
    """The -L and -E arguments of scripts/sanitize.sh's ctest call."""
    with open(os.path.join(root, "scripts/sanitize.sh"), encoding="utf-8") as f:
        text = f.read()
    label = re.search(r"ctest -L '([^']+)'", text)
    exclude = re.search(r"-E '([^']+)'", text)
    return re.compile(label.group(1)), re.compile(exclude.group(1)) if exclude else None


def sanitizer_test_executables(root):
    """The test executables scripts/sanitize.sh builds (its targets), by name."""
    with open(os.path.join(root, "scripts/sanitize.sh"), encoding="utf-8") as f:
        return set(re.findall(r"\btorchpilot_[a-z_]+_tests\b", f.read()))


def sanitizer_options_off(root):
    """The options scripts/sanitize.sh configures OFF (-DTORCHPILOT_BUILD_EXAMPLES=OFF, ...)."""
    with open(os.path.join(root, "scripts/sanitize.sh"), encoding="utf-8") as f:
        return set(re.findall(r"-D([A-Z0-9_]+)=OFF\b", f.read()))


def sanitizer_builds(exe, built):
    """Whether a sanitizer pass has this test's executable: a test executable only when it is one
    of its targets (or a subsystem's own, which it builds by pattern); scripts and tools run."""
    if not exe.endswith("_tests"):
        return True
    return exe in built or exe.endswith("_subsystem_tests")


class CMakeConditions:
    """Which if() conditions of the source tree's CMake files hold a line, so that a test
    registered there can be judged against the options a sanitizer pass turns off."""

    def __init__(self, root):
        self.root = os.path.realpath(root)
        self.files = {}
        self.cmake_files = None

    def lines(self, path):
        if path not in self.files:
            try:
                with open(path, encoding="utf-8") as f:
                    self.files[path] = f.read().split("\n")
            except OSError:
                self.files[path] = []
        return self.files[path]

    def around(self, path, line):
        """The conditions of the if()/elseif() blocks around line (1-based) of path, and of the
        add_subdirectory() that brings path's folder in; an else() branch holds none."""
        stack = []
        for text in self.lines(path)[:line - 1]:
            m = re.match(r"^\s*(if|elseif|else|endif)\s*\((.*?)\)?\s*(?:#.*)?$", text)
            if not m:
                continue
            word, condition = m.group(1), m.group(2)
            if word == "if":
                stack.append(condition)
            elif stack and word == "endif":
                stack.pop()
            elif stack:
                stack[-1] = condition if word == "elseif" else ""
        folder = os.path.dirname(path)
        parent = os.path.dirname(folder)
        if os.path.commonpath([self.root, parent]) == self.root and folder != self.root:
            including = os.path.join(parent, "CMakeLists.txt")
            name = os.path.basename(folder)
            for i, text in enumerate(self.lines(including)):
                if re.match(r"^\s*add_subdirectory\(\s*" + re.escape(name) + r"[\s)]", text):
                    stack += self.around(including, i + 1)
                    break
        return [c for c in stack if c]

    def target_conditions(self, target):
        """The conditions around the add_executable/add_library that defines target."""
        if self.cmake_files is None:
            self.cmake_files = []
            for folder, subfolders, names in os.walk(self.root):
                # Build folders (build, build-asan) and hidden ones hold no sources.
                subfolders[:] = [d for d in subfolders if not d.startswith(("build", "."))]
                if "CMakeLists.txt" in names:
                    self.cmake_files.append(os.path.join(folder, "CMakeLists.txt"))
            # The project's functions that make a target of their first argument
            # (torchpilot_bench(gpt_overhead ...)).
            self.makers = ["add_executable", "add_library"] + [
                m.group(1) for path in self.cmake_files for text in self.lines(path)
                for m in [re.match(r"^\s*function\(\s*(\w+)", text)] if m]
        pattern = re.compile(r"^\s*(?:" + "|".join(self.makers) + r")\(\s*" + re.escape(target) +
                             r"[\s)]")
        for path in self.cmake_files:
            for i, text in enumerate(self.lines(path)):
                if pattern.match(text):
                    return self.around(path, i + 1)
        return []

    def needs(self, conditions, options, seen=()):
        """Whether a condition needs one of options ON: it names one, or a target (TARGET t)
        defined only under one."""
        for condition in conditions:
            if re.match(r"^\s*NOT\b", condition):
                continue
            if any(re.search(r"\b" + o + r"\b", condition) for o in options):
                return True
            for target in re.findall(r"\bTARGET\s+([\w-]+)", condition):
                if target not in seen and self.needs(self.target_conditions(target), options,
                                                     seen + (target,)):
                    return True
        return False


def check_counts(root, docs, build, ctest, configuration):
    marks = [(doc, n, m) for doc in docs.values() for n, line in doc.prose()
             for m in re.finditer(r"<!-- tests: (all|sanitizer) -->", line)]
    if not marks:
        return
    if not build:
        print("check_docs: no build given: test counts not checked")
        return
    if configuration != DOCUMENTED_CONFIGURATION:
        print(f"check_docs: this build ({configuration}) is not the documented configuration "
              f"({DOCUMENTED_CONFIGURATION}): test counts not checked")
        return
    tests = ctest_tests(ctest, build)
    if tests is None:
        print("check_docs: some test executables are not built: test counts not checked")
        return
    # A sanitizer pass runs the tests of its labels less its -E pattern, of the executables it
    # builds, registered in its configuration: not those under an option it turns off (the
    # examples, the benchmarks).
    label, exclude = sanitizer_selection(root)
    built = sanitizer_test_executables(root)
    options = sanitizer_options_off(root)
    cmake = CMakeConditions(root)

    def in_sanitizer_pass(name, labels, exe, sites):
        return (any(label.search(l) for l in labels) and not (exclude and exclude.search(name))
                and sanitizer_builds(exe, built)
                and not any(cmake.needs(cmake.around(os.path.realpath(path), line), options)
                            for path, line in sites
                            if os.path.commonpath([cmake.root, os.path.realpath(path)]) == cmake.root))

    counts = {"all": len(tests), "sanitizer": sum(1 for t in tests if in_sanitizer_pass(*t))}
    for doc, n, m in marks:
        figure = NUMBER.match(doc.lines[n - 1][m.end():])
        printed = int(figure.group(2).replace(",", "")) if figure else None
        if printed != counts[m.group(1)]:
            fail(doc.rel, n, f"tests ({m.group(1)}): this build has {counts[m.group(1)]}, "
                             f"the docs print {printed}")


# --- 6. quoted output -------------------------------------------------------------------------

def code_block_after(doc, i):
    """The lines of the first fenced code block after line index i."""
    j = i + 1
    while j < len(doc.lines) and not doc.lines[j].startswith("```"):
        j += 1
    k = j + 1
    while k < len(doc.lines) and not doc.lines[k].startswith("```"):
        k += 1
    return doc.lines[j + 1:k]


def check_outputs(root, docs, bins):
    for doc in docs.values():
        for i, line in enumerate(doc.lines):
            m = re.search(r"<!-- output: (\S+)((?: [^ ]+?)*) -->", line)
            if not m:
                continue
            program, args = m.group(1), m.group(2).split()
            if program not in bins:
                print(f"check_docs: {program} not built here: its quoted output not checked")
                continue
            out = subprocess.run([bins[program]] + args, cwd=root, capture_output=True, text=True,
                                 timeout=60)
            printed = set((out.stdout + out.stderr).split("\n"))
            for quoted in code_block_after(doc, i):
                if quoted not in printed:
                    fail(doc.rel, i + 1, f"{program} {' '.join(args)} does not print: {quoted[:120]}")


# --- 7. snippets -------------------------------------------------------------------------------

def snippet(root, rel, name):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        lines = f.read().split("\n")
    begin = [i for i, l in enumerate(lines) if l.strip() == f"// [snippet {name}]"]
    end = [i for i, l in enumerate(lines) if l.strip() == f"// [end {name}]"]
    if len(begin) != 1 or len(end) != 1 or end[0] < begin[0]:
        return None
    body = lines[begin[0] + 1:end[0]]
    indent = min((len(l) - len(l.lstrip()) for l in body if l.strip()), default=0)
    return [l[indent:] for l in body]


def check_snippets(root, docs):
    for doc in docs.values():
        for i, line in enumerate(doc.lines):
            m = re.search(r"<!-- snippet: (\S+) (\S+) -->", line)
            if not m:
                continue
            try:
                want = snippet(root, m.group(1), m.group(2))
            except OSError:
                want = None
            if want is None:
                fail(doc.rel, i + 1, f"snippet {m.group(2)}: no single [snippet]/[end] pair in "
                                     f"{m.group(1)}")
                continue
            if code_block_after(doc, i) != want:
                fail(doc.rel, i + 1, f"the code block differs from {m.group(1)}, snippet "
                                     f"{m.group(2)} (copy it from there)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--build", help="the build folder (test counts)")
    parser.add_argument("--ctest", default="ctest")
    parser.add_argument("--configuration", default="", help="the build's configuration")
    parser.add_argument("--bin", action="append", default=[], help="NAME=PATH of a program")
    parser.add_argument("--programs", default="",
                        help="comma-separated names of every program the docs may name")
    # CMake passes an empty argument for a program it does not build.
    parser.add_argument("empty", nargs="*", help=argparse.SUPPRESS)
    # CMake passes an empty argument for each --bin whose target this build has not (a build
    # without examples or benchmarks, e.g. the sanitizer passes).
    args = parser.parse_args([a for a in sys.argv[1:] if a])
    root = os.path.abspath(args.root)
    bins = dict(b.split("=", 1) for b in args.bin if "=" in b and b.split("=", 1)[1])
    programs = sorted(set(filter(None, args.programs.split(","))) | set(bins))

    docs = load_docs(root)
    check_links(root, docs, programs)
    check_keys(root, docs)
    if programs:
        check_flags(docs, bins, programs)
    check_figures(root, docs)
    check_counts(root, docs, args.build, args.ctest, args.configuration)
    check_outputs(root, docs, bins)
    check_snippets(root, docs)
    for f in failures:
        print(f)
    print(f"check_docs: {len(docs)} files, {len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
