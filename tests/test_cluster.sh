#!/bin/bash
# Integration: 1 dloco-sync + 3 dloco-learner processes on loopback train one
# tiny GPT together. Checks: merges happen and every fragment's version
# advances, every learner adopts merged updates, the global model's
# validation loss falls, a learner of another model is refused, and a restart
# of the synchronizer resumes from LMDB at the same versions, with merges
# continuing. Bounded: every wait has a deadline; only our own PIDs are killed.
set -u
TEST_NAME=cluster
. "$(dirname "$0")/lib_cluster.sh"
make_corpus

start_sync sync1 --durability sync $OUTER --eval_data "$W/corpus.txt"
v0=$(val_loss); echo "global model before training: val loss $v0 (versions $(versions))"

LP=()
for i in 0 1 2; do
  start_learner "learner-$i" --steps 96 --data_shard $i --data_shards 3 --seed $((100 + i)) --log_every 32
  LP+=("$LPID")
done
for i in 0 1 2; do
  wait_pid 240 "${LP[$i]}"; rc=$?
  [ $rc = 0 ] || { echo "FAIL: learner-$i exited $rc"; tail -5 "$W/learner-$i.log"; fail=1; }
  read -r adopted accepted <<< "$(ev_last "$W/events-learner-$i.log" learner_summary "updates_adopted accepted")"
  echo "learner-$i: updates_adopted=$adopted accepted=$accepted"
  [ "${adopted:-0}" -gt 0 ] && [ "${accepted:-0}" -gt 0 ] || { echo "FAIL: learner-$i adopted nothing (updates_adopted=$adopted accepted=$accepted)"; fail=1; }
done

vers1=$(versions); echo "versions after training: $vers1"
for v in $vers1; do [ "$v" -gt 0 ] || { echo "FAIL: a fragment never merged ($vers1)"; fail=1; }; done
m=$(merges); echo "merge records: $m"
[ "${m:-0}" -ge 8 ] || { echo "FAIL: too few merges ($m)"; fail=1; }
v1=$(val_loss); echo "global model after training: val loss $v1"
check "global val loss fell by more than 0.5 ($v0 -> $v1)" python3 -c "import sys; sys.exit(0 if $v1 < $v0 - 0.5 else 1)"

# a learner of another model is refused with the reason, exit 3
out=$("$LEARNER" --connect "$EP" --id intruder --state_dir "$W" --device cpu --n_layer 2 --n_head 2 --n_embd 64 --seq_len 32 \
      --data "$W/corpus.txt" --steps 5 --fragments 4 --connect_timeout_ms 10000 2>&1); rc=$?
if [ $rc = 3 ] && echo "$out" | grep -q "does not match the run"; then
  echo "ok: mismatched model refused (exit 3): $(echo "$out" | grep -m1 "does not match" | cut -c1-200)"
else echo "FAIL: mismatched learner rc=$rc: $(echo "$out" | tail -3)"; fail=1; fi
# so is one with another fragment count (P is part of the fingerprint)
out=$("$LEARNER" --connect "$EP" --id intruder2 --state_dir "$W" --device cpu $MODEL --data "$W/corpus.txt" --steps 5 --fragments 8 \
      --connect_timeout_ms 10000 2>&1); rc=$?
if [ $rc = 3 ] && echo "$out" | grep -q "does not match the run"; then
  echo "ok: another fragment count refused (exit 3)"
else echo "FAIL: learner with --fragments 8 rc=$rc: $(echo "$out" | tail -3)"; fail=1; fi

stop_sync
check "the synchronizer wrote its summary" ev_has "$W/events-sync1.log" sync_summary
# the final model is evaluated at a clean stop, on the run's data, and that
# is the store's record: dloco eval without --data uses the recorded data
# and gets the same loss on the same 256 sequences
check "the final model was evaluated on the run's data" \
  ev_has "$W/events-sync1.log" eval final=1 data="$W/corpus.txt"
fin=$(ev_last "$W/events-sync1.log" eval loss)
out=$("$DLOCO" eval "$W/store"); echo "$out"
check "dloco eval without --data names the recorded data" grep -q "val loss [0-9.]* on $W/corpus.txt (the run's recorded" <<< "$out"
ev=$(sed -E 's/.*val loss ([0-9.]+).*/\1/' <<< "$out")
check "... and its loss is the final evaluation's ($ev vs $fin)" python3 -c "import sys; sys.exit(0 if abs($ev - $fin) < 1e-3 else 1)"
check "dloco status STORE names the data of its loss" \
  bash -c "'$DLOCO' status '$W/store' | grep -q '^global validation loss [0-9.]* on $W/corpus.txt at total version'"
check "dloco check after the run" quietly "$DLOCO" check "$W/store"

# restart: same store, same versions, epoch 2, merges continue
start_sync sync2 --durability sync $OUTER
check "the first start was a new run at epoch 1" ev_has "$W/events-sync1.log" sync_start epoch=1 resumed=0
check "restart resumed at epoch 2" ev_has "$W/events-sync2.log" sync_start epoch=2 resumed=1
check "without --eval_data the synchronizer warns that it evaluates on the built-in default" \
  grep -q "evaluated on /usr/share/games/fortunes, the built-in default" "$W/sync2.log"
vers2=$(versions)
check "restart resumed at the same versions ($vers1 -> $vers2)" [ "$vers2" = "$vers1" ]
start_learner learner-late --steps 24 --log_every 8
wait_pid 120 "$LPID" || { echo "FAIL: late learner failed"; tail -5 "$W/learner-late.log"; fail=1; }
vers3=$(versions); echo "versions after a late learner on the restarted synchronizer: $vers3"
set -- $vers2; for v in $vers3; do [ "$v" -gt "$1" ] || { echo "FAIL: fragment did not advance after restart ($vers2 -> $vers3)"; fail=1; }; shift; done
stop_sync
check "dloco check passes at the end" quietly "$DLOCO" check "$W/store"

[ $fail = 0 ] && echo "test_cluster: all checks passed" || echo "test_cluster: FAILED"
exit $fail
