#!/bin/bash
# Barrier policies: under `--policy sync` a learner waits for its peers the
# way synchronous training does. Two learners; one (b1) is SIGSTOPped. The
# other (b0) stops training within a few pushes: a due push whose predecessor
# is still undecided (pooled, waiting for b1's) holds it at the barrier. A
# learner in a wait has written one more barrier_enter than barrier_wait
# (docs/EVENTS.md), which tells waiting from slow: the test waits for that,
# then keeps b1 stopped STOP_S more seconds (default 5) and b0 must still be
# in the same wait at the same step. After SIGCONT its barrier_wait event
# covers most of the stop and merges resume. Then b1 is stopped again and
# b0, once in a wait, gets SIGTERM: it still leaves at once (final flush
# bounded by flush_timeout_ms, Bye) with exit code 0.
#
# How far b0 may get during the stop: H=8. When b1 stops it may be up to H
# steps ahead (further and it would wait for b0 itself), with one pooled push
# of a fragment p at step x <= s0 + H (s0: b0's step). b0's push of p at x
# merges with it; its next one, at x + H, stays pooled (b1 is stopped); the
# one after, at x + 2H, waits. So at most 3H steps, against the thousands
# b0 would make in STOP_S seconds under `decoupled` (test_outage).
set -u
TEST_NAME=barrier
. "$(dirname "$0")/lib_cluster.sh"
STOP_S=${STOP_S:-5}
H=8
make_corpus
start_sync sync --durability periodic --policy sync $OUTER
EV="$W/events-sync.log"
NAMES=(b0 b1); LP=()
for i in 0 1; do
  start_learner "${NAMES[$i]}" --steps 100000000 --data_shard $i --data_shards 2 --throttle 0.5 --log_every 1 \
    --flush_timeout_ms 2000
  LP+=("$LPID")
done
E0="$W/events-b0.log"
merges_ev() { ev_count "$EV" merge; }
step_of() { local s; s=$(ev_last "$W/events-$1.log" step step); echo "${s:-0}"; }
# in_wait: b0 is in a barrier wait now (a barrier_enter whose barrier_wait is not written yet)
in_wait() { [ "$(ev_count "$E0" barrier_enter)" -eq $(( $(ev_count "$E0" barrier_wait) + 1 )) ]; }
wait_until 60 '[ "$(merges_ev)" -ge 10 ]' || die "no merges before the stop"
check "the learners were welcomed under policy sync" ev_has "$E0" welcome policy=sync

# 1. b1 stopped: b0 waits at the barrier
kill -STOP "${LP[1]}"
t_stop=$(date +%s%N)
s0=$(step_of b0)
wait_until 60 in_wait || die "b0 did not begin a barrier wait while b1 was stopped"
w0=$(ev_count "$E0" barrier_wait)
s1=$(step_of b0)
echo "b1 stopped: b0 went from step $s0 to $s1 before its wait (at most 3H = $((3 * H)) allowed)"
check "b0 stopped training at the barrier while b1 was stopped ($s0 -> $s1)" [ "$s1" -le $((s0 + 3 * H)) ]
# the stimulus: b1 stays stopped STOP_S s more (not a wait for a condition); b0 must stay in that one wait
sleep "$STOP_S"
m_stopped=$(merges_ev)
check "b0 still in the same wait at step $s1 after ${STOP_S} s more (step $(step_of b0))" \
  eval 'in_wait && [ "$(ev_count "$E0" barrier_wait)" = "$w0" ] && [ "$(step_of b0)" = "$s1" ]'
kill -CONT "${LP[1]}"
stop_ms=$(( ($(date +%s%N) - t_stop) / 1000000 ))
wait_until 30 "[ \$(ev_count '$E0' barrier_wait) -gt $w0 ]" || die "b0's wait did not end after SIGCONT"
read -r longest how <<< "$(ev_field "$E0" barrier_wait "waited_ms end" | tail -n +$((w0 + 1)) | sort -g | tail -n 1)"
echo "b0's longest barrier wait since the stop: ${longest} ms, ended: $how (stop: $stop_ms ms)"
check "b0's barrier wait covers most of the stop (${longest} ms of $stop_ms ms)" \
  awk -v w="${longest:-0}" -v s="$stop_ms" 'BEGIN {exit !(w >= s / 2)}'
check "it ended when b1's push decided it ($how)" [ "$how" = decided ]
check "the waits name a fragment and a step" \
  [ "$(ev_field "$E0" barrier_wait "fragment step" | awk '$1 < 0 || $1 >= 4 || $2 < 1' | wc -l)" = 0 ]
wait_until 60 "[ \$(merges_ev) -ge $((m_stopped + 10)) ]" && echo "ok: merges resumed after SIGCONT ($m_stopped -> $(merges_ev))" \
  || { echo "FAIL: merges did not resume after SIGCONT"; fail=1; }
s2=$(step_of b0)
wait_until 30 "[ \$(step_of b0) -gt $((s2 + 2 * H)) ]" || { echo "FAIL: b0 did not train on after SIGCONT"; fail=1; }

# 2. SIGTERM while waiting at the barrier: b0 still leaves, exit code 0
kill -STOP "${LP[1]}"
check "b0 waits at the barrier again" wait_until 60 in_wait
kill -TERM "${LP[0]}"
wait_pid 30 "${LP[0]}"; rc=$?
check "b0 left with exit code 0 after SIGTERM at the barrier ($rc)" [ "$rc" = 0 ]
check "its last wait ended by the signal" [ "$(ev_last "$E0" barrier_wait end)" = signal ]
read -r bw bws ec <<< "$(ev_last "$E0" learner_summary "barrier_waits barrier_wait_s exit_code")"
echo "b0: barrier_waits=${bw:-} barrier_wait_s=${bws:-} exit_code=${ec:-}"
check "b0's summary counts its waits (${bw:-} = $(ev_count "$E0" barrier_wait)) and exit code 0 (${ec:-})" \
  [ "${bw:-x}" = "$(ev_count "$E0" barrier_wait)" -a "${ec:-x}" = 0 ]
check "b0's summary counts the time waited (${bws:-} s >= the longest wait)" \
  awk -v t="${bws:-0}" -v w="${longest:-0}" 'BEGIN {exit !(t > 0 && t * 1000 >= w - 1)}'
check "b0 said Bye" ev_has "$EV" learner_bye id=b0
kill -CONT "${LP[1]}"
kill -TERM "${LP[1]}"
wait_pid 30 "${LP[1]}"; rc=$?
check "b1 left with exit code 0 ($rc)" [ "$rc" = 0 ]
stop_sync
check "dloco check" quietly "$DLOCO" check "$W/store"
[ $fail = 0 ] && echo "test_barrier: all checks passed" || echo "test_barrier: FAILED"
exit $fail
