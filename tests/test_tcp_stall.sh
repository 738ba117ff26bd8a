#!/bin/bash
# A learner's connection across a real cut link (--tcp_stall_ms): dloco-chaos
# with network namespaces, a far learner behind a veth link (100 Mbit/s,
# 20 ms RTT) and a near one, 24 s; the far link is cut (veth down) from 4 s
# to 14 s. While it is down the far learner's Heartbeats stay
# unacknowledged, and TCP backs off its retransmissions: without a bound the
# connection resends them seconds to tens of seconds after the link is back
# (bench/wan.sh, 2026-12-05: a thin learner rejoined 21.5 s after a 15 s
# partition ended, its Hellos queued behind the backoff). With
# --tcp_stall_ms 2000 the kernel drops the stalled connection, the learner
# rebuilds its socket and tries a new connection every 2 s at most.
# Asserts, from the events: the far learner's socket was rebuilt as
# "disconnected" while the link was down (the kernel dropped it: without
# the option nothing ends that connection during a 10 s cut, the silence
# rebuild waits 30 s), the synchronizer saw it join again after the cut,
# it pushed every fragment again before its final flush (the Acks the old
# connection took are replaced by the Welcome's answered_bases and the
# answers sent again: without them each fragment's next push waited
# push_decision_timeout_ms, 30 s, longer than the rest of the run), and a
# push of it after the cut was merged. Prints, not
# asserts, the seconds from the link's return to the learner's Welcome.
# Needs root (namespaces, tc): SKIP otherwise.
set -u
TEST_NAME=tcp_stall
. "$(dirname "$0")/lib_cluster.sh"
need_netns
make_corpus
cat > "$W/stall.ini" <<EOF
[run]
name = stall
seed = 5
duration_s = 24
eval_every_s = 0
eval_batches = 2
n_layer = 2
n_head = 2
n_embd = 64
seq_len = 32
fragments = 4
H = 16
corpus = $W/corpus.txt

[learners]
batch = 8
args = --warmup 5 --step_ms_min 15 --tcp_stall_ms 2000

[dc far]
bandwidth_mbit = 100
rtt_ms = 20

[dc near]
rtt_ms = 2

[learner f]
dc = far
[learner n]
dc = near

[fault cut]
kind = partition
target = far
at_s = 4
duration_s = 10
EOF
OUT="$W/out"
timeout -k 10 120 "$CHAOS" run "$W/stall.ini" --out "$OUT" > "$W/chaos.log" 2>&1
rc=$?
grep -E "^\[chaos|^dloco-chaos" "$W/chaos.log" | tail -5
check "dloco-chaos run exited 0 (rc $rc)" [ "$rc" = 0 ]
grep -q "namespace" "$W/chaos.log" || echo "note: the harness did not say it used network namespaces"
SEV=$(ls "$OUT"/*/events-sync.log 2>/dev/null | head -1)
[ -n "$SEV" ] || die "no synchronizer events under $OUT"
PYTHONPATH="$(cd "$(dirname "$0")" && pwd)" /usr/bin/python3 - "$(dirname "$SEV")" <<'PY' || fail=1
import sys
import chaos_events
from chaos_events import check, events
d = sys.argv[1]
t_begin, t_end = chaos_events.partition_window(d, "cut")
lev = list(events(d + "/events-f.log"))
sev = list(events(d + "/events-sync.log"))
rebuilt = [e for e in lev if e["event"] == "socket_rebuild" and t_begin < e["ts"] <= t_end]
print("f's socket rebuilds during the cut: %s" % [(round((e["ts"] - t_begin) / 1e9, 2), e["reason"]) for e in rebuilt])
check(any(e["reason"] == "disconnected" for e in rebuilt),
      "the kernel dropped f's stalled connection while the link was down (a socket_rebuild reason=disconnected "
      "during the cut)")
joins = [e for e in sev if e["event"] == "learner_join" and e.get("id") == "f" and e["ts"] > t_end]
check(len(joins) > 0, "the synchronizer saw f join again after the cut (%d joins)" % len(joins))
welcome = [e for e in lev if e["event"] == "welcome" and e["ts"] > t_end]
if welcome:
    print("f's first Welcome came %.2f s after the link was back" % ((welcome[0]["ts"] - t_end) / 1e9))
# its pushes after the cut are not held for the answers the dropped connection took (push_decision_timeout_ms,
# 30 s: longer than the rest of the run): the Welcome's answered_bases and the Acks sent again decide them
unans = [e for e in lev if e["event"] == "push_unanswered" and e["ts"] > t_end]
print("f after the cut: %d pushes found unanswered by its Welcome: %s" % (len(unans),
      [(e["fragment"], e["base_version"], e["answered_base"]) for e in unans]))
live = [e for e in lev if e["event"] == "push" and e["ts"] > t_end and e.get("final") == "0"]
frags = sorted({e["fragment"] for e in live})
check(frags == ["0", "1", "2", "3"], "f pushed every fragment again after the cut before its final flush (fragments "
      "%s, %d pushes; each fragment's push waited for the answers the dropped connection took, 30 s, before the "
      "answers again)" % (frags, len(live)))
pushes = [e for e in sev if e["event"] == "push" and e.get("id") == "f" and e["ts"] > t_end]
merged = [e for e in sev if e["event"] == "merge_contrib" and e.get("id") == "f" and e["ts"] > t_end]
check(len(pushes) > 0 and len(merged) > 0,
      "f pushed after the cut and a push of it was merged (%d pushes, %d merged)" % (len(pushes), len(merged)))
sys.exit(1 if chaos_events.failures else 0)
PY
[ $fail = 0 ] && echo "test_tcp_stall: all checks passed" || { echo "test_tcp_stall: FAILED"; tail -20 "$W/chaos.log"; }
exit $fail
