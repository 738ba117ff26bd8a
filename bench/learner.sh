#!/bin/bash
# CPU learner throughput vs PyTorch on the same GPT-2 config, same machine,
# same run. Last line: learner_vs_torch_cpu: X.XX (dloco tok/s / torch tok/s).
# Usage: bench/learner.sh [steps]   (BUILD_DIR=build; THREADS=2)
set -euo pipefail
. "$(dirname "$0")/../tests/lib_args.sh"
dl_args 1 "$@"
if [ $# -ge 1 ]; then dl_args_number steps "$1"; fi
cd "$(dirname "$0")/.."
deploy/setup.sh --with-torch >/dev/null
BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-2}
STEPS=${1:-20}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target bench_learner >/dev/null
L=4 C=256 NH=4 T=128 B=16 V=256
echo "config: L=$L C=$C NH=$NH T=$T B=$B V=$V, $STEPS timed steps after 3 warm-up, $THREADS threads each"
# torch first, then dloco, then torch again: a drift in machine load shows up
# as a gap between the two torch figures
t1=$(/usr/bin/python3 bench/torch_gpt.py $L $C $NH $T $B $V "$STEPS" "$THREADS")
echo "$t1"
d=$(OMP_NUM_THREADS=$THREADS OMP_PROC_BIND=true "$BUILD_DIR"/bench/bench_learner $L $C $NH $T $B $V "$STEPS")
echo "$d"
t2=$(/usr/bin/python3 bench/torch_gpt.py $L $C $NH $T $B $V "$STEPS" "$THREADS")
echo "$t2"
tok() { echo "$1" | sed -E 's/.* tok\/s ([0-9.]+).*/\1/'; }
python3 - "$(tok "$d")" "$(tok "$t1")" "$(tok "$t2")" "$d" <<'PY'
import sys, re
d, t1, t2 = (float(x) for x in sys.argv[1:4])
frac = re.search(r"fraction_of_peak ([0-9.]+)", sys.argv[4]).group(1)
t = max(t1, t2)  # compare against PyTorch's better run
print("model FLOP/s as a fraction of OpenBLAS sgemm peak (same run): %s" % frac)
print("torch runs %.0f and %.0f tok/s (spread %.0f%%)" % (t1, t2, 100 * abs(t1 - t2) / max(t1, t2)))
print("learner_vs_torch_cpu: %.2f" % (d / t))
PY
