#!/bin/bash
# The downlink over a real thin link (issue 32): dloco-chaos with network
# namespaces, one learner behind tbf at 3 Mbit/s and 80 ms RTT, two near
# ones, 116 KB fragments and the programs' own transfer defaults (chunks of
# 1 MiB, heartbeat 500 ms x liveness 6, update_codec int4), 22 s; the thin
# link is cut (veth down) from 4 s to 9 s while the near learners move every
# fragment some 20-50 versions on (merges outrun the thin link here). Every
# learner's step takes at least 15 ms (--step_ms_min): what the test holds is
# a ratio of the fleet's versions per second to the thin link, and on a
# faster machine the unpaced fleet made 120-130 versions of each fragment
# during the cut, ~24 a second: more than a 3 Mbit/s learner can follow
# within max_staleness 32 at all (docs/DEPLOY.md "Across datacenters" says
# how to set it for such a fleet), so its longest push was dropped stale.
# Asserts, from the learners' update_base events and the synchronizer's
# sync_learner events: the thin learner, which cannot take a full fragment
# per merge, rebuilds most versions it takes from int4 deltas (the chain
# from what it holds when it is behind; before issue 32 every Update was a
# full fp32 fragment), and far fewer bytes reach it than full Updates of the
# versions it took would be. And after the cut, from the synchronizer's push
# and merge_contrib events: the thin learner's pushes are merged -- the one
# with the most steps (the cut's progress) is in a merge, and at most one
# per fragment (those in flight at the cut) is dropped stale. Before the
# path's bound (docs/ARCHITECTURE.md "Downlink pacing") the datacenter's
# relay (it adds the delay; up to 8 MiB queued per direction) and the
# kernel buffers took every version made during the cut, the learner got
# them and its Welcome seconds late, and every push it made after the cut
# was dropped stale for the rest of the run. Prints, not asserts, its
# pacing figures (control_behind_max_bytes, the drain rate the synchronizer
# measured, path_inflight_max_bytes, the path's delivery rate and what it
# held unreported once the bytes bound applied), the versions it adopted after the cut
# that were already more than max_staleness behind, and how long its pushes
# waited for their first Ack.
# Needs root (namespaces, tc): SKIP otherwise.
set -u
TEST_NAME=wan_downlink
. "$(dirname "$0")/lib_cluster.sh"
need_netns
make_corpus
cat > "$W/wan.ini" <<EOF
[run]
name = wan
seed = 3
duration_s = 22
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
args = --warmup 5 --step_ms_min 15

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

[fault cut]
kind = partition
target = thin
at_s = 4
duration_s = 5
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
inflight=$(ev_last "$SEV" sync_learner path_inflight_max_bytes id=t)
deepmax=$(ev_last "$SEV" sync_learner path_inflight_deep_max_bytes id=t)
pathrate=$(ev_last "$SEV" sync_learner path_bytes_per_s id=t)
echo "thin learner t: control_behind_max_bytes=$behind drain_bytes_per_s=$rate path_inflight_max_bytes=${inflight:-?} path_bytes_per_s=${pathrate:-?} path_inflight_deep_max_bytes=${deepmax:-?} merged=$merged"
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
PYTHONPATH="$(cd "$(dirname "$0")" && pwd)" /usr/bin/python3 - "$(dirname "$SEV")" <<'PY' || fail=1
import re, sys
d = sys.argv[1]
import chaos_events
from chaos_events import check, events
t_begin, t_end = chaos_events.partition_window(d, "cut")
sync = list(events(d + "/events-sync.log"))
merges = [(e["ts"], e["frag"], int(e["version"])) for e in sync if e["event"] == "merge"]
top, moved = {}, 0
for ts, f, v in merges:
    if ts <= t_begin: top[f] = v
    elif ts <= t_end: moved = max(moved, v - top.get(f, 0))
print("the fleet moved a fragment %d versions during the cut" % moved)
maxs = 32  # the programs' default max_staleness (core/defaults.h)
def global_at(ts, f):
    v = 0
    for t, g, w in merges:
        if t > ts: break
        if g == f: v = w
    return v
old = [e for e in events(d + "/events-t.log") if e["event"] == "update_base" and e["ts"] > t_end
       and global_at(e["ts"], e["fragment"]) - int(e["version"]) > maxs]
print("t adopted %d versions after the cut that were more than %d behind when they came" % (len(old), maxs))
pushes = [e for e in sync if e["event"] == "push" and e.get("id") == "t" and e["ts"] > t_end]
merged = {(e["frag"], e["base"], e["tokens"]) for e in sync if e["event"] == "merge_contrib" and e.get("id") == "t"}
stale = [e for e in pushes if e["decision"] == "dropped_stale"]
print("t after the cut: %d pushes, %d dropped stale, decisions %s" % (len(pushes), len(stale),
      [(e["decision"], int(e["steps"])) for e in pushes]))
check(len(pushes) > 0, "t pushed after the cut (%d pushes)" % len(pushes))
if pushes:
    big = max(pushes, key=lambda e: int(e["steps"]))
    check((big["frag"], big["base"], big["tokens"]) in merged,
          "t's longest push after the cut (%s steps, fragment %s, base %s) was merged (%s)"
          % (big["steps"], big["frag"], big["base"], big["decision"]))
    per = {}
    for e in stale: per[e["frag"]] = per.get(e["frag"], 0) + 1
    check(all(n <= 1 for n in per.values()),
          "at most one of t's pushes per fragment was dropped stale after the cut (those in flight at it): %s" % per)
sys.exit(1 if chaos_events.failures else 0)
PY
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
