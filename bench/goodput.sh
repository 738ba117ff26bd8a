#!/bin/bash
# Goodput under failures (not a test): the scenario chaos/scenarios/goodput.ini
# (8 learners in 2 datacenters, one behind a ~5 Mbit/s, 60 ms link; ~10
# minutes of random learner kills with an availability bound near 90%, one
# half-speed learner, one datacenter partitioned for 60 s, one synchronizer
# kill) once per policy with the same seed and timeline, plus a failure-free
# twin of decoupled. Prints goodput and final loss per policy and, last line,
#   goodput_decoupled_over_bound: X.XX
# Bars: decoupled >= 0.95 of the availability bound; sync-elastic and sync
# lower, in the same run; decoupled's final validation loss within 3% of its
# failure-free twin. About 45 minutes (4 runs of 10 minutes, plus set-up).
# Usage: bench/goodput.sh [OUT_DIR]   (env: GOODPUT_DURATION_S to shorten a try,
#        GOODPUT_POLICIES=decoupled,sync-elastic,sync)
set -euo pipefail
. "$(dirname "$0")/../tests/lib_args.sh"
dl_args 1 "$@"
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
OUT=${1:-runs/goodput-$(date +%Y%m%d-%H%M%S)}
deploy/setup.sh > /dev/null
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target dloco-chaos dloco-sync dloco-learner dloco > /dev/null
args=()
[ -n "${GOODPUT_DURATION_S:-}" ] && args+=(--duration_s "$GOODPUT_DURATION_S")
"$BUILD_DIR"/chaos/dloco-chaos run chaos/scenarios/goodput.ini --out "$OUT" \
  --compare "${GOODPUT_POLICIES:-decoupled,sync-elastic,sync}" --baseline=decoupled "${args[@]}" | grep -v "| faults"
python3 - "$OUT/report.json" << 'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
runs = {r["label"]: r for r in rep["runs"]}
print("%-20s %8s %8s %10s %10s %8s" % ("run", "goodput", "bound", "gp/bound", "val loss", "merges"))
for label, r in runs.items():
    print("%-20s %8.3f %8.3f %10.3f %10s %8d" % (label, r["goodput"], r["availability_bound"], r["goodput_over_bound"],
          "%.4f" % r["final_val_loss"] if r.get("final_val_loss") is not None else "-", r["merges"]))
d = runs["decoupled"]
ratio = d["goodput_over_bound"]
lower = all(runs[p]["goodput"] < d["goodput"] for p in ("sync-elastic", "sync") if p in runs)
cost = None
if "decoupled-baseline" in runs and runs["decoupled"].get("final_val_loss") and runs["decoupled-baseline"].get("final_val_loss"):
    cost = runs["decoupled"]["final_val_loss"] / runs["decoupled-baseline"]["final_val_loss"] - 1
print("bar goodput_decoupled_over_bound >= 0.95: %s (%.3f)" % ("met" if ratio >= 0.95 else "NOT met", ratio))
print("bar sync-elastic and sync lower than decoupled: %s" % ("met" if lower else "NOT met"))
print("bar decoupled loss within 3%% of its failure-free twin: %s" %
      ("-" if cost is None else ("met" if cost <= 0.03 else "NOT met") + " (%+.2f%%)" % (100 * cost)))
print("report: %s" % sys.argv[1].replace("report.json", "report.md"))
print("goodput_decoupled_over_bound: %.2f" % ratio)
PY
