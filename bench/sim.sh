#!/bin/bash
# The Decoupled DiLoCo goodput study on dloco-sim (docs/SIM.md), not a test:
# fits recovery_s on the paper's data-parallel row and resize_s on its
# elastic data-parallel row (repair_s = recovery_s, docs/SIM.md), predicts
# the M = 2, 4, 8, 16 rows on the real merge policy, prints the table beside the paper's with per-cell
# differences, then the tuning sweep at 1.2M chips, M = 8 (quorum x
# grace_steps x max_staleness, goodput x quality proxy). Last line:
#   sim_vs_paper_max_diff_points: X      (bar: X <= 5)
# About 15 s on one core (seeded: the same figures every run).
# Usage: bench/sim.sh   (env: SIM_HORIZON_S, the M rows' horizon, default 86400; SIM_TUNE=0 skips the sweep)
set -euo pipefail
. "$(dirname "$0")/../tests/lib_args.sh"
dl_args 0 "$@"
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target dloco-sim > /dev/null
SIM="$BUILD_DIR/chaos/dloco-sim"
H=${SIM_HORIZON_S:-86400}
paper=$(mktemp)
trap 'rm -f "$paper"' EXIT
"$SIM" paper --horizon_s "$H" 2> >(grep -v '% of' >&2) > "$paper"
if [ "${SIM_TUNE:-1}" != 0 ]; then
  "$SIM" tune 2> >(grep -v '% of' >&2)
fi
grep -v '^sim_vs_paper_max_diff_points' "$paper"
grep '^sim_vs_paper_max_diff_points' "$paper"
