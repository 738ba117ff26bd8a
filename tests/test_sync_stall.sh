#!/bin/bash
# The synchronizer's own stall is not the learners' silence: dloco-sync is
# SIGSTOPped for about 4 x liveness x heartbeat_ms (1.2 s here) with two live
# learners, then continued. It reports its stall (event sync_stall, counter
# dloco_sync_loop_stalls_total), declares nobody dead (no learner_dead: the
# learners' messages were waiting in its socket), and merges go on. The
# stop's length is the stimulus; every check waits on events.
set -u
TEST_NAME=sync_stall
. "$(dirname "$0")/lib_cluster.sh"
STOP_S=${STOP_S:-5}
make_corpus
start_sync sync --liveness 6
S=$W/events-sync.log
for i in 0 1; do start_learner "s$i" --steps 100000000 --data_shard $i --data_shards 2 --throttle 0.5; done
wait_until 60 '[ "$(merges)" -ge 8 ]' || die "no merges before the stall"
wait_until 20 "ev_has $S learner_join id=s0 && ev_has $S learner_join id=s1" || die "the learners did not join"
ev_has "$S" learner_dead && die "a learner was declared dead before the stall (a loaded machine?)"
kill -STOP "$SPID"
wait_until 10 "[ \"\$(awk '{print \$3}' /proc/$SPID/stat)\" = T ]" || die "the synchronizer did not stop on SIGSTOP"
sleep "$STOP_S" # the stimulus: how long the synchronizer stays stopped
m0=$(merges)
kill -CONT "$SPID"
ev_wait 20 "$S" sync_stall || die "no sync_stall event after the stop"
echo "stall seen: gap_ms=$(ev_last "$S" sync_stall gap_ms)"
wait_until 60 "[ \$(merges) -ge $((m0 + 8)) ]" || { echo "FAIL: merges did not resume"; fail=1; }
check "nobody was declared dead for the synchronizer's own stall ($(ev_count "$S" learner_dead) learner_dead events)" \
  [ "$(ev_count "$S" learner_dead)" = 0 ]
stop_sync
read -r stalls <<< "$(ev_last "$S" sync_summary loop_stalls)"
check "the summary counts the stall (loop_stalls=$stalls)" [ "${stalls:-0}" -ge 1 ]
[ $fail = 0 ] && echo "test_sync_stall: all checks passed" || echo "test_sync_stall: FAILED"
exit $fail
