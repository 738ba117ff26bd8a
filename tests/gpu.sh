#!/usr/bin/env bash
# tests/gpu.sh: everything to do during one short stay on a GPU machine: fresh
# CUDA build, device list, every GPU-labelled CTest, bench/gpu.sh if present.
# The GPU tests: kernel parity (test_cuda_kernels), codec parity, bytes and
# bits (test_cuda_codec), model parity vs CPU and
# PyTorch (test_cuda_gpt), the learner's fragment copies, deferred node and
# trainer vs the CPU (test_cuda_learner), and a networked cluster of one
# --device cuda and one --device cpu learner that must merge
# (test_gpu_cluster, tests/test_gpu_cluster.sh). The bench runs the 124M shape
# with --matmul tf32 and bf16.
#
# Usage: tests/gpu.sh [build-dir]       (default: <repo>/build-gpu)
# Env:   DLOCO_GPU_BUDGET_S  total seconds for the whole script (default 450: under 8 minutes)
#        DLOCO_CUDA_ARCHS    CMAKE_CUDA_ARCHITECTURES override (default: project's 80;90)
#        JOBS                build parallelism (default: nproc)
#        OUT                 if set, logs are copied there (the device runner's $OUT)
# Exit:  0 all good; 1 a GPU test failed, was skipped (no device) or none ran,
#        or configure failed; 2 GPU tests passed but another step failed
#        (rest of the build, nvidia-smi, bench).
set -u -o pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib_args.sh"
dl_args 1 "$@"

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$SRC/build-gpu}
BUDGET=${DLOCO_GPU_BUDGET_S:-450}
JOBS=${JOBS:-$(nproc)}
LOG=$BUILD/gpu-logs
START=$(date +%s)

declare -a SUMMARY=()
GPU_FAIL=0
OTHER_FAIL=0

# Seconds left of the budget, capped at $1.
left() {
    local cap=$1 rem=$((BUDGET - ($(date +%s) - START)))
    ((rem < 1)) && rem=1
    ((rem < cap)) && echo "$rem" || echo "$cap"
}

# step NAME CAP_S CMD...: run with a timeout, tee to a log, record the outcome.
step() {
    local name=$1 cap=$2 t0 rc
    shift 2
    t0=$(date +%s)
    echo "==== $name (timeout $(left "$cap")s): $*"
    timeout --kill-after=10 "$(left "$cap")" "$@" 2>&1 | tee "$LOG/$name.log"
    rc=${PIPESTATUS[0]}
    local verdict=ok
    if ((rc == 124 || rc == 137)); then
        verdict=TIMEOUT
    elif ((rc != 0)); then
        verdict="FAIL rc=$rc"
    fi
    SUMMARY+=("$(printf '%-10s %-14s %4ss' "$name" "$verdict" $(($(date +%s) - t0)))")
    return "$rc"
}

finish() {
    echo
    echo "==================== tests/gpu.sh summary ===================="
    printf '%s\n' "${SUMMARY[@]}"
    echo "total $(($(date +%s) - START))s of ${BUDGET}s budget; build dir $BUILD"
    local rc=0
    if ((GPU_FAIL)); then
        echo "RESULT: FAIL (GPU tests)"
        rc=1
    elif ((OTHER_FAIL)); then
        echo "RESULT: GPU tests passed, other step(s) failed"
        rc=2
    else
        echo "RESULT: PASS"
    fi
    if [[ -n ${OUT:-} && -d ${OUT:-} ]]; then
        mkdir -p "$OUT/gpu-logs" && cp -r "$LOG"/. "$OUT/gpu-logs/" 2>/dev/null
        cp "$BUILD/Testing/Temporary/LastTest.log" "$OUT/gpu-logs/" 2>/dev/null
    fi
    exit "$rc"
}

# A fresh build: wipe a previous build dir, but never a folder that is not one.
if [[ -f $BUILD/CMakeCache.txt ]]; then
    rm -rf "$BUILD"
elif [[ -d $BUILD && -n $(ls -A "$BUILD") ]]; then
    echo "tests/gpu.sh: $BUILD exists and is not a CMake build dir; refusing to wipe it" >&2
    exit 1
fi
mkdir -p "$LOG"
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export CUDACXX=/usr/local/cuda/bin/nvcc
fi

# ---- device
step nvidia-smi 30 nvidia-smi -L || OTHER_FAIL=1

# ---- configure and build
GEN=() KEEP=(-k)
if command -v ninja >/dev/null; then GEN=(-G Ninja) KEEP=(-k 0); fi
ARCH=()
[[ -n ${DLOCO_CUDA_ARCHS:-} ]] && ARCH=(-DCMAKE_CUDA_ARCHITECTURES="$DLOCO_CUDA_ARCHS")
if ! step configure 120 cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" -DDLOCO_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    "${ARCH[@]}"; then
    GPU_FAIL=1
    finish
fi
# Keep going past failures in other folders so the GPU tests still get built.
step build 360 cmake --build "$BUILD" -j "$JOBS" -- "${KEEP[@]}" || OTHER_FAIL=1

# ---- GPU tests. DLOCO_REQUIRE_CUDA=1 turns a "no device" skip into a failure:
# on this machine a skip means the GPU was not usable.
NGPU=$(ctest --test-dir "$BUILD" -N -L gpu 2>/dev/null | sed -n 's/^Total Tests: *//p')
if [[ -z $NGPU || $NGPU -eq 0 ]]; then
    SUMMARY+=("gpu-tests  FAIL: no test carries the ctest label 'gpu'")
    GPU_FAIL=1
else
    DLOCO_REQUIRE_CUDA=1 step gpu-tests 300 ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 180 \
        --output-junit "$LOG/gpu-tests.xml" || GPU_FAIL=1
    while read -r l; do SUMMARY+=("    $l"); done < <(grep -E '^ *[0-9]+/[0-9]+ Test' "$LOG/gpu-tests.log")
    if grep -q 'Skipped\|Not Run' "$LOG/gpu-tests.log"; then GPU_FAIL=1; fi
fi

# ---- GPU benchmarks, if someone wrote them
if [[ -f $SRC/bench/gpu.sh ]]; then
    DLOCO_BIN=$BUILD DLOCO_SRC=$SRC step bench 170 bash "$SRC/bench/gpu.sh" "$BUILD" || OTHER_FAIL=1
else
    SUMMARY+=("bench      (no bench/gpu.sh)")
fi

finish
