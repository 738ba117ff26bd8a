#!/usr/bin/env bash
# GPU learner throughput: tokens/s and model FLOP utilisation of the device
# step for the GPT-2 124M shape and the CPU bench config, next to the CPU learner, in one run.
#
# Usage: bench/gpu.sh [build-dir]     (default: $BUILD_DIR or <repo>/build-gpu)
# Env:   STEPS_124M (default 10), STEPS_SMALL (default 30), B_124M (default 8),
#        MATMUL (default tf32: the learner's default, for the small config),
#        MATMULS_124M (default "tf32 bf16": the 124M shape is run once per precision)
# MFU = dl_model_flops_per_token (6N + attention, full T^2 count) x tok/s / 989 TFLOP/s,
# the dense BF16 tensor-core peak of the H100/H200 SXM. The step keeps fp32
# storage and master weights; tf32 GEMMs (dense peak half of bf16's) or bf16
# compute on fp32 operands (dloco-learner --matmul bf16).
# Last lines: gpu_mfu_124m_<precision>: X.XX for each, then gpu_mfu_124m: X.XX,
# the best of them (the precision is named on the line before). Without a GPU:
# says so and exits 0.
set -u -o pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../tests/lib_args.sh"
dl_args 1 "$@"
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-${BUILD_DIR:-$SRC/build-gpu}}
STEPS_124M=${STEPS_124M:-10}
STEPS_SMALL=${STEPS_SMALL:-30}
B_124M=${B_124M:-8}
MATMUL=${MATMUL:-tf32}
MATMULS_124M=${MATMULS_124M:-tf32 bf16}

if [[ ! -x $BUILD/bench/bench_gpu || ! -x $BUILD/bench/bench_learner ]]; then
    if [[ ! -f $BUILD/CMakeCache.txt ]]; then
        cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
    fi
    cmake --build "$BUILD" -j "$(nproc)" --target bench_learner >/dev/null || exit 1
    if grep -q '^DLOCO_HAVE_CUDA\|CMAKE_CUDA_COMPILER:' "$BUILD/CMakeCache.txt"; then
        cmake --build "$BUILD" -j "$(nproc)" --target bench_gpu >/dev/null 2>&1
    fi
fi
if [[ ! -x $BUILD/bench/bench_gpu ]]; then
    echo "bench/gpu.sh: no bench_gpu in $BUILD (built without CUDA): no GPU benchmark"
    echo "gpu_mfu_124m: n/a (no GPU)"
    exit 0
fi

# Probe with a tiny model: exit 77 means no usable device.
probe=$("$BUILD/bench/bench_gpu" 1 64 2 16 1 64 1 "$MATMUL" 2>&1)
rc=$?
if ((rc == 77)); then
    echo "bench/gpu.sh: found no usable CUDA GPU: $probe"
    echo "gpu_mfu_124m: n/a (no GPU)"
    exit 0
elif ((rc != 0)); then
    echo "bench/gpu.sh: probe failed (rc $rc): $probe"
    exit 1
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv,noheader 2>/dev/null

fail=0
L=4 C=256 NH=4 T=128 B=16 V=256
echo "== CPU bench config L=$L C=$C NH=$NH T=$T B=$B V=$V"
cpu=$(OMP_NUM_THREADS=$(nproc) OMP_PROC_BIND=true timeout 60 "$BUILD/bench/bench_learner" $L $C $NH $T $B $V 10) || fail=1
echo "$cpu"
gsmall=$(timeout 60 "$BUILD/bench/bench_gpu" $L $C $NH $T $B $V "$STEPS_SMALL" "$MATMUL") || fail=1
echo "$gsmall"

echo "== GPT-2 124M shape L=12 C=768 NH=12 T=1024 B=$B_124M V=50257 (attention probabilities" \
     "[L,B,NH,T,T] fp32 are kept for backward: $((12 * B_124M * 12 * 1024 * 1024 * 4 / 1000000)) MB)"
declare -A g124
for mm in $MATMULS_124M; do
    g124[$mm]=$(timeout 70 "$BUILD/bench/bench_gpu" 12 768 12 1024 "$B_124M" 50257 "$STEPS_124M" "$mm") || fail=1
    echo "${g124[$mm]}"
done

tok() { sed -nE 's/.* tok\/s ([0-9.]+).*/\1/p' <<<"$1"; }
mfu() { sed -nE 's/.* mfu ([0-9.]+).*/\1/p' <<<"$1"; }
ct=$(tok "$cpu") gt=$(tok "$gsmall")
if [[ -n $ct && -n $gt ]]; then
    echo "small config: gpu $gt tok/s vs cpu $ct tok/s ($(python3 -c "print('%.1f' % ($gt / $ct))" 2>/dev/null)x)"
fi
echo "gpu_mfu_small: $(mfu "$gsmall")"
best="" best_mm=""
for mm in $MATMULS_124M; do
    m=$(mfu "${g124[$mm]}")
    if [[ -z $m ]]; then
        echo "gpu_mfu_124m_$mm: n/a (the run failed)"
        fail=1
        continue
    fi
    printf 'gpu_mfu_124m_%s: %.2f\n' "$mm" "$m"
    if [[ -z $best ]] || python3 -c "import sys; sys.exit(0 if $m > $best else 1)"; then best=$m best_mm=$mm; fi
done
if [[ -n $best ]]; then
    echo "best 124M precision: --matmul $best_mm"
    printf 'gpu_mfu_124m: %.2f\n' "$best"
else
    echo "gpu_mfu_124m: n/a (the 124M runs failed)"
    fail=1
fi
exit $fail
