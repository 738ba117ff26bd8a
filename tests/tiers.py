#!/usr/bin/python3
"""Every CTest of the build is in exactly one tier, bounded, with one OpenMP thread.

Usage: tests/tiers.py [BUILD_DIR]   (default $DLOCO_BIN or build)
Reads `ctest --show-only=json-v1` of the build and checks each test has exactly one
tier label (unit, integration, fuzz: tests/README.md), a TIMEOUT, and OMP_NUM_THREADS
in its environment (the suite runs tests in parallel on 2 cores). A test registered
with a bare add_test fails here with the fix: dl_add_test / dl_add_script_test
(CMakeLists.txt). Exits 0 when all hold, 1 with one line per test that breaks a rule.
"""
import json
import os
import subprocess
import sys

TIERS = ("unit", "integration", "fuzz")


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DLOCO_BIN", "build")
    out = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"], capture_output=True, text=True)
    if out.returncode:
        print(f"FAIL: ctest --show-only=json-v1 in {build}: {out.stderr.strip()}")
        return 1
    tests = json.loads(out.stdout).get("tests", [])
    bad = []
    count = {t: 0 for t in TIERS}
    for t in tests:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        labels = props.get("LABELS", [])
        tiers = [x for x in labels if x in TIERS]
        env = props.get("ENVIRONMENT", [])
        name = t["name"]
        fix = "register it with dl_add_test or dl_add_script_test (CMakeLists.txt, tests/README.md)"
        if len(tiers) != 1:
            bad.append(f"{name}: tier labels {tiers or 'none'} (want exactly one of {', '.join(TIERS)}): {fix}")
        else:
            count[tiers[0]] += 1
        if not props.get("TIMEOUT"):
            bad.append(f"{name}: no TIMEOUT: {fix}")
        if not any(e.startswith("OMP_NUM_THREADS=") for e in env):
            bad.append(f"{name}: no OMP_NUM_THREADS in its environment: {fix}")
    for b in bad:
        print("FAIL: " + b)
    print(f"tiers: {len(tests)} tests: " + ", ".join(f"{count[t]} {t}" for t in TIERS))
    return 1 if bad or not tests else 0


if __name__ == "__main__":
    sys.exit(main())
