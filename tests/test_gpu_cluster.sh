#!/bin/bash
# GPU integration: a standalone learner trains on the GPU and its checkpoint
# resumes on the cpu; then 1 dloco-sync + one --device cuda learner (adopt
# keep: deferred pushes and device-side adopts) + one --device cpu learner
# train one tiny GPT together. Checks: both finish, both have merged pushes
# and adopted updates, every fragment's version advances, the synchronizer
# saw a cuda and a cpu learner, the global validation loss falls.
# Exits 77 (CTest: Skipped) when dloco-learner finds no usable GPU.
set -u
TEST_NAME=gpu_cluster
. "$(dirname "$0")/lib_cluster.sh"
make_corpus

# ---- does this machine have a GPU the learner can use?
out=$("$LEARNER" --standalone --device cuda $MODEL --data "$W/corpus.txt" --batch 8 --steps 20 --warmup 2 \
      --val_every 10 --val_batches 2 --log_every 10 --checkpoint "$W/gpu.ckpt" --events "$W/events-sa-gpu.log" 2>&1); rc=$?
if [ $rc = 2 ] && echo "$out" | grep -q -- "--device cuda: "; then
  echo "$out" | grep -- "--device cuda"
  if [ "${DLOCO_REQUIRE_CUDA:-0}" = 1 ]; then echo "FAIL: DLOCO_REQUIRE_CUDA=1 but no usable CUDA device"; exit 1; fi
  echo "SKIP: no CUDA device — GPU cluster test did not run"
  exit 77
fi
[ $rc = 0 ] || { echo "FAIL: standalone --device cuda rc=$rc"; echo "$out" | tail -20; exit 1; }
echo "device: $(ev_last "$W/events-sa-gpu.log" device desc)"
check "standalone cuda run was on the GPU" ev_has "$W/events-sa-gpu.log" device "device~^cuda:0 "
check "standalone cuda run trained 20 steps" ev_has "$W/events-sa-gpu.log" train_summary steps=20 step=20
check "and wrote its checkpoint at step 20" ev_has "$W/events-sa-gpu.log" checkpoint step=20
out=$("$LEARNER" --standalone --device cpu $MODEL --data "$W/corpus.txt" --batch 8 --steps 30 --warmup 2 \
      --val_every 10 --val_batches 2 --log_every 10 --resume "$W/gpu.ckpt" --events "$W/events-sa-cpu.log" 2>&1); rc=$?
check "a GPU checkpoint resumes on the cpu (rc $rc)" ev_has "$W/events-sa-cpu.log" resumed step=20
check "and trains on to step 30" ev_has "$W/events-sa-cpu.log" train_summary steps=10 step=30

# ---- the mixed cluster
start_sync sync --durability sync
v0=$(val_loss); echo "global model before training: val loss $v0"
# the GPU learner is much faster: give it more steps, so both overlap in time
start_learner gpu-0 --device cuda --adopt keep --steps 300 --data_shard 0 --data_shards 2 --seed 100 --log_every 100
GP=$LPID
start_learner cpu-1 --device cpu --steps 96 --data_shard 1 --data_shards 2 --seed 101 --log_every 32
CP=$LPID
for l in gpu-0 cpu-1; do
  pid=$GP; [ $l = cpu-1 ] && pid=$CP
  wait_pid 240 "$pid"; rc=$?
  [ $rc = 0 ] || { echo "FAIL: $l exited $rc"; tail -20 "$W/$l.log"; fail=1; }
  read -r adopted accepted <<< "$(ev_last "$W/events-$l.log" learner_summary "updates_adopted accepted")"
  echo "$l: device $(ev_last "$W/events-$l.log" device desc) | updates_adopted=$adopted accepted=$accepted"
  [ "${adopted:-0}" -gt 0 ] && [ "${accepted:-0}" -gt 0 ] || { echo "FAIL: $l merged or adopted nothing (updates_adopted=$adopted accepted=$accepted)"; fail=1; }
done
check "the cuda learner ran on the GPU" ev_has "$W/events-gpu-0.log" device "device~^cuda:0 "
check "the synchronizer saw a cuda learner (Hello.device)" ev_has "$W/events-sync.log" learner_join id=gpu-0 "device~^cuda:0 "
check "and a cpu learner" ev_has "$W/events-sync.log" learner_join id=cpu-1 device=cpu
vers=$(versions); echo "versions after training: $vers"
for v in $vers; do [ "$v" -gt 0 ] || { echo "FAIL: a fragment never merged ($vers)"; fail=1; }; done
m=$(merges); echo "merge records: $m"
[ "${m:-0}" -ge 8 ] || { echo "FAIL: too few merges ($m)"; fail=1; }
v1=$(val_loss); echo "global model after training: val loss $v1"
check "global val loss fell by more than 0.3 ($v0 -> $v1)" python3 -c "import sys; sys.exit(0 if $v1 < $v0 - 0.3 else 1)"
stop_sync
check "dloco check passes" quietly "$DLOCO" check "$W/store"

[ $fail = 0 ] && echo "test_gpu_cluster: all checks passed" || echo "test_gpu_cluster: FAILED"
exit $fail
