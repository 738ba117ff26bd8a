#!/bin/bash
# The PyTorch learner's cost: the same PyTorch GPT-2 loop (examples/torch/gpt2.py's
# model) with and without dloco.Learner, on the CPU with the same threads,
# against a real dloco-sync on loopback (P=4, int4 pushes with error
# feedback), interleaved in blocks (bench/torch_learner.py); beside it
# dloco-learner's own CPU trainer on the same GPT config (bench_learner).
# Last line: torch_learner_step_overhead: X.XXX (step time with / without; bar <= 1.05).
# Usage: bench/torch_learner.sh [block_steps] [rounds]   (BUILD_DIR=build; THREADS=2; H=12)
set -euo pipefail
. "$(dirname "$0")/../tests/lib_args.sh"
dl_args 2 "$@"
if [ $# -ge 1 ]; then dl_args_number block_steps "$1"; fi
if [ $# -ge 2 ]; then dl_args_number rounds "$2"; fi
cd "$(dirname "$0")/.."
deploy/setup.sh --with-torch >/dev/null
BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-2}
H=${H:-12}
BLOCK=${1:-10}
ROUNDS=${2:-5}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target dloco-sync dloco_learner bench_learner >/dev/null
L=4 C=256 NH=4 T=128 B=16 V=256
W=$(mktemp -d /tmp/dloco_torch_learner.XXXXXX)
SPID=""
: > "$W/sync.ev"
cleanup() { [ -n "$SPID" ] && kill "$SPID" 2>/dev/null; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
"$BUILD_DIR"/synchronizer/dloco-sync --store "$W/store" --bind tcp://127.0.0.1:0 --n_layer $L --n_head $NH \
  --n_embd $C --seq_len $T --vocab $V --fragments 4 --H "$H" --status_every_ms 0 --events "$W/sync.ev" \
  --eval_every_s 0 > "$W/sync.log" 2>&1 &
SPID=$!
EP=""
for _ in $(seq 1 100); do
  EP=$(sed -n 's/.* event=sync_start .*endpoint=\([^ ]*\).*/\1/p' "$W/sync.ev" | tail -n 1)
  [ -n "$EP" ] && break
  kill -0 "$SPID" 2>/dev/null || { cat "$W/sync.log"; exit 1; }
  sleep 0.1
done
[ -n "$EP" ] || { echo "dloco-sync did not start"; exit 1; }
echo "config: L=$L C=$C NH=$NH T=$T B=$B V=$V, P=4, H=$H, int4 pushes; $ROUNDS rounds of $BLOCK steps per mode, $THREADS threads"
echo "note: a shared machine's load moves these figures; the blocks are interleaved so both modes see it alike"
out=$(OMP_NUM_THREADS=$THREADS DLOCO_LIBRARY=$(ls "$BUILD_DIR"/learner/libdloco_learner.so) \
  /usr/bin/python3 bench/torch_learner.py "$EP" $L $C $NH $T $B $V "$BLOCK" "$ROUNDS" "$THREADS" \
  push_codec=int4 error_feedback=true 2>"$W/py.err") || { cat "$W/py.err"; exit 1; }
echo "$out" | grep -v '^overhead:\|^torch_tok_s:'
d=$(OMP_NUM_THREADS=$THREADS OMP_PROC_BIND=true "$BUILD_DIR"/bench/bench_learner $L $C $NH $T $B $V $((BLOCK * 2)))
echo "dloco-learner's trainer: $d"
dtok=$(echo "$d" | sed -E 's/.* tok\/s ([0-9.]+).*/\1/')
ttok=$(echo "$out" | sed -n 's/^torch_tok_s: //p')
echo "tokens/s on this config: PyTorch learner (with dloco) $ttok, dloco-learner $dtok"
echo "torch_learner_step_overhead: $(echo "$out" | sed -n 's/^overhead: //p')"
