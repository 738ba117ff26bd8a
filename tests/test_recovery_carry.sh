#!/bin/bash
# Kills cost seconds, not periods: a dloco-learner SIGKILLed mid-run and
# restarted under its id resumes from its recovery file AND the library's
# state beside it (path.node): it keeps the versions it held (Hello
# held_versions: the synchronizer answers must_fetch=0, and it fetches only
# the fragments merged since its save, not all P), its first pushes carry the
# progress it had not pushed when the file was written, and the ledger moves
# those tokens from the killed process's account to the new one's
# (ledger_carried: counted once, nothing carried_in or overclaimed). Its pushes
# are int4 with error feedback: the residuals the accepted pushes still owed
# are in the state too (state_restored residuals: those of the fragments not
# pushed since the save). A state file at another step than the trainer's is
# refused (state_refused) and the learner fetches the global model.
set -u
TEST_NAME=recovery_carry
. "$(dirname "$0")/lib_cluster.sh"
make_corpus
start_sync s0
# slowed to ~0.2 s a step (a push every 2 steps), so the kill lands before most fragments push again
RARGS=(--steps 100000 --log_every 5 --adopt keep --throttle 0.02 --recovery_every_s 0 --recovery_every_steps 20
  --push_codec int4 --push_block 32)
start_learner r0 "${RARGS[@]}"
R0=$LPID
wait_until 60 '[ "$(ev_last "$W/events-r0.log" step pushes)" -ge 5 ] 2>/dev/null' || die "r0 did not push"
# kill right after a save, so some fragments hold progress not pushed since
n0=$(ev_count "$W/events-r0.log" recovery_saved)
wait_until 60 '[ "$(ev_count "$W/events-r0.log" recovery_saved)" -gt "$n0" ]' || die "no recovery file written"
kill_at_saved_file "$R0" "$W/events-r0.log" "$W/state/dloco-r0.recovery"
SAVED_STEP=$(ev_last "$W/events-r0.log" recovery_saved step)
check "the recovery file was written with the learner state" ev_has "$W/events-r0.log" recovery_saved "learner_state=1"
[ -f "$W/state/dloco-r0.recovery.node" ] || die "no learner state at <state_dir>/dloco-<id>.recovery.node"
echo "r0 killed after its file at step $SAVED_STEP"

start_learner r0 "${RARGS[@]}"
R0=$LPID
ev_wait 30 "$W/events-r0.log" state_restored || die "the restarted learner did not restore its state"
carried=$(ev_last "$W/events-r0.log" state_restored carried_tokens)
check "restored at the saved step" ev_has "$W/events-r0.log" state_restored "step=$SAVED_STEP"
check "it carries unpushed progress ($carried fragment-tokens)" [ "${carried:-0}" -gt 0 ]
residuals=$(ev_last "$W/events-r0.log" state_restored residuals)
check "and the error feedback residuals of the fragments it carries ($residuals restored)" \
  [ "${residuals:-0}" -gt 0 ]
ev_wait 30 "$W/events-r0.log" welcome || die "no Welcome after the restart"
fetching=$(ev_last "$W/events-r0.log" welcome fetching)
check "the synchronizer keeps its fragments (must_fetch=0)" ev_has "$W/events-s0.log" learner_join "id=r0" "must_fetch=0"
check "it fetches only the fragments merged since its save ($fetching of 4)" [ "${fetching:-4}" -lt 4 ]
ev_wait 30 "$W/events-s0.log" ledger_carried || die "the ledger did not move the carried tokens"
moved=$(ev_last "$W/events-s0.log" ledger_carried moved)
check "the ledger moved the carried tokens to the new account ($moved = $carried)" [ "$moved" = "$carried" ]
wait_until 60 '[ "$(ev_count "$W/events-r0.log" push)" -ge 4 ] 2>/dev/null' || die "the resumed learner did not push"
kill -TERM "$R0"
wait_pid 60 "$R0"; rc=$?
check "the resumed learner exits 0 on SIGTERM" [ "$rc" = 0 ]

# the state left at its path while the trainer's file is gone (r0 resumes at step 0): refused for its step,
# moved aside, and the learner fetches every fragment
cp "$W/state/dloco-r0.recovery.node" "$W/state/other.node"
rm -f "$W/state/dloco-r0.recovery"
cp "$W/state/other.node" "$W/state/dloco-r0.recovery.node"
start_learner r0 "${RARGS[@]}"
R0=$LPID
ev_wait 30 "$W/events-r0.log" state_refused || die "a state at another step than the trainer's was not refused"
check "refused with its reason" ev_has "$W/events-r0.log" state_refused "reason~step"
check "moved aside" test -f "$W/state/dloco-r0.recovery.node.rejected"
ev_wait 30 "$W/events-r0.log" welcome || die "no Welcome after the refusal"
check "and it fetches the global model (all 4)" ev_has "$W/events-r0.log" welcome "fetching=4"
kill -TERM "$R0"; wait_pid 60 "$R0" > /dev/null
stop_sync
ov=$(ev_last "$W/events-s0.log" ledger overclaim)
ci=$(ev_last "$W/events-s0.log" ledger carried_in)
check "nothing overclaimed ($ov) or carried in from outside ($ci)" [ "${ov:-x}" = 0 -a "${ci:-x}" = 0 ]
check "dloco check passes (ledger: every token once)" quietly "$DLOCO" check "$W/store"
[ $fail = 0 ] && echo "test_recovery_carry: all checks passed" || echo "test_recovery_carry: FAILED"
exit $fail
