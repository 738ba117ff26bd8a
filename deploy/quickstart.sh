#!/bin/bash
# The main job: set up, build, and train the GPT on the bundled corpus (the
# Debian `fortunes` text, ~2.5 MB), printing progress and a summary.
# Usage: deploy/quickstart.sh [extra dloco-learner flags, e.g. --steps 300]
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target dloco-learner
mkdir -p runs
exec "$BUILD_DIR"/learner/dloco-learner --standalone --config deploy/quickstart.ini \
  --checkpoint runs/quickstart.ckpt "$@"
