#!/bin/bash
# The chaos harness on its CI scenario (chaos/scenarios/ci.ini): about two
# minutes of real dloco-sync and dloco-learner processes with every fault
# kind. Asserts on the harness's and the products' events (docs/CHAOS.md,
# docs/EVENTS.md): the run completes, every fault of the timeline was
# applied, the push ledger balances in every synchronizer incarnation that
# exited cleanly, `dloco check` passes on the store, the goodput buckets sum
# to 1, and the report files exist. As root the datacenters are network
# namespaces with tbf links; otherwise loopback with the relay (it says so).
set -u
TEST_NAME=chaos
. "$(dirname "$0")/lib_cluster.sh"
SRC=${DLOCO_SRC:-.}
CHAOS=$B/chaos/dloco-chaos
[ -x "$CHAOS" ] || die "no $CHAOS"
OUT="$W/out"
timeout -k 10 420 "$CHAOS" run "$SRC/chaos/scenarios/ci.ini" --out "$OUT" > "$W/chaos.log" 2>&1
rc=$?
grep -E "^\[chaos|^dloco-chaos" "$W/chaos.log" | grep -vE "\| faults" | tail -40
check "dloco-chaos run exited 0 (rc $rc)" [ "$rc" = 0 ]
R="$OUT/decoupled"
E="$R/events-chaos.log"
[ -s "$E" ] || die "no harness events"
check "the run ended (run_end)" ev_has "$E" run_end
# once (2026-12-04, a fresh clone's CI) the second incarnation stopped answering between the EIO and the ENOSPC
# fault and ignored SIGTERM; the harness now saves its threads' stacks before the SIGKILL (printed below)
check "the synchronizer stopped on SIGTERM at the end (no sync_unstoppable)" [ "$(ev_count "$E" sync_unstoppable)" = 0 ]
# every fault of the timeline: a begin or an instant event that was not a skip
planned=$(tail -n +2 "$OUT/timeline.tsv" | wc -l)
missing=""
while IFS=$'\t' read -r n at kind target dur value src; do
  [ "$n" = n ] && continue
  got=$(ev_field "$E" fault detail "n=$n" "phase~^(begin|instant)$" | grep -vc '^skipped' || true)
  [ "$got" -ge 1 ] || missing="$missing $n:$kind"
  [ "$dur" = "0.000" ] || ev_has "$E" fault "n=$n" phase=end || missing="$missing $n:$kind(end)"
done < "$OUT/timeline.tsv"
check "all $planned faults of the timeline were applied and undone${missing:+ (missing:$missing)}" [ -z "$missing" ]
kinds=$(ev_field "$E" fault kind phase~'^(begin|instant)$' | sort -u | tr '\n' ' ')
echo "fault kinds applied: $kinds"
check "every fault kind ran ($(echo $kinds | wc -w) of 18)" [ "$(echo $kinds | wc -w)" = 18 ]
# the synchronizer was killed and restarted; the ledger balances in every
# incarnation that exited cleanly (a SIGKILLed one writes none)
SE="$R/events-sync.log"
check "the synchronizer ran in more than one incarnation" [ "$(ev_count "$SE" sync_start)" -ge 2 ]
nl=$(ev_count "$SE" ledger)
# overclaim: tokens pushes claimed beyond what the learner reported processing. Small ones (1024-2048 here)
# were seen about once in 15 runs before restarted learners' unreported progress was counted at their Hello
# (ledger.h, `ledger_carried late`); none in the runs since, and test_balance asserts 0. Up to 2048 is still
# reported, not failed, until CI has shown none for a while; anything larger, or any other imbalance, fails
bad=$(ev_field "$SE" ledger "applied dropped_stale rejected lost discarded outstanding processed carried_in pooled carried overclaim" |
  awk '{ if ($1+$2+$3+$4+$5+$6 != $7+$8+$11 || $9 != 0 || $10 != 0 || $11 > 2048) print }')
oc=$(ev_field "$SE" ledger overclaim | awk '$1 > 0' | tr '\n' ' ')
[ -z "$oc" ] || echo "WARN: ledger overclaim of $oc tokens (the open race of issue 27)"
check "the push ledger balances in each of the $nl clean incarnations${bad:+ (unbalanced: $bad)}" [ "$nl" -ge 1 -a -z "$bad" ]
check "dloco check passed on the store after the run" ev_has "$E" check ok=1
check "dloco check agrees now" quietly "$DLOCO" check "$R/store"
check "merges were committed" [ "$(ev_count "$SE" merge)" -gt 10 ]
# the faults' effects, seen by the products themselves
check "the disk faults reached the store: commits failed with EIO" \
  ev_has "$SE" merge_failed "reason~Input/output error"
check "... and with ENOSPC" ev_has "$SE" merge_failed "reason~No space left on device"
check "the partitioned and the killed learners were declared dead" [ "$(ev_count "$SE" learner_dead)" -ge 2 ]
check "the churned-in learner joined (the synchronizer welcomed b1-j1)" ev_has "$SE" learner_join id=b1-j1
check "the rogue client's garbage was refused, the synchronizer stayed up" \
  [ "$(ev_field "$SE" sync_summary refused_msgs | awk '{s += $1} END {print s + 0}')" -gt 0 ]
# the report
for f in report.md report.json; do check "$f written" [ -s "$OUT/$f" ]; done
if command -v gnuplot > /dev/null; then
  check "plots written (loss, goodput, timeline, links, staleness)" \
    [ "$(ls "$OUT"/plots/*.svg 2> /dev/null | wc -l)" -ge 5 ]
fi
read -r gp bound sum <<< "$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
print(r["goodput"], r["availability_bound"], sum(r["time"]["fractions"].values()))' "$OUT/report.json")"
echo "goodput $gp, availability bound $bound, buckets sum to $sum"
check "goodput and badput buckets sum to 1 ($sum)" python3 -c "import sys; sys.exit(abs($sum - 1) > 1e-6)"
check "goodput is positive and under the availability bound ($gp <= $bound)" \
  python3 -c "import sys; sys.exit(not (0 < $gp <= $bound <= 1))"
check "the synchronizer's own evaluations are in the report (sync_eval)" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
sys.exit(not (len(r["sync_eval"]) >= 1 and r["final_sync_val_loss"] > 0))' "$OUT/report.json"
[ $fail = 0 ] && echo "test_chaos: all checks passed" || {
  echo "test_chaos: FAILED"
  tail -30 "$W/chaos.log"
  [ -s "$R/sync-stacks.txt" ] && { echo "== the synchronizer's threads ($R/sync-stacks.txt)"; grep -E '^Thread|^#' "$R/sync-stacks.txt" | head -150; }
  [ -s "$R/sync.log" ] && { echo "== $R/sync.log (last 40 lines)"; tail -40 "$R/sync.log"; }
}
exit $fail
