#!/bin/bash
# Byzantine learners: one of M learners corrupts every push it makes
# (dloco-learner --byzantine scale:100 or flip), the synchronizer's guards
# (value guard on by default, plus the robust aggregator an untrusted fleet
# should run) must contain it. Same model, data shards, seeds and steps in
# every case; the final global validation loss on the same 256 sequences:
#   clean            M honest learners, default synchronizer settings
#                    (a reference: the bar compares runs of the same settings)
#   clean_guarded    M honest learners, the guarded settings below
#   <attack>_off     one attacker, every guard off (norm_k 0, norm_param_ratio 0,
#                    param_abs_max 0, aggregate weighted): the damage
#   <attack>_default one attacker, default settings (value guard on, weighted
#                    merge, quorum 1): what a default synchronizer contains
#   <attack>_on      one attacker, the guarded settings
# Guarded settings: aggregate median, quorum K (rounds gather K contributions,
# so the median has a majority of honest ones), the default value guard
# (norm_k 10, norm_param_ratio 10).
# Last line: `byzantine_guarded_vs_clean_loss: X.XXX` = worst <attack>_on loss /
# clean_guarded loss: the same settings on both sides (bar <= 1.02); the line
# before it also gives the ratio against the clean run at default settings.
# Usage: bench/byzantine.sh   (env: M=4 STEPS=150 K=3 ATTACKS="scale:100 flip" DEFAULT_CASES=1
#        L=4 C=128 NH=4 T=128 B=16 H=4 P=4 LR=3e-3 DATA=... BUILD_DIR=build)
set -euo pipefail
. "$(dirname "$0")/../tests/lib_args.sh"
dl_args 0 "$@"
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
M=${M:-4} STEPS=${STEPS:-150} K=${K:-3} L=${L:-4} C=${C:-128} NH=${NH:-4} T=${T:-128} B=${B:-16} H=${H:-4} P=${P:-4}
LR=${LR:-3e-3} ATTACKS=${ATTACKS:-"scale:100 flip"}
DATA=${DATA:-/usr/share/games/fortunes}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target dloco-sync dloco-learner dloco >/dev/null
W=$(mktemp -d /tmp/dloco_byzantine.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; rm -rf "$W"' EXIT # || true: under set -e a learner already gone would end the trap before the rm, and the script with 1
MODEL="--n_layer $L --n_head $NH --n_embd $C --seq_len $T"
VB=$((256 / B))
GUARDS_OFF="--norm_k 0 --norm_param_ratio 0 --param_abs_max 0 --aggregate weighted"
GUARDED="--aggregate median --quorum $K"
echo "model L=$L C=$C NH=$NH T=$T; $M learners x B=$B x $STEPS steps, H=$H P=$P, outer lr 1 momentum 0;" \
     "attacker: learner $((M - 1)); guarded: $GUARDED + default value guard"

# run NAME BYZANTINE SYNC_FLAGS...: prints the final global val loss
run() {
  local name=$1 byz=$2; shift 2
  local d="$W/$name" t0; t0=$(date +%s)
  mkdir -p "$d"
  "$BUILD_DIR"/synchronizer/dloco-sync --store "$d/store" --bind tcp://127.0.0.1:0 $MODEL --vocab 256 --fragments "$P" \
    --H "$H" --outer_lr 1 --outer_momentum 0 --status_every_ms 0 --durability periodic --events "$d/ev-sync.log" \
    "$@" > "$d/sync.log" 2>&1 &
  local sp=$!; PIDS+=($sp)
  local ep=""
  for _ in $(seq 1 100); do ep=$(sed -n 's/^dloco-sync: listening on //p' "$d/sync.log"); [ -n "$ep" ] && break; sleep 0.1; done
  [ -n "$ep" ] || { cat "$d/sync.log" >&2; exit 1; }
  local lp=() i extra
  for i in $(seq 0 $((M - 1))); do
    extra=()
    [ "$i" = $((M - 1)) ] && [ "$byz" != none ] && extra=(--byzantine "$byz")
    "$BUILD_DIR"/learner/dloco-learner --connect "$ep" --id "b$i" --recovery off $MODEL --data "$DATA" --batch "$B" --steps "$STEPS" \
      --lr "$LR" --warmup 20 --fragments "$P" --data_shard "$i" --data_shards "$M" --seed $((7 + i)) --threads 1 \
      --adopt keep --adam_fleet $((4 * M)) --log_every 50 --val_every 0 "${extra[@]}" > "$d/l$i.log" 2>&1 &
    lp+=($!); PIDS+=($!)
  done
  # a learner may stop on its own (a poisoned model makes its loss NaN): that is a result, not an error
  for p in "${lp[@]}"; do wait "$p" || true; done
  kill -TERM "$sp"; wait "$sp" || true
  local loss
  loss=$("$BUILD_DIR"/tools/dloco eval "$d/store" --data "$DATA" --batch "$B" --val_batches "$VB" 2>/dev/null |
         sed -n -E 's/.*val loss ([0-9.naif+-]+).*/\1/p')
  [ -n "$loss" ] || loss=nan
  local rej clip merges
  rej=$(grep -c ' event=push .*decision=rejected' "$d/ev-sync.log" || true)
  clip=$(grep -c ' event=push_clipped ' "$d/ev-sync.log" || true)
  merges=$(grep -c ' event=merge ' "$d/ev-sync.log" || true)
  printf '%-16s final val loss %-8s (%3d s; merges %d, pushes rejected %d, clipped %d)\n' "$name" "$loss" \
    $(( $(date +%s) - t0 )) "$merges" "$rej" "$clip" >&2
  echo "$loss"
}

clean=$(run clean none)
clean_g=$(run clean_guarded none $GUARDED)
worst_on=0
for a in $ATTACKS; do
  tag=${a//:/}
  run "${tag}_off" "$a" $GUARDS_OFF >/dev/null
  [ "${DEFAULT_CASES:-1}" = 1 ] && run "${tag}_default" "$a" >/dev/null
  on=$(run "${tag}_on" "$a" $GUARDED)
  worst_on=$(python3 -c "import math; a=float('$on'); w=float('$worst_on'); print(a if math.isnan(a) or a > w else w)")
done
python3 -c "
c=float('$clean'); g=float('$clean_g'); w=float('$worst_on')
print('clean (default settings) %.4f, clean with the guarded settings %.4f (%.3f x clean); worst attacked and '
      'guarded %.4f: %.3f x the clean default run' % (c, g, g / c, w, w / c))
print('byzantine_guarded_vs_clean_loss: %.3f' % (w / g))"
