#!/bin/bash
# The crash loop at length: SIGKILL the synchronizer CRASHES times (default
# 100) at seeded random moments while 3 learners train; every check of
# tests/test_crashloop.sh after each crash, and zero acknowledged merges lost.
# Usage: bench/crashloop.sh [crashes] [seed]   (BUILD_DIR=build)
set -euo pipefail
. "$(dirname "$0")/../tests/lib_args.sh"
dl_args 2 "$@"
if [ $# -ge 1 ]; then dl_args_number crashes "$1"; fi
if [ $# -ge 2 ]; then dl_args_number seed "$2"; fi
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake --build "$BUILD_DIR" -j"$(nproc)" --target dloco-sync dloco-learner dloco >/dev/null
CRASHES=${1:-100} SEED=${2:-4242} DLOCO_BIN=$BUILD_DIR exec bash tests/test_crashloop.sh
