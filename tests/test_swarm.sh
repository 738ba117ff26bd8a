#!/bin/bash
# Smoke test of bench/swarm (the load generator of bench/sync_load.sh): 4
# simulated learners, handles of the public learner API (fake training), tiny
# model, 15 s against a real dloco-sync on loopback. Checks from the events
# files and the swarm's JSON summary (never log text): every learner joined
# and said Bye, merges happened, pushes were pooled and decided, merged
# Updates were adopted, no merge failed, no learner was declared dead, the swarm's own events time its pushes.
# Bounded: every wait has a deadline; only our own PIDs are killed.
set -u
TEST_NAME=swarm
. "$(dirname "$0")/lib_cluster.sh"
SWARM_BIN=$B/bench/swarm
[ -x "$SWARM_BIN" ] || die "$SWARM_BIN not built"
start_sync sync --durability periodic
EV="$W/events-sync.log"
"$SWARM_BIN" --endpoint "$EP" $MODEL --vocab 256 --fragments 4 --learners 4 --rate 8 --jitter 0.2 --duration 15 \
  --warmup 2 --json "$W/swarm.json" --events "$W/events-swarm.log" > "$W/swarm.log" 2>&1 &
SWP=$!; PIDS+=("$SWP")
wait_pid 90 "$SWP"; rc=$?
check "the swarm exits 0 (rc=$rc)" [ "$rc" = 0 ]
stop_sync

[ -f "$W/swarm.json" ] || die "no JSON summary from the swarm"
echo "swarm: $(json "'joined %d of %d, pushes %d, decisions %s, ack p50 %s ms' % (s['joined'], s['learners'], s['pushes'], s['decisions'], s['ack_ms']['p50'])")"
check "the swarm's summary reports every learner joined" [ "$(json "s['joined'] == s['learners'] == 4")" = True ]
check "no session failed" [ "$(json "s['failed']")" = 0 ]
check "the swarm timed its pushes (ack latencies from its events)" [ "$(json "s['ack_ms']['n'] > 0")" = True ]
check "every learner joined the synchronizer" [ "$(ev_count "$EV" learner_join id~'^swarm-' again=0)" = 4 ]
check "every learner said Bye" [ "$(ev_count "$EV" learner_bye id~'^swarm-' reason=done)" = 4 ]
m=$(ev_count "$EV" merge)
check "at least one merge ($m)" [ "$m" -ge 1 ]
check "pushes were pooled" ev_has "$EV" push decision~'^pooled'
check "pushes were accepted (ack events of the swarm's sessions)" ev_has "$W/events-swarm.log" ack decision=accepted
check "the learners adopted merged Updates (the library's adopt, in overwrite mode)" [ "$(json "s['adopted'] > 0")" = True ]
check "no merge failed" [ "$(ev_count "$EV" merge_failed)" = 0 ]
check "no learner declared dead" [ "$(ev_count "$EV" learner_dead)" = 0 ]

[ $fail = 0 ] && echo "test_swarm: all checks passed" || echo "test_swarm: FAILED"
exit $fail
