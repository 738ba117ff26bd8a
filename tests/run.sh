#!/bin/bash
# Set up, build and run every test; ends with ctest's summary.
# Usage: tests/run.sh [extra ctest args]   (BUILD_DIR=build by default;
# DLOCO_SANITIZE=ON for an ASan+UBSan build)
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DDLOCO_SANITIZE="${DLOCO_SANITIZE:-OFF}" >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
# Tests run one at a time: each already uses every core (OpenMP), and
# several processes spinning on 2 cores only slow each other down.
ctest --test-dir "$BUILD_DIR" --output-on-failure "$@"
