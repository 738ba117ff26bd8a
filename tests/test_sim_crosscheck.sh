#!/bin/bash
# dloco-chaos (real processes) vs dloco-sim on the same scenario
# (chaos/scenarios/crosscheck.ini: 3 learners, 75 s, learner a1 killed at
# 30 s for 10 s). The chaos run's timings (start-up, restart, step compute and
# wall time, commit and Update latency) are measured from its events by
# tests/sim_measure.py and given to dloco-sim in a [sim] section appended to
# a copy of the INI; everything else (learners, H, fragments, quorum,
# staleness, liveness, the kill) the sim reads from the file itself. Asserts
# on report.json and the sim's --json: goodput within 0.03 and the down bucket
# (the kill) within 0.01 of each other. Why 0.03: the sim uses medians of the
# measured timings, drops the merges of the final flush that dloco-chaos
# counts (up to one fragment period, ~0.6 s of 75 s, per learner) and the
# real kill's lost progress is up to one period too: about 2 points of
# edges, plus run-to-run jitter on a loaded machine. About 90 s.
set -u
TEST_NAME=sim_crosscheck
. "$(dirname "$0")/lib_cluster.sh"
SRC=${DLOCO_SRC:-.}
CHAOS=$B/chaos/dloco-chaos SIMB=$B/chaos/dloco-sim
[ -x "$CHAOS" ] && [ -x "$SIMB" ] || die "no $CHAOS or $SIMB"
INI="$SRC/chaos/scenarios/crosscheck.ini"
OUT="$W/out"
timeout -k 10 240 "$CHAOS" run "$INI" --out "$OUT" > "$W/chaos.log" 2>&1
rc=$?
check "dloco-chaos run exited 0 (rc $rc)" [ "$rc" = 0 ]
[ -s "$OUT/report.json" ] || die "no report.json"
python3 "$SRC/tests/sim_measure.py" "$OUT" 0.5 > "$W/measured.txt" || die "measuring the chaos run failed"
cat "$W/measured.txt"
{ cat "$INI"; echo "[sim]"; grep ' = ' "$W/measured.txt"; } > "$W/sim.ini"
timeout -k 5 60 "$SIMB" run "$W/sim.ini" --json "$W/sim.json" > "$W/sim.log" 2>&1
rc=$?
head -3 "$W/sim.log"
check "dloco-sim run exited 0 (rc $rc)" [ "$rc" = 0 ]
read -r cg sg cd sd <<< "$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
s = json.load(open(sys.argv[2]))
print(r["goodput"], s["goodput"], r["time"]["fractions"]["down"], s["buckets"]["down"])' "$OUT/report.json" "$W/sim.json")"
echo "goodput: dloco-chaos $cg, dloco-sim $sg; down: $cd vs $sd"
check "the kill was applied (a1 ran in 2 incarnations)" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
sys.exit(not [l for l in r["learners"] if l["id"] == "a1" and l["incarnations"] == 2])' "$OUT/report.json"
check "goodput agrees within 0.03 ($cg vs $sg)" python3 -c "import sys; sys.exit(not abs($cg - $sg) <= 0.03)"
check "the down bucket agrees within 0.01 ($cd vs $sd)" python3 -c "import sys; sys.exit(not abs($cd - $sd) <= 0.01)"
[ $fail = 0 ] && echo "test_sim_crosscheck: all checks passed" || { echo "test_sim_crosscheck: FAILED"; tail -20 "$W/chaos.log"; }
exit $fail
