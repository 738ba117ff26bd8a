#!/bin/bash
# A learner behind a thin link (3 Mbit/s each way: a network namespace, a
# veth pair, tbf) beside a near one, every liveness, chunk, H and staleness
# setting at the programs' defaults: a fragment of this model travels in
# 64 KiB chunks, about 3.5 s over the link (merges come faster), so its
# link stays busy both ways, and its push chunks never grow. Yet the synchronizer never
# declares it dead (bytes drained for it and its own push chunks arriving
# are its signs of life), the learner does not take its busy downlink for a
# silent synchronizer (no rehello), and no Welcome after its first makes it
# fetch what it holds (must_fetch). Needs root (ip netns, tc): SKIP
# otherwise. Holds the netns lock. SYNC_ARGS adds synchronizer options:
# SYNC_ARGS="--heartbeat_ms 200" is the regime of the chaos scenario
# format's defaults (1.2 s of liveness), where the thin learner was
# declared dead before its first push chunk arrived.
set -u
TEST_NAME=thin_link
. "$(dirname "$0")/lib_cluster.sh"
RUN_S=${RUN_S:-15}
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null; then
  echo "SKIP: network namespaces and tc need root and iproute2 (ip, tc)"; exit 77
fi
NS=dlthin$$ HIF=dlth$$ NIF=dltn$$ NET=10.231.$(( $$ % 250 ))
ip netns add "$NS" 2>/dev/null || { echo "SKIP: cannot create a network namespace here"; exit 77; }
trap 'cleanup; ip netns del "$NS" 2>/dev/null' EXIT
ip link add "$HIF" type veth peer name "$NIF" && ip link set "$NIF" netns "$NS" &&
  ip addr add "$NET.1/24" dev "$HIF" && ip link set "$HIF" up &&
  ip netns exec "$NS" ip addr add "$NET.2/24" dev "$NIF" && ip netns exec "$NS" ip link set "$NIF" up &&
  ip netns exec "$NS" ip link set lo up || die "cannot set up the veth pair"
# 3 Mbit/s each way; a burst of 16 KiB and a queue of 200 ms, as dloco-chaos shapes a datacenter's link
tc qdisc add dev "$HIF" root tbf rate 3mbit burst 16384 limit 75000 &&
  ip netns exec "$NS" tc qdisc add dev "$NIF" root tbf rate 3mbit burst 16384 limit 75000 || die "cannot shape the link"
# a model of 2.6 MB in two fragments of about 20 chunks of 64 KiB each (3.5 s a fragment at 3 Mbit/s)
MODEL="--n_layer 2 --n_head 4 --n_embd 160 --seq_len 32"
make_corpus
S=$W/events-sync.log
: > "$S"
"$SYNC" --store "$W/store" --bind "tcp://$NET.1:0" --auth off $MODEL --vocab 256 --fragments 2 --status_every_ms 0 \
  --events "$S" ${SYNC_ARGS:-} > "$W/sync.log" 2>&1 &
SPID=$!; PIDS+=("$SPID")
ev_wait 20 "$S" sync_start || die "dloco-sync did not start"
EP=$(ev_last "$S" sync_start endpoint)
# learner NAME SHARD [PREFIX...]: a learner with the programs' defaults (run under PREFIX); sets LPID
learner() {
  local name=$1 shard=$2; shift 2
  : > "$W/events-$name.log"
  "$@" "$LEARNER" --connect "$EP" --id "$name" --state_dir "$W" --device cpu $MODEL --data "$W/corpus.txt" --batch 8 --warmup 5 \
    --lr 3e-3 --fragments 2 --threads 1 --log_every 50 --steps 100000000 --data_shard "$shard" --data_shards 2 \
    --events "$W/events-$name.log" --loss_log "$W/loss-$name.txt" > "$W/$name.log" 2>&1 &
  LPID=$!; PIDS+=("$LPID")
}
learner near 0; NPID=$LPID
learner thin 1 ip netns exec "$NS"; TPID=$LPID
ev_wait 60 "$S" learner_join id=thin || die "the thin learner did not join"
wait_until 60 '[ "$(steps_of thin)" -gt 0 ]' || die "the thin learner did not start training (initial fetch)"
m0=$(merges)
echo "both learners train; $m0 merges so far; running $RUN_S s with the thin link busy"
t_end=$(( $(date +%s) + RUN_S ))
wait_until $(( RUN_S + 5 )) "ev_has $S learner_dead id=thin || [ \$(date +%s) -ge $t_end ]"
echo "merges: $m0 -> $(merges); thin trained $(steps_of thin) steps, near $(steps_of near)"
echo "thin: $(ev_count "$W/events-thin.log" rehello) rehellos, $(ev_count "$W/events-thin.log" welcome) welcomes," \
  "$(ev_count "$W/events-thin.log" socket_rebuild) socket rebuilds"
check "the thin learner was never declared dead ($(ev_count "$S" learner_dead id=thin) learner_dead)" \
  [ "$(ev_count "$S" learner_dead id=thin)" = 0 ]
check "only its first Welcome made it fetch ($(ev_count "$S" learner_join id=thin must_fetch=1) joins with must_fetch)" \
  [ "$(ev_count "$S" learner_join id=thin must_fetch=1)" = 1 ]
check "the thin learner never took its busy downlink for silence ($(ev_count "$W/events-thin.log" rehello) rehellos)" \
  [ "$(ev_count "$W/events-thin.log" rehello)" = 0 ]
check "the link was busy: the synchronizer merged during the run" [ "$(merges)" -gt "$m0" ]
# push chunks follow each uplink (docs/PROTOCOL.md "Chunked transfers"): the near learner's grow past
# chunk_kb, the thin one's stay at it (3 Mbit/s carries 19 KB in the 50 ms a chunk may take)
echo "push chunk sizes: near $(ev_last "$S" push_chunk bytes id=near), thin $(ev_last "$S" push_chunk bytes id=thin);" \
  "thin pushes pooled: $(ev_count "$S" push id=thin decision=pooled)"
check "the near learner's push chunks grew with its link ($(ev_count "$S" push_chunk id=near) push_chunk events)" \
  ev_has "$S" push_chunk id=near
check "the thin learner's push chunks stayed at chunk_kb ($(ev_count "$S" push_chunk id=thin) push_chunk events)" \
  [ "$(ev_count "$S" push_chunk id=thin)" = 0 ]
kill -TERM "$TPID" "$NPID"
wait_pid 60 "$TPID"; wait_pid 60 "$NPID"
stop_sync
read -r fetches <<< "$(ev_last "$S" sync_summary fetches)"
echo "synchronizer: fetches=$fetches"
[ $fail = 0 ] && echo "test_thin_link: all checks passed" || echo "test_thin_link: FAILED"
exit $fail
