#!/bin/bash
# The main job: set up, build, and run a local cluster — one synchronizer and
# 4 learners on loopback — training one GPT on the bundled corpus (the text of
# Debian's `fortunes` package, ~2.5 MB). Ends with a summary: final global
# validation loss, merges, mean staleness, bytes per learner.
# Usage: deploy/quickstart.sh [local_cluster.sh options, e.g. --steps 100 --learners 2]
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h | --help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; echo; deploy/local_cluster.sh --help; exit 0 ;;
esac
deploy/local_cluster.sh --check-args "$@" || exit 2 # before anything is installed or built
deploy/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target dloco-sync dloco-learner dloco dloco-chaos
exec deploy/local_cluster.sh --store runs/quickstart.lmdb "$@"
