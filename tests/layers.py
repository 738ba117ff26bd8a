#!/usr/bin/python3
"""The layer rules of docs/ARCHITECTURE.md, checked on the tree and the build.

Usage: tests/layers.py folders|learner [BUILD_DIR]   (BUILD_DIR default $DLOCO_BIN or build)
  folders  every '#include "X/..."' in a folder's sources names a folder its row of
           MAY_INCLUDE allows (a file of FILE_MAY_INCLUDE: its own, narrower row)
  learner  dloco-sync and dloco include nothing from learner/ (the gcc depfiles of every
           object their link line pulls in: their own and each static library's) and link
           nothing from it (no learner/ library or object on the link line)
Exits 0 when the rules hold, 1 with one line per breach (file and what it includes).
"""
import os
import re
import sys

SRC = os.path.realpath(os.environ.get("DLOCO_SRC") or os.path.join(os.path.dirname(__file__), ".."))

# The GPT trainer (model, data, trainer, checkpoints, evaluation, dloco-learner): the synchronizer
# and dloco may use it for evaluation and export; none of them may use learner/.
TRAINER = "gpt"
T = [TRAINER]

# The rules as data: which top-level folders a folder's sources may include (itself always).
# Lower layers first; no folder includes one listed after it, except where the row says so.
MAY_INCLUDE = {
    "core": [],
    "kernels": ["core"],
    "proto": ["core"],
    "storage": ["core"],
    "include": [],
    # the GPT trainer: its model, data and checkpoints, and dloco-learner on the learner API
    TRAINER: ["core", "kernels", "proto", "storage", "include", "learner"],
    # the learner library (API, mailbox, sessions, node): no model code
    "learner": ["core", "kernels", "proto", "storage", "include"],
    # synchronizer and learner meet only on the wire; evaluation and --init_from use the trainer
    "synchronizer": ["core", "kernels", "proto", "storage"] + T,
    # dloco: check, status, eval, export (the trainer for eval), keygen (proto)
    "tools": ["core", "kernels", "proto", "storage", "synchronizer"] + T,
    # dloco-sim links the synchronizer's policy and round code (its point); nothing of the learner
    "chaos": ["core", "kernels", "proto", "storage", "synchronizer"],
    # benchmarks drive any layer, and the reference hash of tests/
    "bench": ["core", "kernels", "proto", "storage", "learner", "synchronizer", "tests", "include"] + T,
    "examples": ["include"],
    "tests": None,  # tests may include anything
    "deploy": None,
    "python": None,
}
# Files held to less than their folder's row: one implementation of a learner (issue 26), so the swarm's
# simulated learners go through the public API (include/dloco/learner.h), never the library's internals.
FILE_MAY_INCLUDE = {
    "bench/swarm.c": ["core", "include"],
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/[^"]+"', re.M)
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")


def sources(folder):
    for root, dirs, files in os.walk(os.path.join(SRC, folder)):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "corpus")]
        for f in files:
            if f.endswith(SOURCE_EXT):
                yield os.path.join(root, f)


def folder_breaches():
    """(folder, included folder, file, line) for every include a row does not allow."""
    out = []
    top = [d for d in sorted(os.listdir(SRC)) if os.path.isdir(os.path.join(SRC, d)) and not d.startswith(".")
           and not d.startswith("build")]
    for folder in top:
        srcs = list(sources(folder))
        if not srcs:
            continue
        if folder not in MAY_INCLUDE:
            out.append((folder, "?", folder, f"folder {folder}/ has no row in MAY_INCLUDE (tests/layers.py): "
                        "add one saying which folders it may include"))
            continue
        if MAY_INCLUDE[folder] is None:
            continue
        for path in srcs:
            allowed = FILE_MAY_INCLUDE.get(os.path.relpath(path, SRC), MAY_INCLUDE[folder])
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            for m in INCLUDE.finditer(text):
                inc = m.group(1)
                if inc == folder or inc in allowed or not os.path.isdir(os.path.join(SRC, inc)):
                    continue
                line = text.count("\n", 0, m.start()) + 1
                out.append((folder, inc, os.path.relpath(path, SRC), f"line {line}: {m.group(0).strip()}"))
    return out


def link_inputs(build, target_dir, target):
    """The object files and static libraries of TARGET's link line (CMake's link.txt)."""
    d = os.path.join(build, target_dir)
    link = os.path.join(d, "CMakeFiles", target + ".dir", "link.txt")
    if not os.path.isfile(link):
        sys.exit(f"layers: no {link}: build {target} first (cmake --build {build} --target {target})")
    with open(link) as f:
        words = f.read().split()
    objs, libs = [], []
    for w in words:
        w = w.strip('"')
        if w.endswith(".o"):
            objs.append(os.path.normpath(os.path.join(d, w)))
        elif w.endswith(".a") and not w.startswith("/usr/"):
            libs.append(os.path.normpath(os.path.join(d, w)))
    return objs, libs


def lib_objects(lib):
    """A static library libNAME.a of this build -> its objects' directory CMakeFiles/NAME.dir."""
    name = os.path.basename(lib)[3:-2]
    return os.path.join(os.path.dirname(lib), "CMakeFiles", name + ".dir")


def depfile_headers(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read().replace("\\\n", " ")
    return [w for w in text.split() if not w.endswith(":")]


def target_breaches(build):
    out = []
    learner_src = os.path.join(SRC, "learner") + os.sep
    learner_bin = os.path.realpath(os.path.join(build, "learner")) + os.sep
    for target_dir, target in (("synchronizer", "dloco-sync"), ("tools", "dloco")):
        objs, libs = link_inputs(build, target_dir, target)
        depfiles = [o + ".d" for o in objs]
        for lib in libs:
            if os.path.realpath(lib).startswith(learner_bin):
                out.append((target, "learner", os.path.relpath(lib, build), "links this learner/ library"))
                continue  # its objects are learner/'s own: the link says it
            for root, _, files in os.walk(lib_objects(lib)):
                depfiles += [os.path.join(root, f) for f in files if f.endswith(".o.d")]
        seen = set()
        for dep in depfiles:
            if not os.path.isfile(dep):
                continue
            for h in depfile_headers(dep):
                h = os.path.realpath(h if os.path.isabs(h) else os.path.join(build, h))
                if h.startswith(learner_src) and (dep, h) not in seen:
                    seen.add((dep, h))
                    out.append((target, "learner", os.path.relpath(dep, build),
                                "includes " + os.path.relpath(h, SRC)))
    return out


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("folders", "learner"):
        print(__doc__.strip())
        return 2
    mode = sys.argv[1]
    build = os.path.realpath(sys.argv[2] if len(sys.argv) > 2 else os.environ.get("DLOCO_BIN", "build"))
    bad = []
    for folder, inc, where, what in folder_breaches():
        if mode == "folders":
            bad.append(f"{folder}/ may not include {inc}/: {where} {what}")
    if mode == "learner":
        for target, _, where, what in target_breaches(build):
            bad.append(f"{target}: {where} {what}")
    for b in bad:
        print("FAIL: " + b)
    if bad:
        print(f"layers {mode}: {len(bad)} breach(es) of the layer rules (docs/ARCHITECTURE.md, table in tests/layers.py)")
        return 1
    print(f"layers {mode}: the rules hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
