#!/bin/bash
# CPU learner throughput vs PyTorch on the same GPT-2 config, same machine,
# same run, both on the same OpenBLAS kernels: the core dloco chooses from the
# CPU's flags (kernels/blas_select.h; BLAS_CORE=CORE forces one, an
# OPENBLAS_CORETYPE you set is kept) is given to PyTorch's OpenBLAS too, with
# the same thread count. Prints model FLOP/s as a fraction of that kernel's
# measured sgemm (same run) and of the fp32 FMA peak from the flags and clock.
# Last line: learner_vs_torch_cpu: X.XX (dloco tok/s / torch tok/s).
# Usage: bench/learner.sh [steps]   (BUILD_DIR=build; THREADS=2; BLAS_CORE=auto)
set -euo pipefail
. "$(dirname "$0")/../tests/lib_args.sh"
dl_args 1 "$@"
if [ $# -ge 1 ]; then dl_args_number steps "$1"; fi
cd "$(dirname "$0")/.."
deploy/setup.sh --with-torch >/dev/null
BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-2}
STEPS=${1:-20}
BLAS_CORE=${BLAS_CORE:-auto}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target bench_learner >/dev/null
L=4 C=256 NH=4 T=128 B=16 V=256
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
# the kernel choice, once: its log line names the core and why
sel=$("$BUILD_DIR"/bench/bench_learner --blas_core "$BLAS_CORE" peak 2>&1) || { echo "$sel" >&2; exit 2; }
line=$(echo "$sel" | grep -m1 ' blas=') || { echo "bench/learner.sh: no kernel choice line: $sel" >&2; exit 2; }
field() { echo "$line" | grep -o " $1=[^ ]*" | head -1 | cut -d= -f2; }
core=$(field core)
[ -n "$core" ] || { echo "bench/learner.sh: the BLAS is not OpenBLAS ($line)" >&2; exit 2; }
echo "kernel: openblas core $core for dloco and PyTorch ($(echo "$line" | sed 's/.* msg=//'); by=$(field by))"
export OPENBLAS_CORETYPE=$core
echo "config: L=$L C=$C NH=$NH T=$T B=$B V=$V, $STEPS timed steps after 3 warm-up, $THREADS threads each"
# torch first, then dloco, then torch again: a drift in machine load shows up
# as a gap between the two torch figures
t1=$(/usr/bin/python3 bench/torch_gpt.py $L $C $NH $T $B $V "$STEPS" "$THREADS")
echo "$t1"
d=$(OMP_PROC_BIND=true "$BUILD_DIR"/bench/bench_learner $L $C $NH $T $B $V "$STEPS" 2>/dev/null)
echo "$d"
t2=$(/usr/bin/python3 bench/torch_gpt.py $L $C $NH $T $B $V "$STEPS" "$THREADS")
echo "$t2"
mhz=$(sed -n -E 's/^cpu MHz[[:space:]]*: ([0-9.]+).*/\1/p' /proc/cpuinfo | head -1)
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
/usr/bin/python3 - "$d" "$t1" "$t2" "$core" "${mhz:-0}" "$flags" "$THREADS" <<'PY'
import sys, re
d, t1, t2, core, mhz, flags, threads = sys.argv[1:8]
tok = lambda s: float(re.search(r"tok/s ([0-9.]+)", s).group(1))
num = lambda s, k: float(re.search(k + r" ([0-9.]+)", s).group(1))
for t in (t1, t2):
    tc = re.search(r"blas_core (\S+) blas_threads (\d+)", t)
    if not tc or tc.group(1).lower() != core.lower() or int(tc.group(2)) != int(threads):
        sys.exit("bench/learner.sh: PyTorch ran on OpenBLAS core %s with %s threads, not %s with %s: the comparison "
                 "is not fair" % (tc.group(1) if tc else "?", tc.group(2) if tc else "?", core, threads))
dt, tt1, tt2 = tok(d), tok(t1), tok(t2)
model, sgemm = num(d, "model GFLOP/s"), num(d, "sgemm_peak GFLOP/s")
f = set(flags.split())
# fp32 flop per cycle per core: two FMA pipes (Haswell and later, Zen 2 and
# later; some AVX-512 parts have one) x lanes x 2; without FMA a mul and an add pipe
if {"avx512f", "avx512bw", "avx512vl"} <= f:
    what, fpc = "avx-512 fma: 2 pipes x 16 lanes x 2", 64
elif {"avx2", "fma"} <= f:
    what, fpc = "avx2 fma: 2 pipes x 8 lanes x 2", 32
elif "avx" in f:
    what, fpc = "avx: mul + add x 8 lanes", 16
else:
    what, fpc = "sse: mul + add x 4 lanes", 8
ghz = float(mhz) / 1e3
peak = fpc * ghz * int(threads)
t = max(tt1, tt2)  # compare against PyTorch's better run
print("sgemm of core %s (same run, %s threads): %.1f GFLOP/s; model %.1f GFLOP/s = %.2f of it"
      % (core, threads, sgemm, model, model / sgemm))
if peak > 0:
    print("fp32 peak from cpu flags and clock (%s flop/cycle x %.2f GHz nominal x %s cores): %.1f GFLOP/s; "
          "sgemm %.2f, model %.2f of it (a boost clock can lift both above 1)"
          % (what, ghz, threads, peak, sgemm / peak, model / peak))
print("torch runs %.0f and %.0f tok/s (spread %.0f%%)" % (tt1, tt2, 100 * abs(tt1 - tt2) / max(tt1, tt2)))
print("learner_vs_torch_cpu: %.2f" % (dt / t))
PY
