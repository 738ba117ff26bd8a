#!/bin/bash
# A local cluster on this machine: one dloco-sync + N dloco-learner processes
# on loopback, training one GPT on a corpus; ends with a summary (final global
# validation loss, merges, mean staleness, the token ledger, bytes per learner).
# Usage: deploy/local_cluster.sh [--learners N] [--steps S] [--store DIR] [--keep]
#        [--data PATH] [--port P] [--check-args] [-- extra learner flags]
#        (--check-args: only check the other arguments, exit 0 or 2; quickstart.sh does before it builds)
# Model and merge settings come from deploy/cluster.ini (synchronizer) and
# deploy/learner.ini (learners). Built binaries are expected in $BUILD_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
N=4 STEPS=250 STORE=runs/cluster.lmdb KEEP=0 CHECK=0 DATA=/usr/share/games/fortunes PORT=5555
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --learners | --steps | --store | --data | --port)
      [ $# -ge 2 ] || { echo "local_cluster.sh: $1 needs a value (try --help)" >&2; exit 2; } ;;&
    --learners) N=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --store) STORE=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    --check-args) CHECK=1; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "local_cluster.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
case "$N$STEPS" in *[!0-9]*) echo "local_cluster.sh: --learners and --steps take numbers" >&2; exit 2 ;; esac
[ "$N" -ge 1 ] && [ "$N" -le 64 ] || { echo "local_cluster.sh: --learners must be 1..64" >&2; exit 2; }
[ "$CHECK" = 0 ] || exit 0
for b in synchronizer/dloco-sync learner/dloco-learner tools/dloco; do
  [ -x "$BUILD_DIR/$b" ] || { echo "local_cluster.sh: $BUILD_DIR/$b is not built (run cmake --build $BUILD_DIR)" >&2; exit 2; }
done

LOGS=$(dirname "$STORE")/$(basename "$STORE" .lmdb)-logs
mkdir -p "$(dirname "$STORE")" "$LOGS"
[ "$KEEP" = 1 ] || rm -rf "$STORE"
: > "$LOGS/events-sync.log"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

"$BUILD_DIR"/synchronizer/dloco-sync --config deploy/cluster.ini --store "$STORE" --bind "tcp://127.0.0.1:$PORT" \
  --eval_data "$DATA" --events "$LOGS/events-sync.log" > "$LOGS/sync.log" 2>&1 &
SPID=$!; PIDS+=("$SPID")
EP=""
for _ in $(seq 1 100); do
  EP=$(sed -n 's/^dloco-sync: listening on //p' "$LOGS/sync.log")
  [ -n "$EP" ] && break
  kill -0 "$SPID" 2>/dev/null || { cat "$LOGS/sync.log"; exit 1; }
  sleep 0.1
done
[ -n "$EP" ] || { echo "dloco-sync did not start"; cat "$LOGS/sync.log"; exit 1; }
echo "synchronizer on $EP (store $STORE, logs in $LOGS)"
v0=$("$BUILD_DIR"/tools/dloco eval "$STORE" --data "$DATA" 2>> "$LOGS/dloco.log" | sed -E 's/.*val loss ([0-9.]+).*/\1/')
echo "global model at start: val loss $v0 on $DATA"

# each learner gets its own shard of the training data and one thread (the
# learners share this machine's cores, so they run on the cpu even where a GPU
# exists), and estimates its AdamW second moment for the N-times batch of the
# whole fleet (--adam_fleet 4N at H=4: see docs/ARCHITECTURE.md for why 4N)
LP=()
for i in $(seq 0 $((N - 1))); do
  "$BUILD_DIR"/learner/dloco-learner --config deploy/learner.ini --connect "$EP" --id "learner-$i" \
    --data "$DATA" --steps "$STEPS" --data_shard "$i" --data_shards "$N" --seed $((1000 + i)) \
    --threads 1 --device cpu --adam_fleet "$((4 * N))" "${EXTRA[@]}" > "$LOGS/learner-$i.log" 2>&1 &
  LP+=($!); PIDS+=($!)
done
echo "started $N learners x $STEPS steps; progress of learner-0:"
tail -n +1 -f "$LOGS/learner-0.log" --pid "${LP[0]}" | grep --line-buffered -E '^(step|summary:|learner-summary:)' || true
rc=0
for i in "${!LP[@]}"; do wait "${LP[$i]}" || { echo "learner-$i exited with an error:"; tail -3 "$LOGS/learner-$i.log"; rc=1; }; done
kill -TERM "$SPID"; wait "$SPID" || true
# the push ledger at shutdown (docs/FAILURE_MODEL.md): every token the
# learners processed, by the state it ended in
ledger=$(grep ' event=ledger ' "$LOGS/events-sync.log" | tail -n 1)
P=$(sed -n 's/^ *fragments *= *//p' deploy/cluster.ini | head -n 1)

echo
echo "==== summary ===="
"$BUILD_DIR"/tools/dloco status "$STORE" 2>> "$LOGS/dloco.log" | grep -E '^(run|versions|merges|token)'
v1=$("$BUILD_DIR"/tools/dloco eval "$STORE" --data "$DATA" 2>> "$LOGS/dloco.log" | sed -E 's/.*val loss ([0-9.]+).*/\1/')
echo "final global val loss on $DATA: $v1 (start $v0)"
[ -n "$ledger" ] && echo "$ledger" | awk -v P="${P:-1}" '{
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    printf "ledger: %d tokens processed = applied %d + dropped_stale %d + rejected %d + lost %d + discarded %d + outstanding %d (double-counted: %d)\n",
      v["processed"] / P, v["applied"] / P, v["dropped_stale"] / P, v["rejected"] / P, v["lost"] / P, v["discarded"] / P,
      v["outstanding"] / P, v["overclaim"] / P }'
grep -h '^learner-summary:' "$LOGS"/learner-*.log | sed -E 's/^learner-summary: /  /' \
  | awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
           printf "  %-10s steps %-6s pushes %-5s adopted %-5s sent %8.2f MB  received %8.2f MB\n", v["id"], v["steps"], v["pushes"], v["updates_adopted"], v["bytes_sent"] / 1e6, v["bytes_received"] / 1e6 }'
# bytes per learner per step against a data-parallel run of the same fleet: a
# ring all-reduce of the fp32 gradients sends and receives 2 (M-1)/M x 4 x params
# bytes per learner per step (docs/ARCHITECTURE.md "Bandwidth")
np=$(grep -m1 -o '[0-9]* parameters' "$LOGS/learner-0.log" | cut -d' ' -f1)
grep -h '^learner-summary:' "$LOGS"/learner-*.log | sed -E 's/^learner-summary: //' \
  | awk -v n="${np:-0}" -v m="$N" '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        if (v["steps"] > 0) { s += v["bytes_sent"] / v["steps"]; r += v["bytes_received"] / v["steps"]; k++ } }
      END { if (!k || !n || m < 2) exit
            ar = 2 * (m - 1) / m * 4 * n
            printf "bytes per learner per step: sent %.1f KB, received %.1f KB; a per-step fp32 ring all-reduce would move %.1f KB each way (%.0fx the bytes)\n", s / k / 1e3, r / k / 1e3, ar / 1e3, 2 * ar / ((s + r) / k) }'
exit $rc
