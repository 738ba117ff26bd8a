#!/bin/bash
# Integration: encoded pushes and delta Updates over real sockets. 1 dloco-sync
# with int4 delta Updates (--update_codec int4) + 3 dloco-learner processes
# pushing in three codecs (int4 with error feedback, e3m0 with stochastic
# rounding, topk), one of them stopped (SIGSTOP) for a while so that it misses
# versions, and --max_staleness 0 so that stale pushes are dropped and rebased.
# Checks, from the event logs: every fragment version any learner took as its
# base (full Update or rebuilt from deltas: `update_base`) hashes exactly like
# what the synchronizer committed at that version (`merge hash=`), bit for
# bit; deltas were applied; full Updates of merged versions came too (missed
# versions, rebases); the synchronizer merged pushes of every codec; all
# learners exit 0; the global validation loss falls. Bounded waits, own PIDs.
set -u
TEST_NAME=codec_cluster
. "$(dirname "$0")/lib_cluster.sh"
make_corpus

start_sync sync --update_codec int4 --update_block 16 --max_staleness 0 $OUTER
v0=$(val_loss); echo "global model before training: val loss $v0"
start_learner l-int4 --steps 120 --data_shard 0 --data_shards 3 --seed 11 --push_codec int4 --push_block 16 --adopt keep
L0=$LPID
start_learner l-e3m0 --steps 120 --data_shard 1 --data_shards 3 --seed 12 --push_codec e3m0 --push_block 32 \
  --push_rounding stochastic --adopt keep
L1=$LPID
start_learner l-topk --steps 120 --data_shard 2 --data_shards 3 --seed 13 --push_codec topk --push_block 32 \
  --push_topk 8 --adopt overwrite
L2=$LPID

# stop one learner once training is under way, long enough for versions to move on
wait_until 120 '[ "$(steps_of l-e3m0)" -ge 30 ]' || die "l-e3m0 did not reach step 30"
kill -STOP "$L1"; sleep 3; kill -CONT "$L1"
for n in l-int4:$L0 l-e3m0:$L1 l-topk:$L2; do
  wait_pid 300 "${n#*:}"; rc=$?
  check "${n%%:*} exited 0 (rc $rc)" [ "$rc" = 0 ]
done
stop_sync

S=$W/events-sync.log
python3 - "$S" "$W"/events-l-*.log <<'PY'
import sys
def events(path, name):  # logfmt lines (docs/EVENTS.md); the fields read here are never quoted
    for line in open(path):
        kv = dict(x.split('=', 1) for x in line.split() if '=' in x)
        if kv.get('event') == name:
            yield kv
committed = {(int(e['frag']), int(e['version'])): e['hash'] for e in events(sys.argv[1], 'merge')}
bad = checked = delta = full = 0
for path in sys.argv[2:]:
    for e in events(path, 'update_base'):
        key = (int(e['fragment']), int(e['version']))
        if key[1] == 0:
            continue  # the initial model: no merge event
        checked += 1
        if e['delta'] == '1': delta += 1
        else: full += 1
        if committed.get(key) != e['hash']:
            bad += 1
            if bad <= 5: print('mismatch %s frag %d v%d: learner %s, synchronizer %s' % (path, key[0], key[1], e['hash'], committed.get(key)))
print('bases checked: %d (delta %d, full %d), mismatches %d, merges %d' % (checked, delta, full, bad, len(committed)))
open(sys.argv[1] + '.bases', 'w').write('%d %d %d %d\n' % (checked, delta, full, bad))
PY
read -r nb nd nf nbad < "$S.bases"
check "every base a learner took equals the committed fragment bit for bit ($nb bases, $nbad mismatches)" [ "$nb" -gt 0 ] && [ "$nbad" = 0 ]
check "delta Updates were applied ($nd)" [ "$nd" -gt 0 ]
check "full Updates of merged versions came too: missed versions or rebases ($nf)" [ "$nf" -gt 0 ]
missed=$(cat "$W"/events-l-*.log | ev_count - update_delta_missed)
drops=$(ev_count "$S" push decision=dropped_stale)
echo "delta updates dropped for a version not held: $missed; pushes dropped stale (rebased): $drops"
for c in int4 e3m0 topk; do
  n=$(cat "$W"/events-l-*.log | ev_count - push codec=$c)
  check "pushes in $c were sent ($n)" [ "$n" -gt 0 ]
done
acc=0; for n in l-int4 l-e3m0 l-topk; do a=$(ev_last "$W/events-$n.log" learner_summary accepted); acc=$((acc + ${a:-0})); done
check "the synchronizer merged encoded pushes ($acc accepted)" [ "$acc" -gt 0 ]
read -r ufull udelta <<< "$(ev_last "$S" sync_summary "updates_full updates_delta")"
echo "synchronizer sent $ufull full and $udelta delta Updates"
v1=$(val_loss); echo "global model after training: val loss $v1"
check "global val loss fell by more than 0.5 ($v0 -> $v1)" python3 -c "import sys; sys.exit(0 if $v1 < $v0 - 0.5 else 1)"
exit $fail
