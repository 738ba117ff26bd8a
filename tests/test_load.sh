#!/bin/bash
# The synchronizer under back-to-back load (the [load] defects, on loopback):
# 16 simulated learners (bench/swarm: handles of the learner API stepping every
# tick) push as fast as they are answered, every fragment in 4 KiB chunks (fixed: PUSH_CHUNK_MAX_KB),
# into a pool of 1 MiB (an eighth of what they would pool at once; with 8 the
# library's hold rule kept the pool just under its bound). Checks,
# from the events and the swarm's JSON summary: pushes are refused busy with a reason and the
# learners go on (their later pushes merge); no push is refused for a base
# version that exists ("newer than global"); no learner is declared dead and
# none re-hellos or rebuilds its connection (heartbeats never wait behind
# payload); no merge fails; the loop yields its drain under the flood; the
# pool never exceeds its bound (decoupled policy); the ledger balances and `dloco check`
# passes. No check depends on timing. Bounded; only our own PIDs are killed.
set -u
TEST_NAME=load
PUSH_CHUNK_MAX_KB=4
. "$(dirname "$0")/lib_cluster.sh"
SWARM_BIN=$B/bench/swarm
[ -x "$SWARM_BIN" ] || die "$SWARM_BIN not built"
start_sync sync --durability periodic --pool_mb 1 --status_every_ms 500
EV="$W/events-sync.log"
"$SWARM_BIN" --endpoint "$EP" $MODEL --vocab 256 --fragments 4 --learners 16 --mode b2b --duration 15 \
  --json "$W/swarm.json" --events "$W/events-swarm.log" > "$W/swarm.log" 2>&1 &
SWP=$!; PIDS+=("$SWP")
wait_pid 90 "$SWP"; rc=$?
check "the swarm exits 0 (rc=$rc)" [ "$rc" = 0 ]
stop_sync

[ -f "$W/swarm.json" ] || die "no JSON summary from the swarm"
read -r chunks_in pool_peak pool_max busy yields < <(ev_field "$EV" sync_summary "chunks_in pool_peak_bytes pool_max_bytes busy_refused drain_yields")
m=$(ev_count "$EV" merge)
echo "sync: merges $m, push chunks in $chunks_in, pool peak $pool_peak of $pool_max bytes, busy $busy, drain yields $yields"
echo "swarm: $(json "'joined %d of %d, pushes %d, decisions %s, rehellos %d, rebuilds %d' % (s['joined'], s['learners'], s['pushes'], s['decisions'], s['rehellos'], s['rebuilds'])")"
check "every learner joined" [ "$(json "s['joined'] == s['learners'] == 16")" = True ]
check "merges happened ($m)" [ "$m" -ge 10 ]
check "pushes travelled in chunks ($chunks_in)" [ "${chunks_in:-0}" -gt 0 ]
check "the pool filled and pushes were refused busy ($busy)" [ "${busy:-0}" -gt 0 ]
check "busy refusals carry their reason (push decision=busy events)" ev_has "$EV" push decision=busy reason~'pool full'
check "the pool never exceeded its bound ($pool_peak <= $pool_max)" [ "${pool_peak:-1}" -le "${pool_max:-0}" ]
check "the drain yielded to timers and merges under the flood ($yields)" [ "${yields:-0}" -gt 0 ]
check "no push refused for a base version that exists" [ "$(ev_count "$EV" push decision=rejected reason~'newer than')" = 0 ]
check "no learner declared dead" [ "$(ev_count "$EV" learner_dead)" = 0 ]
check "no learner re-helloed or rebuilt its connection" [ "$(json "s['rehellos'] + s['rebuilds']")" = 0 ]
check "no merge failed" [ "$(ev_count "$EV" merge_failed)" = 0 ]
read -r applied dropped rejected lost discarded outstanding processed over < <(
  ev_field "$EV" ledger "applied dropped_stale rejected lost discarded outstanding processed overclaim" | tail -n 1)
sum=$((applied + dropped + rejected + lost + discarded + outstanding))
check "every token ends in exactly one state (sum $sum = processed $processed), none counted twice (overclaim $over)" \
  [ "$sum" = "$processed" -a "$over" = 0 ]
check "dloco check passes" quietly "$DLOCO" check "$W/store"
[ $fail = 0 ] && echo "test_load: all checks passed" || echo "test_load: FAILED"
exit $fail
