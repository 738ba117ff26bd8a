#!/bin/bash
# Outage: SIGSTOP the synchronizer until every learner has trained STEPS more
# steps (default 50; bounded by OUTAGE_S, default 120 s, as a deadline, not a
# rate). Every learner keeps training (its step counter advances during the
# stop), its memory stays bounded because undecided pushes are not piled up:
# during the stop each learner sends at most 2 pushes per fragment (its push
# events), though at H=8 its 50 steps would make many more; pushes and
# merges resume after SIGCONT, and the long pushes that carry the outage's
# steps are merged, not refused by the norm guard.
set -u
TEST_NAME=outage
. "$(dirname "$0")/lib_cluster.sh"
STEPS=${STEPS:-50}
OUTAGE_S=${OUTAGE_S:-120}
# Under AddressSanitizer freed memory sits in a quarantine and RSS grows with
# allocation churn; without a quarantine RSS reflects what is really held.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=0"
make_corpus
start_sync sync --durability sync
NAMES=(o0 o1 o2); LP=()
for i in 0 1 2; do start_learner "${NAMES[$i]}" --steps 100000000 --data_shard $i --data_shards 3 --throttle 0.5 --log_every 10; LP+=($LPID); done
wait_until 60 '[ "$(merges)" -ge 20 ]' || die "no merges before the outage"
rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
pushes_now() { ev_count "$W/events-$1.log" push; } # Push messages sent so far
declare -A s0 r0 p0 p1
for i in 0 1 2; do s0[$i]=$(steps_of "${NAMES[$i]}"); r0[$i]=$(rss "${LP[$i]}"); p0[$i]=$(pushes_now "${NAMES[$i]}"); done
kill -STOP "$SPID"
wait_until 10 "[ \"\$(awk '{print \$3}' /proc/$SPID/stat)\" = T ]" || die "the synchronizer did not stop on SIGSTOP"
m0=$(merges)
echo "synchronizer stopped at $m0 merges until each learner trained $STEPS more steps"
trained() { local i; for i in 0 1 2; do [ "$(steps_of "${NAMES[$i]}")" -gt $(( ${s0[$i]} + STEPS )) ] || return 1; done; }
wait_until "$OUTAGE_S" trained || echo "note: not every learner trained $STEPS steps within $OUTAGE_S s (below: which)"
for i in 0 1 2; do
  s1=$(steps_of "${NAMES[$i]}"); r1=$(rss "${LP[$i]}"); p1[$i]=$(pushes_now "${NAMES[$i]}")
  echo "${NAMES[$i]}: steps ${s0[$i]} -> $s1 during the outage, RSS ${r0[$i]} -> $r1 kB, pushes sent ${p0[$i]} -> ${p1[$i]}"
  [ "$s1" -gt $(( ${s0[$i]} + STEPS )) ] || { echo "FAIL: ${NAMES[$i]} stopped training during the outage"; fail=1; }
  [ "$r1" -lt $(( ${r0[$i]} + ${r0[$i]} / 2 + 16384 )) ] || { echo "FAIL: ${NAMES[$i]} memory grew without bound"; fail=1; }
  [ "${p1[$i]}" -le $(( ${p0[$i]} + 2 * 4 )) ] \
    || { echo "FAIL: ${NAMES[$i]} kept sending pushes nobody answered (${p0[$i]} -> ${p1[$i]})"; fail=1; }
done
m_stop=$(merges)
check "no merge happened while stopped ($m0 = $m_stop)" [ "$m0" = "$m_stop" ]
kill -CONT "$SPID"
wait_until 60 "[ \$(merges) -ge $((m0 + 20)) ]" && echo "ok: merges resumed after SIGCONT ($m0 -> $(merges))" \
  || { echo "FAIL: merges did not resume"; fail=1; }
for p in "${LP[@]}"; do kill -TERM "$p"; done
for i in 0 1 2; do
  wait_pid 60 "${LP[$i]}"; rc=$?
  [ $rc = 0 ] || { echo "FAIL: ${NAMES[$i]} exited $rc"; fail=1; }
  read -r pushes co <<< "$(ev_last "$W/events-${NAMES[$i]}.log" learner_summary "pushes coalesced")"
  echo "  ${NAMES[$i]}: pushes=$pushes coalesced=$co"
  check "${NAMES[$i]}: pushes resumed after SIGCONT (${p1[$i]} -> $(pushes_now "${NAMES[$i]}"))" \
    [ "$(pushes_now "${NAMES[$i]}")" -gt $(( ${p1[$i]} + 4 )) ]
done
stop_sync
# the work trained through the outage is kept: pushes are judged per step (synchronizer/guard.h), so the
# long pushes after SIGCONT are not norm outliers; the one with the most steps was pooled for a merge
SE="$W/events-sync.log"
check "no push refused by the norm guard ($(ev_count "$SE" push decision=rejected "reason~^norm"))" \
  [ "$(ev_count "$SE" push decision=rejected "reason~^norm")" = 0 ]
read -r ls ld <<< "$(ev_field "$SE" push "steps decision" | sort -n | tail -n 1)"
check "the longest push ($ls steps, H=8) was pooled for a merge ($ld)" [ "${ld#pooled}" != "$ld" ]
check "dloco check" quietly "$DLOCO" check "$W/store"
[ $fail = 0 ] && echo "test_outage: all checks passed" || echo "test_outage: FAILED"
exit $fail
