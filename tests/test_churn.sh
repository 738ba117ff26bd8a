#!/bin/bash
# Learner churn: start 2 learners, add 2 mid-run, SIGTERM one (it pushes what
# it has, says Bye, exits 0), SIGKILL another (declared dead by liveness).
# The synchronizer is never restarted; merges continue through every change;
# the global validation loss keeps falling.
set -u
TEST_NAME=churn
. "$(dirname "$0")/lib_cluster.sh"
make_corpus
start_sync sync --durability periodic $OUTER
EV="$W/events-sync.log"
v0=$(val_loss)
start_learner a --steps 100000000 --data_shard 0 --data_shards 4 --throttle 0.5; A=$LPID
start_learner b --steps 100000000 --data_shard 1 --data_shards 4 --throttle 0.5; Bp=$LPID
wait_until 60 '[ "$(merges)" -ge 20 ]' || die "no merges with 2 learners"
m1=$(merges); v1=$(val_loss); echo "phase 1 (2 learners): $m1 merges, global val loss $v0 -> $v1"

start_learner c --steps 100000000 --data_shard 2 --data_shards 4 --throttle 0.5; Cp=$LPID
start_learner d --steps 100000000 --data_shard 3 --data_shards 4 --throttle 0.5; D=$LPID
wait_until 60 "ev_has '$EV' learner_join id=c && ev_has '$EV' learner_join id=d" || die "new learners did not join"
wait_until 60 "[ \$(\"$DLOCO\" records \"$W/store\" | awk '\$3 == \"c\" || \$3 == \"d\"' | wc -l) -ge 4 ]" \
  || die "the new learners' pushes were not merged"
m2=$(merges); echo "phase 2 (4 learners): joiners fetched the global model and contributed; $m2 merges"
check "joiners started from the global model (fetched every fragment)" ev_has "$W/events-c.log" ready fragments=4

kill -TERM "$Cp"
wait_pid 60 "$Cp"; rc=$?
check "SIGTERM: learner c exits 0 (rc=$rc)" [ "$rc" = 0 ]
check "learner c said bye with reason 'signal'" ev_has "$EV" learner_bye id=c reason=signal
check "learner c flushed its progress before leaving (every flushed push answered)" \
  ev_has "$W/events-c.log" learner_summary flush_unanswered=0 exit_code=0
kill -KILL "$D"; wait "$D" 2>/dev/null
ev_wait 30 "$EV" learner_dead id=d && echo "ok: SIGKILLed learner d declared dead by liveness" \
  || { echo "FAIL: learner d never declared dead"; fail=1; }
m3=$(merges)
wait_until 60 "[ \$(merges) -ge $((m3 + 20)) ]" || die "merges stopped after the churn"
m4=$(merges); v4=$(val_loss)
echo "phase 3 (after bye + kill): merges $m3 -> $m4, global val loss $v1 -> $v4"
check "merges continued through every change ($m1 < $m2 < $m4)" [ "$m1" -lt "$m2" -a "$m2" -lt "$m4" ]
check "global val loss still falling ($v0 -> $v1 -> $v4)" python3 -c "import sys; sys.exit(0 if $v4 < $v1 < $v0 else 1)"
check "the synchronizer was never restarted (one epoch)" \
  [ "$(ev_count "$EV" sync_start)" = 1 -a "$(ev_count "$EV" sync_start epoch=1 resumed=0)" = 1 ]
kill -TERM "$A" "$Bp"; wait_pid 60 "$A"; wait_pid 60 "$Bp"
stop_sync
check "dloco check" quietly "$DLOCO" check "$W/store"
[ $fail = 0 ] && echo "test_churn: all checks passed" || echo "test_churn: FAILED"
exit $fail
