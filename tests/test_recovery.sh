#!/bin/bash
# A learner SIGKILLed mid-run resumes from its recovery file (gpt/recovery.h):
# restarted under the same id, it continues at the step of its last file
# (the learning-rate schedule goes on, not from step 0), with the optimizer
# state it saved (the moments' hash in recovery_saved = the one in
# recovery_resumed) and its data position; started while the synchronizer is
# down it keeps trying (connect_waiting) instead of exiting, and joins once
# the synchronizer is back. The store passes `dloco check` (every token in
# exactly one ledger state) at the end. With the library's state restored
# (tests/test_recovery_carry.sh) it trains while it waits.
set -u
TEST_NAME=recovery
. "$(dirname "$0")/lib_cluster.sh"
make_corpus
start_sync s0
PORT=${EP##*:}
# warm-up over 2000 steps: the learning rate of a resumed step differs from a fresh start's
RARGS=(--steps 100000 --warmup 2000 --log_every 10 --state_dir "$W/state" --recovery_every_s 0 --recovery_every_steps 20)
start_learner r0 "${RARGS[@]}"
R0=$LPID
ev_wait 60 "$W/events-r0.log" recovery_saved "step~^[4-9][0-9]$" || die "no recovery file written by step 40-99"
wait_until 30 '[ "$(ev_last "$W/events-r0.log" step pushes)" -ge 3 ] 2>/dev/null' || die "r0 did not push"
[ -f "$W/state/dloco-r0.recovery" ] || die "no recovery file at <state_dir>/dloco-<id>.recovery"
kill_at_saved_file "$R0" "$W/events-r0.log" "$W/state/dloco-r0.recovery"
saved=$(ev_last "$W/events-r0.log" recovery_saved "step moments_hash")
set -- $saved; SAVED_STEP=$1 SAVED_HASH=$2
echo "r0 killed; its last recovery file: step $SAVED_STEP, moments $SAVED_HASH"

# the synchronizer goes down too: the restarted learner must wait for it, not exit
kill -KILL "$SPID"; wait "$SPID" 2>/dev/null
: > "$W/events-r0.log"
"$LEARNER" --connect "$EP" --id r0 --device cpu $MODEL --data "$W/corpus.txt" --batch 8 --lr 3e-3 --fragments 4 \
  --threads 1 --events "$W/events-r0.log" "${RARGS[@]}" > "$W/r0b.log" 2>&1 &
R0=$!; PIDS+=("$R0")
ev_wait 20 "$W/events-r0.log" recovery_resumed || die "the restarted learner did not resume from its file"
check "resumed at the saved step ($SAVED_STEP)" ev_has "$W/events-r0.log" recovery_resumed "step=$SAVED_STEP"
check "optimizer state restored (moments hash $SAVED_HASH)" ev_has "$W/events-r0.log" recovery_resumed \
  "moments_hash=$SAVED_HASH"
ev_wait 20 "$W/events-r0.log" connect_waiting || die "no connect_waiting while the synchronizer is down"
kill -0 "$R0" 2>/dev/null || die "the learner exited while the synchronizer was down"
echo "ok: the learner waits for the synchronizer ($(ev_last "$W/events-r0.log" connect_waiting waited_s) s)"
BIND="tcp://127.0.0.1:$PORT" start_sync s1
ev_wait 30 "$W/events-s1.log" learner_join id=r0 || die "the resumed learner did not join the restarted synchronizer"
# with the library's state restored it holds every fragment at once: it trains while the synchronizer is
# down (training never waits for the network), so its Hello says a step at or past the resumed one
joined=$(ev_last "$W/events-s1.log" learner_join step)
check "its Hello says a step at or past the resumed one ($joined >= $SAVED_STEP)" [ "${joined:-0}" -ge "$SAVED_STEP" ]
check "the learner restored its state from beside the recovery file" \
  ev_has "$W/events-r0.log" state_restored "step=$SAVED_STEP"
ev_wait 30 "$W/events-r0.log" step || die "the resumed learner did not train after the synchronizer came back"
first=$(ev_field "$W/events-r0.log" step "step lr" | head -1)
set -- $first
echo "first step after the restart: step $1, lr $2"
check "the step counts on from the file (not from 0)" test "$1" -gt "$SAVED_STEP" -a "$1" -le $((SAVED_STEP + 10))
# warm-up: lr(step) = 3e-3 * step / 2000 (docs/OPERATING.md); a fresh start would be at step <= 10
want=$(awk -v s="$1" 'BEGIN { printf "%.6e", 3e-3 * s / 2000 }')
check "the learning rate continues the schedule ($2 = $want)" \
  awk -v a="$2" -v b="$want" 'BEGIN { exit !(a > 0 && (a - b) / b < 1e-3 && (b - a) / b < 1e-3) }'
wait_until 30 '[ "$(ev_last "$W/events-r0.log" step pushes)" -ge 3 ] 2>/dev/null' || die "the resumed learner did not push"
kill -TERM "$R0"
wait_pid 60 "$R0"; rc=$?
check "the resumed learner exits 0 on SIGTERM" [ "$rc" = 0 ]
check "a clean finish writes the file" ev_has "$W/events-r0.log" recovery_summary
stop_sync
check "dloco check passes (ledger: every token once)" quietly "$DLOCO" check "$W/store"
[ $fail = 0 ] && echo "test_recovery: all checks passed" || echo "test_recovery: FAILED"
exit $fail
