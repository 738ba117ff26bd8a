#!/bin/bash
# Failing commits back off (the [wan] issue): a synchronizer whose disk fails
# every write (libfiu, the mechanism of dloco-chaos's disk faults: LMDB's
# pwrite/pwritev/writev and fdatasync/fsync fail with ENOSPC) does not fail a
# round per push (before: ~28 merge_failed a second with two learners). After
# a failed commit it answers pushes busy (retry_after_ms) for a back-off that
# doubles from 100 ms to 3.2 s, then probes with one round. Checks, from the
# event log, /metrics (also through promtool's lint when it is installed) and
# /status.json: the merge_failed events of the fault
# window stay within what that schedule allows in the window's length; the
# back-off and the failures in a row are visible while it lasts; pushes were
# answered busy naming the back-off; no message carries a source path; once
# the disk is back the next probe commits (commit_recovered), the gauges go
# back to 0 and merges resume; `dloco check` passes. Bounded; only our own
# PIDs are killed.
set -u
TEST_NAME=commit_backoff
. "$(dirname "$0")/lib_cluster.sh"
SRC=$(cd "$(dirname "$0")/.." && pwd)
command -v fiu-run > /dev/null && command -v fiu-ctrl > /dev/null || { echo "SKIP: libfiu (fiu-run, fiu-ctrl) not installed"; exit 77; }
command -v curl > /dev/null || { echo "SKIP: curl not installed"; exit 77; }
metric() { awk -v k="$2" '$1 == k { print $2; f = 1 } END { if (!f) print "absent" }' "$1"; }
make_corpus
SYNC_WRAP="fiu-run -x -f $W/fiu" start_sync sync --durability sync --quorum 1
EV="$W/events-sync.log"
MA=$(ev_last "$EV" metrics_listen addr)
[ -n "$MA" ] || die "no metrics_listen event"
for n in a b; do start_learner "$n" --steps 100000000 --throttle 0.2; done
wait_until 60 '[ "$(ev_count "$EV" merge)" -ge 10 ]' || die "no merges before the fault"
fault() { # on|off: every store write point at once
  local c pt
  for pt in posix/io/rw/pwrite posix/io/rw/pwritev posix/io/rw/writev posix/io/sync/fdatasync posix/io/sync/fsync; do
    [ "$1" = on ] && c="enable name=$pt,failinfo=28" || c="disable name=$pt"
    fiu-ctrl -f "$W/fiu" -c "$c" "$SPID" > "$W/fiu.out" 2>&1 || die "fiu-ctrl $c failed: $(cat "$W/fiu.out")"
    grep -q "returned error" "$W/fiu.out" && die "libfiu refused $c: $(cat "$W/fiu.out")"
  done
}
f0=$(ev_count "$EV" merge_failed)
t0=$(date +%s.%N)
fault on
wait_until 30 '[ "$(ev_count "$EV" merge_failed)" -gt '"$f0"' ]' || die "the disk fault failed no commit"
# the fault lasts WINDOW seconds (a stimulus, not a wait); the back-off shows meanwhile
WINDOW=${WINDOW:-6}
sleep 2
curl -s --max-time 10 "http://$MA/metrics" > "$W/during.prom"
curl -s --max-time 10 "http://$MA/status.json" > "$W/during.json"
sleep $((WINDOW - 2))
fault off
t1=$(date +%s.%N)
nf=$(( $(ev_count "$EV" merge_failed) - f0 ))
# the schedule: the merges in flight when the disk failed (one per fragment at most, 4), then one probe per
# back-off (100, 200, 400, ... 3200 ms) within the window's length; +2 for a probe at each edge
bound=$(awk -v t="$(echo "$t1 - $t0" | bc)" 'BEGIN { n = 4 + 2; s = 0; b = 0.1
  while (s + b <= t) { s += b; n++; if (b < 3.2) b *= 2 } print n }')
echo "fault window $(echo "$t1 - $t0" | bc | cut -c1-5) s: $nf merge_failed (the schedule allows $bound)"
check "merge_failed within the back-off schedule ($nf <= $bound)" [ "$nf" -le "$bound" ]
check "at least two failures in a row during the fault ($nf)" [ "$nf" -ge 2 ]
check "/metrics: commit_failures_in_a_row >= 1 during the fault ($(metric "$W/during.prom" dloco_sync_commit_failures_in_a_row))" \
  awk -v v="$(metric "$W/during.prom" dloco_sync_commit_failures_in_a_row)" 'BEGIN { exit !(v >= 1) }'
check "/metrics: commit_backoff_seconds >= 0.1 during the fault ($(metric "$W/during.prom" dloco_sync_commit_backoff_seconds))" \
  awk -v v="$(metric "$W/during.prom" dloco_sync_commit_backoff_seconds)" 'BEGIN { exit !(v >= 0.1) }'
if command -v promtool > /dev/null; then
  check "/metrics with the back-off passes promtool check metrics" [ -z "$(promtool check metrics < "$W/during.prom" 2>&1)" ]
fi
check "/status.json: commit_failures_in_a_row and commit_backoff_ms during the fault" \
  [ "$(jq_py 'int(d["commit_failures_in_a_row"] >= 1 and d["commit_backoff_ms"] >= 100)' < "$W/during.json")" = 1 ]
nb=$(ev_count "$EV" push decision=busy "reason~commits are failing")
check "pushes were answered busy during the back-off ($nb)" [ "$nb" -ge 1 ]
check "every back-off is bounded (commit_backoff backoff_ms <= 3200)" \
  [ -z "$(ev_field "$EV" commit_backoff backoff_ms | awk '$1 > 3200 || $1 < 100')" ]
wait_until 30 'ev_has "$EV" commit_recovered' && echo "ok: recovered after $(ev_last "$EV" commit_recovered fails_in_row) failures in a row" \
  || { echo "FAIL: no commit_recovered after the disk came back"; fail=1; }
m=$(ev_count "$EV" merge)
wait_until 30 "[ \$(ev_count '$EV' merge) -ge $((m + 5)) ]" && echo "ok: merges resumed ($m -> $(ev_count "$EV" merge))" \
  || { echo "FAIL: merges did not resume"; fail=1; }
wait_until 20 'curl -s --max-time 10 "http://$MA/metrics" > "$W/after.prom" && [ "$(metric "$W/after.prom" dloco_sync_commit_failures_in_a_row)" = 0 ]'
check "/metrics: commit_failures_in_a_row and commit_backoff_seconds back to 0" \
  [ "$(metric "$W/after.prom" dloco_sync_commit_failures_in_a_row) $(metric "$W/after.prom" dloco_sync_commit_backoff_seconds)" = "0 0" ]
ev_field "$EV" merge_failed reason | sort | uniq -c | head -3
check "no message names a source path ($SRC or file.c:line)" \
  [ -z "$(cat "$W"/*.log | grep -e "$SRC/" -e '[a-z_]\.c:[0-9]' | head -3)" ]
kill -TERM "$LPID"; stop_sync
check "dloco check" quietly "$DLOCO" check "$W/store"
[ $fail = 0 ] && echo "test_commit_backoff: all checks passed" || echo "test_commit_backoff: FAILED"
exit $fail
