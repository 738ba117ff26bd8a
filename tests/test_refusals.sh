#!/bin/bash
# Integration: refusals that cannot heal end a learner at once with exit 3,
# the reason on stderr and a `refused` event (docs/PROTOCOL.md "Errors"):
# another run id, another model shape, another fragment count, and a second
# live process with a learner id already in use (duplicate_id). A learner
# restarted under its id takes it back (the old process gone, or silent past
# liveness; the silent one is told when it wakes up). Every learner here has
# a connect timeout far beyond its wait, so exit 3 cannot come from a timeout.
set -u
TEST_NAME=refusals
. "$(dirname "$0")/lib_cluster.sh"
make_corpus
start_sync sync --liveness 5
EV="$W/events-sync.log"

# refused NAME WHAT-CHECK args...: the learner exits 3 with a refused event whose reason matches
refused() {
  local name=$1 kind=$2 re=$3; shift 3
  start_learner "$name" --steps 5 --connect_timeout_ms 120000 "$@"
  wait_pid 60 "$LPID"; local rc=$?
  check "$name: exit 3 (got $rc)" [ "$rc" = 3 ]
  check "$name: refused event kind=$kind reason~$re" ev_has "$W/events-$name.log" refused kind="$kind" "reason~$re"
  check "$name: the reason is on stderr" grep -q "refused learner $name" "$W/$name.log"
  check "$name: never joined" [ "$(ev_count "$EV" learner_join id="$name")" = 0 ]
}
refused run-id mismatch "run id 'other' is not this synchronizer's run 'dloco'" --run_id other
refused shape mismatch "C=64 .*does not match.*C=32" --n_embd 64
refused frags mismatch "P=8\\).*does not match.*P=4\\)" --fragments 8
refused vocab mismatch "V=300 .*does not match.*V=256" --vocab 300
# llm.c token shards make the learner's vocab 50257 (the synchronizer's default is 256)
python3 -c "
import struct, sys
n = 20000
open(sys.argv[1], 'wb').write(struct.pack('<256i', 20240520, 1, n, *([0] * 253)) + struct.pack('<%dH' % n, *[(i * 31) % 256 for i in range(n)]))
" "$W/tokens.bin"
refused shards mismatch "V=50257 P=4\) does not match the run's .*V=256 P=4\)" --data "$W/tokens.bin"
check "shards: its data event says shards, vocab 50257" ev_has "$W/events-shards.log" data kind=shards vocab=50257

# duplicate id: a second live process is refused, the first trains on
start_learner dup --steps 100000000 --throttle 0.5
P1=$LPID
ev_wait 60 "$EV" learner_join id=dup || die "dup did not join"
ev_wait 60 "$W/events-dup.log" push || die "dup never pushed"
check "a networked learner writes its data event (the data: line)" ev_has "$W/events-dup.log" data kind=text vocab=256
check "... and prints its data: line" grep -q "^data: $W/corpus.txt (text, " "$W/dup.log"
start_learner dup2 --id dup --steps 5 --connect_timeout_ms 120000
wait_pid 60 "$LPID"; rc=$?
check "a second live process with id dup exits 3 (got $rc)" [ "$rc" = 3 ]
check "it was refused duplicate_id" ev_has "$W/events-dup2.log" refused kind=protocol "reason~^duplicate_id: learner id 'dup' is held"
check "the synchronizer logged learner_duplicate action=duplicate_id" ev_has "$EV" learner_duplicate id=dup action=duplicate_id
check "the synchronizer welcomed dup once" [ "$(ev_count "$EV" learner_join id=dup)" = 1 ]
n=$(ev_count "$EV" push id=dup)
wait_until 60 "[ \$(ev_count '$EV' push id=dup) -gt $((n + 2)) ]"
check "the first dup goes on pushing" [ "$(ev_count "$EV" push id=dup)" -gt $((n + 2)) ]

# --threads 0 (the default) next to another learner on this host, without
# OMP_NUM_THREADS: warned (threads_shared); --threads 1 is not
for t in 0 1; do
  : > "$W/events-thr$t.log"
  env -u OMP_NUM_THREADS "$LEARNER" --connect "$EP" --id "thr$t" --state_dir "$W" --device cpu $MODEL --data "$W/corpus.txt" \
    --batch 8 --steps 2 --fragments 4 --threads $t --events "$W/events-thr$t.log" > "$W/thr$t.log" 2>&1
done
check "--threads 0 beside another learner: threads_shared" ev_has "$W/events-thr0.log" threads_shared id=thr0 "others~^[1-9]"
check "--threads 1: no warning" [ "$(ev_count "$W/events-thr1.log" threads_shared)" = 0 ]

# the holder hangs past liveness (5 x 200 ms): a new process takes the id;
# the old one, resumed, is told and exits 3
kill -STOP "$P1"
ev_wait 30 "$EV" learner_dead id=dup || die "the stopped dup was not declared dead"
start_learner dup3 --id dup --steps 16 --connect_timeout_ms 120000
P3=$LPID
ev_wait 60 "$EV" learner_duplicate id=dup action=took_over_silent || die "no take-over of the silent id"
kill -CONT "$P1"
wait_pid 60 "$P1"; rc=$?
check "the resumed old dup exits 3 (got $rc)" [ "$rc" = 3 ]
check "it was told it was taken over" ev_has "$W/events-dup.log" refused kind=protocol "reason~^duplicate_id: .*taken over"
wait_pid 120 "$P3"; rc=$?
check "the process that took the id over trained to the end (exit $rc)" [ "$rc" = 0 ]

# the holder crashes: its restart takes the id back at once
start_learner crash --steps 100000000 --throttle 0.5
P4=$LPID
ev_wait 60 "$EV" learner_join id=crash || die "crash did not join"
kill -KILL "$P4"; wait "$P4" 2>/dev/null
start_learner crash2 --id crash --steps 16 --connect_timeout_ms 120000
wait_pid 120 "$LPID"; rc=$?
check "a restarted learner takes its id back and trains (exit $rc)" [ "$rc" = 0 ]
check "the synchronizer welcomed it again" [ "$(ev_count "$EV" learner_join id=crash)" = 2 ]
check "it was never refused" [ "$(ev_count "$W/events-crash2.log" refused)" = 0 ]

stop_sync
[ $fail = 0 ] && echo "test_refusals: all checks passed" || echo "test_refusals: FAILED"
exit $fail
