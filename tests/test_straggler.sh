#!/bin/bash
# Straggler: 3 fast learners and one throttled to 1/4 speed. Run twice, with
# and without the straggler, for the same number of fast-learner steps. The
# fast learners' merge cadence must not change: every fast push is merged
# (ACCEPTED) before the same learner's next push of that fragment would have
# replaced it in the pool, with or without the straggler, and nothing had to
# coalesce; the straggler's pushes are merged too, weighted by tokens.
# Times are printed for the record; the assertions are on counts.
set -u
TEST_NAME=straggler
. "$(dirname "$0")/lib_cluster.sh"
make_corpus
STEPS=${STEPS:-300}
run() { # label with_straggler
  rm -rf "$W/store"
  start_sync "sync-$1" --durability periodic --quorum 1 ${SYNC_EXTRA:-}
  local lp=() t0; t0=$(date +%s.%N)
  for i in 0 1 2; do start_learner "$1-f$i" --steps "$STEPS" --data_shard $i --data_shards 4 --throttle 0.2; lp+=($LPID); done
  if [ "$2" = 1 ]; then start_learner "$1-slow" --steps 100000000 --data_shard 3 --data_shards 4 --throttle 0.05; SLOW=$LPID; fi
  for p in "${lp[@]}"; do wait_pid 240 "$p" || die "fast learner failed"; done
  local t1; t1=$(date +%s.%N)
  if [ "$2" = 1 ]; then kill -TERM "$SLOW"; wait_pid 60 "$SLOW"; fi
  stop_sync
  FAST_WALL=$(python3 -c "print('%.1f' % ($t1 - $t0))")
  "$DLOCO" records "$W/store" > "$W/records-$1.txt"
}
summary_field() { ev_last "$W/events-$1.log" learner_summary "$2"; } # learner field

run base 0
run mixed 1
# A push that is still unanswered when the same learner pushes that fragment
# again is replaced in the pool (never ACCEPTED on its own) or has to coalesce:
# with a round waiting for the straggler, both counts would climb.
for i in 0 1 2; do
  line="f$i:"
  for r in base mixed; do
    n="$r-f$i"; pushes=$(summary_field "$n" pushes); acc=$(summary_field "$n" accepted); co=$(summary_field "$n" coalesced)
    line="$line $r pushes $pushes accepted $acc coalesced $co;"
    eval "${r}_acc=$acc ${r}_co=$co ${r}_pushes=$pushes"
  done
  echo "$line"
  [ "$mixed_acc" -ge $((mixed_pushes * 90 / 100)) ] || { echo "FAIL: f$i: only $mixed_acc of $mixed_pushes pushes merged with the straggler"; fail=1; }
  [ "$mixed_acc" -ge $((base_acc - base_pushes / 20 - 2)) ] || { echo "FAIL: f$i merged $mixed_acc pushes with the straggler, $base_acc without"; fail=1; }
  [ "$mixed_co" -le $((base_co + 2)) ] || { echo "FAIL: f$i coalesced $mixed_co pushes with the straggler, $base_co without"; fail=1; }
done
slow_pushes=$(summary_field mixed-slow pushes); slow_merged=$(awk '$3 == "mixed-slow" && $4 == "merged"' "$W/records-mixed.txt" | wc -l)
slow_stale=$(awk '$3 == "mixed-slow" && $4 == "merged" { s += $5; n++ } END { if (n) printf "%.2f", s / n; else print "-" }' "$W/records-mixed.txt")
fast_stale=$(awk '$3 ~ /mixed-f/ && $4 == "merged" { s += $5; n++ } END { if (n) printf "%.2f", s / n; else print "-" }' "$W/records-mixed.txt")
echo "straggler: $slow_pushes pushes, $slow_merged merged, mean staleness $slow_stale (fast learners: $fast_stale)"
check "the straggler's pushes are merged" [ "$slow_merged" -gt 0 ]
echo "measured (not asserted): fast learners' wall time for $STEPS steps"
echo "  without straggler: $(for i in 0 1 2; do summary_field "base-f$i" wall_s; done | tr '\n' ' ')s"
echo "  with straggler:    $(for i in 0 1 2; do summary_field "mixed-f$i" wall_s; done | tr '\n' ' ')s"
[ $fail = 0 ] && echo "test_straggler: all checks passed" || echo "test_straggler: FAILED"
exit $fail
