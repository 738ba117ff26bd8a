#!/bin/bash
# Crash loop: 3 learners train while the synchronizer is SIGKILLed at seeded
# random moments CRASHES times (default 10) and restarted on the same port.
# After every restart: `dloco check` passes, versions only move forward, the
# learners are the same processes (never restarted). At the end, in `sync`
# durability mode, every merge a learner was told was ACCEPTED is in the store
# (zero acknowledged merges lost).
set -u
TEST_NAME=crashloop
. "$(dirname "$0")/lib_cluster.sh"
CRASHES=${CRASHES:-10}
RANDOM=${SEED:-4242}
make_corpus
start_sync sync0 --durability sync
PORT=${EP##*:}
LP=()
for i in 0 1 2; do start_learner "l$i" --steps 100000000 --data_shard $i --data_shards 3; LP+=($LPID); done
wait_until 60 '[ "$(merges)" -gt 20 ]' || die "no merges before the first crash"

prev=$(versions)
for c in $(seq 1 "$CRASHES"); do
  delay_ms=$((300 + RANDOM % 1700))
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  kill -KILL "$SPID"; wait "$SPID" 2>/dev/null
  "$DLOCO" check "$W/store" > "$W/check.txt" 2>&1 || { cat "$W/check.txt"; die "dloco check failed after crash $c"; }
  now=$(versions)
  set -- $prev
  for v in $now; do [ "$v" -ge "$1" ] || die "versions went back after crash $c: $prev -> $now"; shift; done
  for p in "${LP[@]}"; do kill -0 "$p" 2>/dev/null || die "a learner died during crash $c"; done
  BIND="tcp://127.0.0.1:$PORT" start_sync "sync$c" --durability sync
  ev_has "$W/events-sync$c.log" sync_start epoch=$((c + 1)) resumed=1 || die "restart $c did not resume at epoch $((c + 1))"
  echo "crash $c after ${delay_ms} ms: check ok, versions $prev -> $now, restarted at epoch $((c + 1))"
  prev=$now
done
m0=$(merges)
wait_until 60 "[ \$(merges) -gt $((m0 + 20)) ]" || die "merges did not continue after the last restart"
echo "ok: merges continue after $CRASHES crashes ($m0 -> $(merges))"
for p in "${LP[@]}"; do kill -TERM "$p"; done
for i in 0 1 2; do
  wait_pid 60 "${LP[$i]}"; rc=$?
  [ $rc = 0 ] || { echo "FAIL: learner l$i exited $rc"; tail -3 "$W/l$i.log"; fail=1; }
done
stop_sync
check "dloco check passes at the end" quietly "$DLOCO" check "$W/store"

# every acknowledged merge is in the store
"$DLOCO" records "$W/store" | awk '$4 == "merged" { print $1, $2, $3 }' | sort -u > "$W/stored.txt"
cat "$W"/events-l[0-9].log | ev_field - ack "fragment merged_version learner" decision=accepted | sort -u > "$W/acked.txt"
n_acked=$(wc -l < "$W/acked.txt"); missing=$(comm -23 "$W/acked.txt" "$W/stored.txt" | wc -l)
echo "acknowledged merges: $n_acked, in the store: $((n_acked - missing)), missing: $missing"
[ "$n_acked" -gt 50 ] || { echo "FAIL: too few acknowledged merges to prove anything ($n_acked)"; fail=1; }
[ "$missing" = 0 ] || { echo "FAIL: acknowledged merges lost:"; comm -23 "$W/acked.txt" "$W/stored.txt" | head; fail=1; }
[ $fail = 0 ] && echo "test_crashloop: all checks passed" || echo "test_crashloop: FAILED"
exit $fail
