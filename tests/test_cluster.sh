#!/bin/bash
# Integration: 1 dloco-sync + 3 dloco-learner processes on loopback train one
# tiny GPT together. Checks: merges happen and every fragment's version
# advances, every learner adopts merged updates, the global model's
# validation loss falls, a learner of another model is refused, and a restart
# of the synchronizer resumes from LMDB at the same versions, with merges
# continuing. Bounded: every wait has a deadline; only our own PIDs are killed.
set -u
B=${DLOCO_BIN:-build}
SYNC=$B/synchronizer/dloco-sync LEARNER=$B/learner/dloco-learner DLOCO=$B/tools/dloco
W=$(mktemp -d /tmp/dloco_cluster.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$W"; }
trap cleanup EXIT
fail=0
die() { echo "FAIL: $*"; for f in "$W"/*.log; do echo "== $f"; tail -20 "$f"; done; exit 1; }

for i in $(seq 1 3000); do echo "line $i: the quick brown fox jumps over the lazy dog number $((i * 7919 % 1000))."; done > "$W/corpus.txt"
MODEL="--n_layer 2 --n_head 2 --n_embd 32 --seq_len 32"
SYNC_ARGS="--store $W/store --bind tcp://127.0.0.1:0 $MODEL --vocab 256 --fragments 4 --H 8 --heartbeat_ms 200 --status_every_ms 0 --durability sync"

start_sync() { # $1 = log name; sets SPID and EP
  "$SYNC" $SYNC_ARGS > "$W/$1.log" 2>&1 &
  SPID=$!; PIDS+=("$SPID")
  EP=""
  for _ in $(seq 1 100); do
    EP=$(sed -n 's/^dloco-sync: listening on //p' "$W/$1.log")
    [ -n "$EP" ] && break
    kill -0 "$SPID" 2>/dev/null || die "dloco-sync exited at start"
    sleep 0.1
  done
  [ -n "$EP" ] || die "dloco-sync did not start"
}
stop_sync() { kill -TERM "$SPID"; for _ in $(seq 1 100); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$SPID" 2>/dev/null && die "dloco-sync did not stop on SIGTERM"; wait "$SPID" 2>/dev/null; }
wait_pids() { # deadline-seconds pids...
  local deadline=$(( $(date +%s) + $1 )); shift
  for p in "$@"; do
    while kill -0 "$p" 2>/dev/null; do [ "$(date +%s)" -lt "$deadline" ] || die "learner $p still running after the deadline"; sleep 0.2; done
  done
}
versions() { "$DLOCO" status "$W/store" | sed -n 's/^versions: //p'; }
val_loss() { "$DLOCO" eval "$W/store" --data "$W/corpus.txt" --batch 8 --val_batches 8 | sed -E 's/.*val loss ([0-9.]+).*/\1/'; }

start_sync sync1
v0=$(val_loss); echo "global model before training: val loss $v0 (versions $(versions))"

LPIDS=()
for i in 0 1 2; do
  "$LEARNER" --connect "$EP" --id "learner-$i" $MODEL --data "$W/corpus.txt" --batch 8 --steps 96 --warmup 5 \
    --lr 3e-3 --fragments 4 --data_shard $i --data_shards 3 --seed $((100 + i)) --log_every 32 \
    --log_acks "$W/acks-$i.txt" --threads 1 > "$W/learner-$i.log" 2>&1 &
  LPIDS+=($!); PIDS+=($!)
done
wait_pids 240 "${LPIDS[@]}"
for i in 0 1 2; do
  wait "${LPIDS[$i]}"; rc=$?
  [ $rc = 0 ] || { echo "FAIL: learner-$i exited $rc"; tail -5 "$W/learner-$i.log"; fail=1; }
  s=$(grep '^learner-summary:' "$W/learner-$i.log")
  adopted=$(echo "$s" | sed -E 's/.*updates_adopted=([0-9]+).*/\1/')
  accepted=$(echo "$s" | sed -E 's/.* accepted=([0-9]+).*/\1/')
  echo "learner-$i: updates_adopted=$adopted accepted=$accepted"
  [ "${adopted:-0}" -gt 0 ] && [ "${accepted:-0}" -gt 0 ] || { echo "FAIL: learner-$i adopted nothing: $s"; fail=1; }
done

vers1=$(versions); echo "versions after training: $vers1"
for v in $vers1; do [ "$v" -gt 0 ] || { echo "FAIL: a fragment never merged ($vers1)"; fail=1; }; done
merges=$("$DLOCO" status "$W/store" | sed -n 's/^merges \([0-9]*\):.*/\1/p')
echo "merge records: $merges"
[ "${merges:-0}" -ge 8 ] || { echo "FAIL: too few merges ($merges)"; fail=1; }
v1=$(val_loss); echo "global model after training: val loss $v1"
python3 -c "import sys; sys.exit(0 if $v1 < $v0 - 0.5 else 1)" || { echo "FAIL: global val loss did not fall ($v0 -> $v1)"; fail=1; }

# a learner of another model is refused with the reason, exit 3
out=$("$LEARNER" --connect "$EP" --id intruder --n_layer 2 --n_head 2 --n_embd 64 --seq_len 32 \
      --data "$W/corpus.txt" --steps 5 --fragments 4 --connect_timeout_ms 10000 2>&1); rc=$?
if [ $rc = 3 ] && echo "$out" | grep -q "does not match the run"; then echo "ok: mismatched model refused (exit 3): $(echo "$out" | grep -m1 "does not match" | cut -c1-200)";
else echo "FAIL: mismatched learner rc=$rc: $(echo "$out" | tail -3)"; fail=1; fi

stop_sync
grep -q '^sync-summary:' "$W/sync1.log" || { echo "FAIL: no sync summary"; fail=1; }
"$DLOCO" check "$W/store" > "$W/check1.txt" 2>&1 || { echo "FAIL: dloco check after run"; cat "$W/check1.txt"; fail=1; }

# restart: same store, same versions, epoch 2, merges continue
start_sync sync2
grep -q "epoch 2: resumed" "$W/sync2.log" || { echo "FAIL: restart did not resume at epoch 2"; grep epoch "$W/sync2.log"; fail=1; }
vers2=$(versions)
[ "$vers2" = "$vers1" ] && echo "ok: restart resumed at the same versions ($vers2)" || { echo "FAIL: versions changed across restart: $vers1 -> $vers2"; fail=1; }
"$LEARNER" --connect "$EP" --id learner-late $MODEL --data "$W/corpus.txt" --batch 8 --steps 24 --fragments 4 \
  --log_every 8 --threads 1 > "$W/learner-late.log" 2>&1 &
lp=$!; PIDS+=($lp)
wait_pids 120 $lp
wait $lp || { echo "FAIL: late learner failed"; tail -5 "$W/learner-late.log"; fail=1; }
vers3=$(versions); echo "versions after a late learner on the restarted synchronizer: $vers3"
set -- $vers2; for v in $vers3; do [ "$v" -gt "$1" ] || { echo "FAIL: fragment did not advance after restart ($vers2 -> $vers3)"; fail=1; }; shift; done
stop_sync
"$DLOCO" check "$W/store" > "$W/check2.txt" 2>&1 && echo "ok: dloco check passes: $(grep result "$W/check2.txt")" || { echo "FAIL: dloco check"; cat "$W/check2.txt"; fail=1; }

[ $fail = 0 ] && echo "test_cluster: all checks passed" || echo "test_cluster: FAILED"
exit $fail
