#!/bin/bash
# Integration (docs/HETEROGENEOUS.md): a mixed fleet on loopback. A full-speed
# fp32 learner and a quarter-speed (--throttle 0.25) bf16 learner
# (--precision bf16), both with --dynamic_h speed and non-IID shards
# (--data_shard_mode cluster), against one dloco-sync at H=8. From the events:
# the slow learner's H goes below 8 and the fast one's above (the fleet rate
# reached them in the Acks), the bf16 learner's pushes are merged like the
# fp32 one's, both end cleanly, the global model trained. Then a batch-16 and
# a batch-8 learner in rounds of both: the merge weights stand as tokens x batch
# (the token weighting of unequal batches, from the store's merge records). Then
# the refusals of the new options (exit 2, naming the option and the numbers).
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

# Batch token weights: a batch-16 and a batch-8 learner at the same speed, quorum 2, so rounds hold both.
# A contribution's weight is tokens^2 / steps x s(staleness) (synchronizer/policy.h), tokens / steps being
# the learner's batch x seq_len: in a round of both at one staleness the normalised weights must stand as
# tokens_w x 16 : tokens_n x 8 (dloco records: fragment version learner decision staleness tokens weight).
rm -rf "$W/store"
start_sync sync2 --durability periodic --quorum 2 $OUTER
start_learner narrow --steps 120 --batch 8 --data_shard 0 --data_shards 2
NP=$LPID
start_learner wide --steps 120 --batch 16 --data_shard 1 --data_shards 2
WP=$LPID
wait_pid 240 "$NP"; rc_n=$?
wait_pid 240 "$WP"; rc_w=$?
stop_sync
check "narrow and wide exit 0 ($rc_n, $rc_w)" [ "$rc_n" = 0 -a "$rc_w" = 0 ]
"$DLOCO" records "$W/store" > "$W/records.txt" || die "dloco records"
read -r pairs bad <<< "$(python3 - "$W/records.txt" << 'PY'
import sys, collections
rounds = collections.defaultdict(dict)
for line in open(sys.argv[1]).read().splitlines()[1:]:
    f = line.split()
    if len(f) >= 7 and f[3] == "merged":
        rounds[(f[0], f[1])][f[2]] = (int(f[4]), int(f[5]), float(f[6]))
pairs = bad = 0
for r in rounds.values():
    if set(r) != {"narrow", "wide"} or r["narrow"][0] != r["wide"][0]:
        continue
    pairs += 1
    (_, tn, wn), (_, tw, ww) = r["narrow"], r["wide"]
    want = tw * 16.0 / (tw * 16.0 + tn * 8.0)
    if abs(ww - want) > 2e-6 + 1e-4 * want:
        bad += 1
        print("round", r, "wide weight", ww, "want", want, file=sys.stderr)
print(pairs, bad)
PY
)"
echo "rounds holding both learners at one staleness: ${pairs:-?}, weights off the tokens x batch rule: ${bad:-?}"
check "rounds with both learners (${pairs:-0})" [ "${pairs:-0}" -gt 0 ]
check "the wide learner's weight is tokens x batch against the narrow one's in every such round" [ "${bad:-1}" = 0 ]

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
refused "option dynamic_h: speed works with sync_timing fixed only (sync_timing is wa)" --dynamic_h speed --sync_timing wa
refused "option dynamic_h: speed does not go with --pressure or --timing_trace_out" --dynamic_h speed --pressure /tmp/p
refused "are for networked learners (a --standalone run pushes nothing)" --dynamic_h speed
refused "are for networked learners (a --standalone run pushes nothing)" --sync_timing wa
refused "option precision: bf16 is the CPU model's; on --device cuda use --matmul bf16" --precision bf16 --device cuda
refused "option precision: 'fp16' is not one of fp32|bf16" --precision fp16
refused "option data_shard_mode: 'topic' is not one of iid|cluster" --data_shard_mode topic
refused "fewer than the 4096 a batch needs" --data_shard_mode cluster --data_shard 1 --data_shards 4 --batch 4096
exit $fail
