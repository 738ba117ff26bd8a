#!/bin/bash
# Workload-aware sync timing on real processes (docs/SYNC_TIMING.md): a dloco-sync and a learner with
# --sync_timing wa reading a pressure FILE that this script rewrites: calm, then high pressure (request_rate
# far above wa_rate_ref) from about step 120 to about step 200 of the learner's loss log, then calm again.
# Asserted on the learner's events and its timing trace (what it observed per step), not on wall time:
#   every push decision lies in the corridor [h_min, h_max] after the fragment's last; no push decision
#   that is not the h_max deadline falls on a step whose observed pressure was high; the high window was
#   really observed (>= 20 steps) and pushes were made before and after it.
# Then a second learner with --sync_timing matched_random and that trace makes exactly the same number of
# push decisions per fragment, all in the corridor. Then the refusals: learner options (matched_random
# without a trace, a non-loopback pressure URL, h_min above h_max, a malformed trace), a pressure file with
# a bad value (pressure_refused event, reason named), and dloco-serve's request refusals (method, path,
# malformed) and bad options.
set -u
TEST_NAME=wa
. "$(dirname "$0")/lib_cluster.sh"
SERVE=$B/chaos/dloco-serve
make_corpus
STEPS=${STEPS:-320}
HMIN=4 HMAX=16
PF="$W/pressure.txt"
setp() { printf 'request_rate %s\nlink_util 0\n' "$1" > "$PF.tmp" && mv "$PF.tmp" "$PF"; }
setp 10
start_sync sync --quorum 1
WA="--sync_timing wa --h_min $HMIN --h_max $HMAX --wa_rate_ref 50 --pressure $PF --pressure_poll_ms 1 --throttle 0.3"
start_learner l1 --steps "$STEPS" $WA --timing_trace_out "$W/trace1.txt"
L1=$LPID
wait_until 120 '[ "$(steps_of l1)" -ge 120 ] || ! kill -0 $L1 2>/dev/null' || die "learner did not reach step 120"
setp 5000
wait_until 120 '[ "$(steps_of l1)" -ge 200 ] || ! kill -0 $L1 2>/dev/null' || die "learner did not reach step 200"
setp 10
wait_pid 240 "$L1" || die "learner l1 failed"
E1="$W/events-l1.log"

# the corridor, the avoided window, from the trace (p STEP PRESSURE, d STEP FRAGMENT) and the events
read -r ok_corr bad_push high_steps before after forced total < <(python3 - "$W/trace1.txt" $HMIN $HMAX 4 8 <<'EOF'
import sys
tr, hmin, hmax, P, H = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
press, dec = {}, []
for l in open(tr):
    f = l.split()
    if f[0] == 'p': press[int(f[1])] = None if f[2] == 'unknown' else float(f[2])
    elif f[0] == 'd': dec.append((int(f[1]), int(f[2])))
last = {p: ((p * H // P) or H) - H for p in range(P)}
ok, bad, forced = 1, 0, 0
high = [s for s, v in press.items() if v is not None and v > 1.0]
lo, hi = (min(high), max(high)) if high else (0, -1)
before = after = 0
for s, p in dec:
    e = s - last[p]
    if e < hmin or e > hmax: ok = 0
    if e == hmax: forced += 1
    if press.get(s) is not None and press[s] > 1.0 and e != hmax: bad += 1
    before += s < lo; after += s > hi
    last[p] = s
print(ok, bad, len(high), before, after, forced, len(dec))
EOF
)
check "every wa push decision in the corridor [$HMIN, $HMAX]" [ "$ok_corr" = 1 ]
check "no unforced push decision on a high-pressure step ($bad_push)" [ "$bad_push" = 0 ]
check "the high-pressure window was observed ($high_steps steps >= 20)" [ "$high_steps" -ge 20 ]
check "pushes before ($before) and after ($after) the window" [ "$before" -ge 4 ] && [ "$after" -ge 4 ]
n_ev=$(ev_count "$E1" sync_timing policy=wa)
check "one sync_timing event per decision ($n_ev = $total)" [ "$n_ev" = "$total" ]
check "decisions reached the synchronizer as pushes" [ "$(ev_last "$E1" learner_summary accepted)" -gt 0 ]

# matched_random from that trace: the same counts per fragment, in the corridor
start_learner l2 --steps "$STEPS" --sync_timing matched_random --h_min $HMIN --h_max $HMAX --timing_seed 5 \
  --timing_trace_in "$W/trace1.txt" --timing_trace_out "$W/trace2.txt" --throttle 0.3
wait_pid 240 "$LPID" || die "learner l2 failed"
c1=$(awk '$1=="d"{c[$3]++} END{for(p=0;p<4;p++) printf "%d,", c[p]}' "$W/trace1.txt")
c2=$(awk '$1=="d"{c[$3]++} END{for(p=0;p<4;p++) printf "%d,", c[p]}' "$W/trace2.txt")
check "matched_random: the same push counts per fragment ($c1 = $c2)" [ "$c1" = "$c2" ]
check "matched_random: decisions are events" [ "$(ev_count "$W/events-l2.log" sync_timing policy=matched_random)" -gt 0 ]

# refusals of the learner's options (exit 2, before joining)
refused() { # name expected-text args...
  local n=$1 t=$2; shift 2
  "$LEARNER" --connect "$EP" --device cpu $MODEL --data "$W/corpus.txt" --fragments 4 --threads 1 --steps 10 "$@" \
    > "$W/ref-$n.log" 2>&1
  local rc=$?
  [ $rc = 2 ] && grep -q -- "$t" "$W/ref-$n.log"
}
check "refused: matched_random without a trace" refused mr "needs --timing_trace_in" --sync_timing matched_random
check "refused: a pressure URL off loopback" refused url "loopback" --sync_timing wa --pressure http://10.1.2.3:80/p
check "refused: h_min above h_max" refused hmin "above h_max" --sync_timing wa --h_min 9 --h_max 5
printf 'dloco-timing-trace 1\nfragments 4\np 1 0\np 3 0\nend 3\n' > "$W/bad-trace.txt"
check "refused: a trace that skips a step" refused trace "expected 2" --sync_timing oracle --timing_trace_in "$W/bad-trace.txt"
check "refused: a trace of another run length" refused len "this run --steps" --sync_timing oracle \
  --timing_trace_in "$W/trace1.txt"

# a pressure value refused at run time: named in an event, the learner goes on
printf 'request_rate -4\n' > "$W/neg.txt"
start_learner l3 --steps 30 --sync_timing wa --pressure "$W/neg.txt" --pressure_poll_ms 1
wait_pid 120 "$LPID" || die "learner l3 failed"
check "pressure_refused reason=negative" ev_has "$W/events-l3.log" pressure_refused reason=negative
stop_sync

# dloco-serve: option and request refusals
check "dloco-serve refuses a non-loopback listen" quietly bash -c "! '$SERVE' --listen 0.0.0.0:0"
check "dloco-serve refuses work_iters 0" quietly bash -c "! '$SERVE' --work_iters 0"
check "dloco-loadgen refuses a bad target" quietly bash -c "! '$B/chaos/dloco-loadgen' --target 10.0.0.1:80 --duration_s 1"
: > "$W/events-serve.log"
"$SERVE" --events "$W/events-serve.log" --work_iters 1000 > "$W/serve.log" 2>&1 &
SV=$!; PIDS+=("$SV")
ev_wait 20 "$W/events-serve.log" serve_start || die "dloco-serve did not start"
WK=$(ev_last "$W/events-serve.log" serve_start work) PR=$(ev_last "$W/events-serve.log" serve_start pressure)
get() { # ADDR REQUEST-LINE -> status code
  exec 3<>"/dev/tcp/${1%:*}/${1#*:}" && printf '%s\r\n\r\n' "$2" >&3 && head -c 12 <&3 | cut -c10-12; exec 3>&-
}
check "serve /work 200" [ "$(get "$WK" 'GET /work HTTP/1.0')" = 200 ]
check "serve POST refused 405" [ "$(get "$WK" 'POST /work HTTP/1.0')" = 405 ]
check "serve unknown path 404" [ "$(get "$PR" 'GET /nope HTTP/1.0')" = 404 ]
check "serve malformed 400" [ "$(get "$PR" 'HELLO')" = 400 ]
doc=$(exec 3<>"/dev/tcp/${PR%:*}/${PR#*:}"; printf 'GET /pressure HTTP/1.0\r\n\r\n' >&3; sed '1,/^\r$/d' <&3)
check "serve /pressure is a document the learner accepts (request_rate first)" [ "${doc%% *}" = request_rate ]
kill -TERM "$SV"; wait_pid 20 "$SV"
for r in method path malformed; do check "serve_refused reason=$r" ev_has "$W/events-serve.log" serve_refused reason=$r; done
check "serve_summary counts the /work request" [ "$(ev_last "$W/events-serve.log" serve_summary requests)" = 1 ]
[ $fail = 0 ] && echo "PASS: test_wa" || echo "FAIL: test_wa"
exit $fail
