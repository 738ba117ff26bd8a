#!/bin/bash
# The wire codecs' CPU kernels on a 64 MB fp32 vector (16M floats), block 128,
# topk 8 per block: encode (nearest and stochastic, with error feedback) and
# decode_add GB/s of fp32 input, and the synchronizer's delta Update as four
# passes against dl_codec_encode_step (update_step_vs_4pass_*), on one thread
# and on THREADS threads, next to memcpy of the same buffer in the same run
# (bench/codec.c).
# Usage: bench/codec.sh [floats (16777216)]   (BUILD_DIR=build; THREADS=nproc; REPS=5)
set -euo pipefail
. "$(dirname "$0")/../tests/lib_args.sh"
dl_args 1 "$@"
if [ $# -ge 1 ]; then dl_args_number floats "$1"; fi
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-5}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target bench_codec >/dev/null
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
OMP_NUM_THREADS=$THREADS OMP_PROC_BIND=true "$BUILD_DIR"/bench/bench_codec "${1:-16777216}" 128 "$REPS"
