#!/bin/bash
# The push ledger balances on a real cluster: 3 learners (k1 adopts by
# overwrite, throwing away what it trained after each push; the others keep
# it) with max_staleness 0, so pushes are dropped stale and learners rebase;
# one learner is SIGKILLed; the others leave with SIGTERM (final flush + Bye);
# the synchronizer stops last. Every fragment-token the learners report
# processing must end in exactly one state, none counted twice.
set -u
TEST_NAME=balance
. "$(dirname "$0")/lib_cluster.sh"
make_corpus
start_sync sync --durability periodic $OUTER --max_staleness 0
EV="$W/events-sync.log"
NAMES=(k0 k1 k2); LP=()
ADOPT=(keep overwrite keep)
for i in 0 1 2; do
  start_learner "${NAMES[$i]}" --steps 100000000 --data_shard $i --data_shards 3 --adopt "${ADOPT[$i]}" --throttle 0.5
  LP+=("$LPID")
done
wait_until 90 '[ "$(merges)" -ge 20 ]' || die "no merges"
ev_wait 60 "$EV" push decision=dropped_stale || die "no push was dropped stale (no rebase)"
kill -KILL "${LP[2]}"; wait "${LP[2]}" 2>/dev/null
ev_wait 30 "$EV" learner_dead id=k2 || die "k2 was not declared dead"
m=$(merges)
wait_until 60 "[ \$(merges) -ge $((m + 10)) ]" || die "merges stopped after the kill"
kill -TERM "${LP[0]}" "${LP[1]}"
wait_pid 60 "${LP[0]}"; wait_pid 60 "${LP[1]}"
stop_sync

# What the learners report processing: the survivors' own summaries, and for
# the killed one its last report as the synchronizer saw it.
P=4
t0=$(ev_last "$W/events-k0.log" learner_summary tokens)
t1=$(ev_last "$W/events-k1.log" learner_summary tokens)
t2=$(ev_last "$EV" sync_learner tokens id=k2)
[ -n "$t0" ] && [ -n "$t1" ] && [ -n "$t2" ] || die "missing token reports (k0 '$t0' k1 '$t1' k2 '$t2')"
reported=$(( (t0 + t1 + t2) * P ))
read -r applied dropped rejected lost discarded outstanding pooled carried processed over < <(
  ev_field "$EV" ledger "applied dropped_stale rejected lost discarded outstanding pooled carried processed overclaim" | tail -n 1)
[ -n "${over:-}" ] || die "no ledger event at shutdown"
sum=$((applied + dropped + rejected + lost + discarded + outstanding))
echo "ledger (fragment-tokens): applied $applied dropped_stale $dropped rejected $rejected lost $lost" \
     "discarded $discarded outstanding $outstanding | processed $processed, learners report $reported"
check "the synchronizer heard of every token the learners report ($processed = $reported)" [ "$processed" = "$reported" ]
check "every token ends in exactly one state (sum $sum = $processed)" [ "$sum" = "$processed" ]
check "no push claimed tokens its learner had not processed: nothing counted twice (overclaim $over)" [ "$over" = 0 ]
check "nothing is left pooled or carried at the end (pooled $pooled, carried $carried)" [ "$pooled" = 0 -a "$carried" = 0 ]
check "pushes were merged and dropped stale (applied $applied, dropped_stale $dropped)" [ "$applied" -gt 0 -a "$dropped" -gt 0 ]
check "the killed learner's unpushed tokens are lost ($lost > 0)" [ "$lost" -gt 0 ]
check "the overwriting learner reported what it discarded ($discarded > 0)" [ "$discarded" -gt 0 ]
check "applied equals the tokens of every merged contribution in the merge events" \
  [ "$applied" = "$(ev_field "$EV" merge tokens | awk '{s += $1} END {print s + 0}')" ]
csec=$(ev_field "$EV" merge compute_s | awk '{s += $1} END {printf "%.3f", s}')
check "merged pushes carry their learners' compute time (${csec} s, time goodput's numerator)" \
  awk -v s="$csec" 'BEGIN {exit !(s > 0)}'
# merge_contrib: one line per merged push; each value is rounded to 1e-6, so
# the two sums may differ by half of that per line
read -r ccsec cn <<< "$(ev_field "$EV" merge_contrib compute_s | awk '{s += $1; n++} END {printf "%.6f %d", s, n}')"
read -r msec mn <<< "$(ev_field "$EV" merge compute_s | awk '{s += $1; n++} END {printf "%.6f %d", s, n}')"
check "the merge_contrib lines carry the merges' compute time ($ccsec s over $cn contributions = $msec s over $mn merges)" \
  awk -v a="$ccsec" -v b="$msec" -v n="$((cn + mn))" 'BEGIN {d = a - b; if (d < 0) d = -d; exit !(n > 0 && a > 0 && d <= 1e-6 * n)}'
check "the merge_contrib lines carry the merges' tokens and contributions" \
  [ "$(ev_field "$EV" merge_contrib tokens | awk '{s += $1} END {print s + 0}')" = "$applied" -a \
    "$cn" = "$(ev_field "$EV" merge n | awk '{s += $1} END {print s + 0}')" ]
line=$("$DLOCO" check "$W/store" | sed -n 's/^ *ledger fragment-tokens: //p')
want="applied $applied, dropped_stale $dropped, rejected $rejected, lost $lost, discarded $discarded, outstanding $outstanding"
check "the store persisted the same totals ($line)" [ "$line" = "$want" ]
[ $fail = 0 ] && echo "test_balance: all checks passed" || echo "test_balance: FAILED"
exit $fail
