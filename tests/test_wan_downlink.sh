#!/bin/bash
# The downlink over a real thin link (issue 32): dloco-chaos with network
# namespaces, one learner behind tbf at 3 Mbit/s and 80 ms RTT, two near
# ones, 116 KB fragments and the programs' own transfer defaults (chunks of
# 1 MiB, heartbeat 500 ms x liveness 6, update_codec int4), 20 s, no faults.
# Asserts, from the learners' update_base events and the synchronizer's
# sync_learner events: the thin learner, which cannot take a full fragment
# per merge, rebuilds most versions it takes from int4 deltas (the chain
# from what it holds when it is behind; before issue 32 every Update was a
# full fp32 fragment), and far fewer bytes reach it than full Updates of the
# versions it took would be. Prints, not asserts, its merged pushes, its
# pacing figures (control_behind_max_bytes, the drain rate the synchronizer
# measured) and how long its pushes waited for their first Ack: in this
# harness the datacenter's relay (it adds the delay; up to 8 MiB queued per
# direction) and the loopback kernel buffers before it hold what the
# synchronizer's libzmq queue no longer does, so those waits are still
# seconds (docs/ARCHITECTURE.md "Downlink pacing": what pacing cannot see).
# Needs root (namespaces, tc): SKIP otherwise.
set -u
TEST_NAME=wan_downlink
. "$(dirname "$0")/lib_cluster.sh"
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root for network namespaces and tc"; exit 77; }
command -v tc > /dev/null || { echo "SKIP: no tc"; exit 77; }
CHAOS=$B/chaos/dloco-chaos
[ -x "$CHAOS" ] || die "no $CHAOS"
make_corpus
cat > "$W/wan.ini" <<EOF
[run]
name = wan
seed = 3
duration_s = 20
eval_every_s = 0
eval_batches = 2
n_layer = 2
n_head = 2
n_embd = 64
seq_len = 32
fragments = 4
H = 16
corpus = $W/corpus.txt

[sync]
heartbeat_ms = 500
liveness = 6
chunk_kb = 1024

[learners]
batch = 8
adopt = keep
args = --warmup 5

[dc thin]
bandwidth_mbit = 3
rtt_ms = 80

[dc near]
rtt_ms = 2

[learner t]
dc = thin
[learner n]
dc = near
count = 2
EOF
OUT="$W/out"
timeout -k 10 120 "$CHAOS" run "$W/wan.ini" --out "$OUT" > "$W/chaos.log" 2>&1
rc=$?
grep -E "^\[chaos|^dloco-chaos" "$W/chaos.log" | tail -5
check "dloco-chaos run exited 0 (rc $rc)" [ "$rc" = 0 ]
grep -q "namespace" "$W/chaos.log" || echo "note: the harness did not say it used namespaces"
SEV=$(grep -l "event=sync_learner" "$OUT"/*/events-sync*.log 2>/dev/null | head -1)
[ -n "$SEV" ] || die "no sync_learner events under $OUT"
behind=$(ev_last "$SEV" sync_learner control_behind_max_bytes id=t)
rate=$(ev_last "$SEV" sync_learner drain_bytes_per_s id=t)
merged=$(ev_last "$SEV" sync_learner merged id=t)
echo "thin learner t: control_behind_max_bytes=$behind drain_bytes_per_s=$rate merged=$merged"
LEV=$(ls "$OUT"/*/events-t.log 2>/dev/null | head -1)
[ -n "$LEV" ] || die "no events of learner t under $OUT"
deltas=$(ev_count "$LEV" update_base delta=1)
fulls=$(ev_count "$LEV" update_base delta=0)
down=$(grep "event=link dc=thin" "$W/chaos.log" | tail -1 | sed -n 's/.*down_bytes=\([0-9]*\).*/\1/p')
fragb=$(( 116 * 1024 ))
echo "t: took $deltas versions from deltas and $fulls full; its link carried ${down:-?} bytes down"
check "t rebuilt most versions it took from deltas ($deltas deltas, $fulls full)" [ "$deltas" -gt "$fulls" ]
check "t's link carried less than half of full Updates of what it took (${down:-?} < ($deltas + $fulls) x 116 KiB / 2)" \
  [ "${down:-999999999999}" -lt $(( (deltas + fulls) * fragb / 2 )) ]
if [ -n "$LEV" ]; then
  /usr/bin/python3 - "$LEV" <<'PY'
import re, sys
push, waits = {}, []
for line in open(sys.argv[1]):
    ts = re.search(r'\bts=(\S+)', line)
    ev = re.search(r'\bevent=(\S+)', line)
    if not ts or not ev:
        continue
    f = dict(re.findall(r'(\w+)=(\S+)', line))
    key = (f.get('fragment'), f.get('base_version'))
    if ev.group(1) == 'push':
        push[key] = ts.group(1)
    elif ev.group(1) == 'ack' and key in push:
        t0, t1 = push.pop(key), ts.group(1)
        try:
            waits.append((int(t1) - int(t0)) / 1e9)
        except ValueError:
            pass
if waits:
    waits.sort()
    print("t: %d pushes acked; wait for the first Ack: median %.2f s, max %.2f s" % (len(waits), waits[len(waits) // 2], waits[-1]))
PY
fi
[ $fail = 0 ] && echo "test_wan_downlink: all checks passed" || { echo "test_wan_downlink: FAILED"; tail -20 "$W/chaos.log"; }
exit $fail
