#!/bin/bash
# Integration (docs/HETEROGENEOUS.md): a mixed fleet on loopback. A full-speed
# fp32 learner and a quarter-speed (--throttle 0.25) bf16 learner
# (--precision bf16), both with --dynamic_h speed and non-IID shards
# (--data_shard_mode cluster), against one dloco-sync at H=8. From the events:
# the slow learner's H goes below 8 and the fast one's above (the fleet rate
# reached them in the Acks), the bf16 learner's pushes are merged like the
# fp32 one's, both end cleanly, the global model trained. Then the refusals of
# the new options (exit 2, naming the option and the numbers).
set -u
TEST_NAME=hetero
. "$(dirname "$0")/lib_cluster.sh"
make_corpus
start_sync sync --durability periodic --quorum 1 $OUTER
start_learner fast --steps 600 --dynamic_h speed --data_shard 0 --data_shards 2 --data_shard_mode cluster
FP=$LPID
start_learner slow --steps 150 --throttle 0.25 --precision bf16 --dynamic_h speed --data_shard 1 --data_shards 2 \
  --data_shard_mode cluster
SL=$LPID
wait_pid 240 "$FP"; rc_f=$?
wait_pid 240 "$SL"; rc_s=$?
stop_sync
check "both learners exit 0 (fast $rc_f, slow $rc_s)" [ "$rc_f" = 0 -a "$rc_s" = 0 ]
for n in fast slow; do
  E="$W/events-$n.log"
  check "$n: learner_hetero says dynamic_h=speed data_shard_mode=cluster" \
    ev_has "$E" learner_hetero id="$n" dynamic_h=speed data_shard_mode=cluster
  hs=$(ev_field "$E" dynamic_h h | tr '\n' ' ')
  acc=$(ev_last "$E" learner_summary accepted)
  echo "$n: H over the run: ${hs:-none}; accepted pushes ${acc:-?}"
  check "$n: pushes accepted (${acc:-none})" [ "${acc:-0}" -gt 0 ]
done
check "slow: bf16 (learner_hetero precision=bf16)" ev_has "$W/events-slow.log" learner_hetero precision=bf16
check "fast: fp32 (learner_hetero precision=fp32)" ev_has "$W/events-fast.log" learner_hetero precision=fp32
slow_min=$(ev_field "$W/events-slow.log" dynamic_h h base_h=8 | sort -n | head -n 1)
fast_max=$(ev_field "$W/events-fast.log" dynamic_h h base_h=8 | sort -n | tail -n 1)
check "slow: its H went below the Welcome's 8 (lowest ${slow_min:-none})" [ "${slow_min:-8}" -lt 8 ]
check "fast: its H went above the Welcome's 8 (highest ${fast_max:-none})" [ "${fast_max:-8}" -gt 8 ]
fleet=$(ev_field "$W/events-slow.log" dynamic_h fleet_steps_per_s | awk '$1 > 0 { n++ } END { print n + 0 }')
check "every H change used a known fleet rate (> 0): $fleet of $(ev_count "$W/events-slow.log" dynamic_h)" \
  [ "$fleet" -gt 0 -a "$fleet" = "$(ev_count "$W/events-slow.log" dynamic_h)" ]
m=$(merges); vl=$(val_loss)
echo "merges ${m:-?}, global val loss ${vl:-?}"
check "merges happened (${m:-none})" [ "${m:-0}" -gt 0 ]
check "the global model trained: val loss ${vl:-?} < 4.5 (ln 256 = 5.55 untrained)" \
  python3 -c "import sys; sys.exit(0 if float('${vl:-nan}') < 4.5 else 1)"

# refusals at start: exit 2, the option and the numbers on stderr
refused() { # want args...
  local want=$1; shift
  local out rc
  out=$("$LEARNER" --standalone --device cpu $MODEL --data "$W/corpus.txt" --steps 1 "$@" 2>&1); rc=$?
  check "refused (exit 2, '$want'): $*" [ "$rc" = 2 ]
  check "  the message names it" grep -qF -- "$want" <<< "$out"
}
refused "option dynamic_h_max: 4 is below dynamic_h_min 8" --dynamic_h speed --dynamic_h_min 8 --dynamic_h_max 4
refused "option dynamic_h_min: 0 out of range" --dynamic_h_min 0
refused "option dynamic_h: 'fast' is not one of off|speed" --dynamic_h fast
refused "option precision: bf16 is the CPU model's; on --device cuda use --matmul bf16" --precision bf16 --device cuda
refused "option precision: 'fp16' is not one of fp32|bf16" --precision fp16
refused "option data_shard_mode: 'topic' is not one of iid|cluster" --data_shard_mode topic
refused "fewer than the 4096 a batch needs" --data_shard_mode cluster --data_shard 1 --data_shards 4 --batch 4096
exit $fail
