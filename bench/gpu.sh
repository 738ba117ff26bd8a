#!/usr/bin/env bash
# GPU learner throughput: tokens/s and model FLOP utilisation of the device
# step for the GPT-2 124M shape and the CPU bench config, next to the CPU learner, in one run.
#
# Usage: bench/gpu.sh [build-dir]     (default: $BUILD_DIR or <repo>/build-gpu)
# Env:   STEPS_124M (default 10), STEPS_SMALL (default 30), B_124M (default 8), TF32 (default 1)
# MFU = dl_gpt_flops_per_token (6N + attention, full T^2 count) x tok/s / 989 TFLOP/s,
# the dense BF16 tensor-core peak of the H100/H200 SXM (the step runs fp32
# storage with TF32 GEMMs, whose dense peak is half of that).
# Last line: gpu_mfu_124m: X.XX. Without a GPU: says so and exits 0.
set -u -o pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-${BUILD_DIR:-$SRC/build-gpu}}
STEPS_124M=${STEPS_124M:-10}
STEPS_SMALL=${STEPS_SMALL:-30}
B_124M=${B_124M:-8}
TF32=${TF32:-1}

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
probe=$("$BUILD/bench/bench_gpu" 1 64 2 16 1 64 1 "$TF32" 2>&1)
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
gsmall=$(timeout 60 "$BUILD/bench/bench_gpu" $L $C $NH $T $B $V "$STEPS_SMALL" "$TF32") || fail=1
echo "$gsmall"

echo "== GPT-2 124M shape L=12 C=768 NH=12 T=1024 B=$B_124M V=50257 (attention probabilities" \
     "[L,B,NH,T,T] fp32 are kept for backward: $((12 * B_124M * 12 * 1024 * 1024 * 4 / 1000000)) MB)"
g124=$(timeout 100 "$BUILD/bench/bench_gpu" 12 768 12 1024 "$B_124M" 50257 "$STEPS_124M" "$TF32") || fail=1
echo "$g124"

tok() { sed -nE 's/.* tok\/s ([0-9.]+).*/\1/p' <<<"$1"; }
mfu() { sed -nE 's/.* mfu ([0-9.]+).*/\1/p' <<<"$1"; }
ct=$(tok "$cpu") gt=$(tok "$gsmall")
if [[ -n $ct && -n $gt ]]; then
    echo "small config: gpu $gt tok/s vs cpu $ct tok/s ($(python3 -c "print('%.1f' % ($gt / $ct))" 2>/dev/null)x)"
fi
echo "gpu_mfu_small: $(mfu "$gsmall")"
m=$(mfu "$g124")
if [[ -n $m ]]; then
    printf 'gpu_mfu_124m: %.2f\n' "$m"
else
    echo "gpu_mfu_124m: n/a (the 124M run failed)"
    fail=1
fi
exit $fail
