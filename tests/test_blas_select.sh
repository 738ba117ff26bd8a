#!/bin/bash
# OpenBLAS's kernels chosen before the first matmul (kernels/blas_select.h),
# from outside, on real programs: the first stderr line names the core (keys
# blas, core, detected, by); an explicit OPENBLAS_CORETYPE is kept; --blas_core
# forces a core by re-executing once (one line, same argv); the re-exec guard
# and the debugger case do not re-execute; a core the CPU cannot run is refused
# (exit 2, never an illegal instruction); and under every core the CPU can run,
# dloco's kernel tests pass and a learner's losses agree with the default's.
set -u
B=${DLOCO_BIN:-build}
L=$B/learner/dloco-learner
W=$(mktemp -d /tmp/dloco_blas.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$W/corpus.txt"
RUN="--standalone --device cpu --data $W/corpus.txt --n_layer 2 --n_embd 64 --n_head 2 --seq_len 32 --batch 4 --steps 3
     --warmup 1 --val_batches 1 --log_every 1 --threads 2"

# key NAME FILE: the value of NAME in the first blas= line of FILE
key() { grep -m1 '^ts=[^ ]* level=info proc=[^ ]* blas=' "$2" | grep -o " $1=[^ ]*" | head -1 | cut -d= -f2; }
# run_l NAME ARGS...: dloco-learner with stdout/stderr in $W/NAME.{out,err}; RC set
run_l() { local n=$1; shift; "$L" "$@" > "$W/$n.out" 2> "$W/$n.err"; RC=$?; }
first_is_blas() { head -1 "$W/$1.err" | grep -q '^ts=[^ ]* level=info proc=[^ ]* blas=openblas core=[A-Za-z0-9_]* '; }
# the loss of step 3 from the learner's echoed events
loss3() { sed -n -E 's/.* event=step step=3 loss=([0-9.e+-]+).*/\1/p' "$W/$1.err"; }

flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { for f in "$@"; do echo "$flags " | grep -q " $f " || return 1; done; }
level=1
has avx && level=2
has avx2 fma && level=3
has avx512f avx512bw avx512vl avx512dq avx512cd && level=4
echo "cpu flag level $level (1 sse3, 2 avx, 3 avx2+fma, 4 avx-512)"

# ---- the default: OpenBLAS's detection, or the flags' choice when better
run_l def $RUN
core=$(key core "$W/def.err"); by=$(key by "$W/def.err")
if [ "$RC" = 0 ] && first_is_blas def && [ -n "$core" ] && { [ "$by" = detected ] || [ "$by" = auto ]; }; then
  ok "default run: first line names core $core (by=$by): $(head -1 "$W/def.err" | sed 's/.* msg=//')"
else bad "default run rc $RC, first line: $(head -1 "$W/def.err")"; fi
[ "$(grep -c ' blas=' "$W/def.err")" = 1 ] && ok "one blas line" || bad "blas lines: $(grep -c ' blas=' "$W/def.err")"
base=$(loss3 def)
[ -n "$base" ] && ok "default core trains: step 3 loss $base" || bad "no step-3 loss in the default run"
case $core in
  SkylakeX|Cooperlake|SapphireRapids) clevel=4 ;; Haswell|Zen|Excavator) clevel=3 ;;
  Sandybridge|Bulldozer|Piledriver|Steamroller) clevel=2 ;; *) clevel=1 ;;
esac
[ "$clevel" -ge "$level" ] || [ "$level" -le 1 ] && ok "default core $core is at the flags' level ($clevel >= $level)" \
  || bad "default core $core (level $clevel) below the flags' level $level"

# ---- an explicit OPENBLAS_CORETYPE wins over the choice
OPENBLAS_CORETYPE=Prescott run_l env $RUN
[ "$RC" = 0 ] && [ "$(key core "$W/env.err")" = Prescott ] && [ "$(key by "$W/env.err")" = env ] \
  && ok "OPENBLAS_CORETYPE=Prescott kept (by=env)" || bad "OPENBLAS_CORETYPE=Prescott: rc $RC: $(head -1 "$W/env.err")"
OPENBLAS_CORETYPE=Prescott run_l envauto $RUN --blas_core auto
[ "$RC" = 0 ] && [ "$(key core "$W/envauto.err")" = Prescott ] && ok "--blas_core auto keeps the user's OPENBLAS_CORETYPE" \
  || bad "--blas_core auto over OPENBLAS_CORETYPE: $(head -1 "$W/envauto.err")"

# ---- --blas_core forces a core: one re-exec, same argv, one line
run_l opt $RUN --blas_core Prescott
[ "$RC" = 0 ] && [ "$(key core "$W/opt.err")" = Prescott ] && [ "$(key by "$W/opt.err")" = option ] \
  && [ "$(key detected "$W/opt.err")" = "$core" ] && [ "$(grep -c ' blas=' "$W/opt.err")" = 1 ] \
  && grep -q 'dloco-learner standalone: GPT L=2' "$W/opt.out" \
  && ok "--blas_core Prescott: core=Prescott by=option detected=$core, the run's options intact" \
  || bad "--blas_core Prescott: rc $RC: $(head -2 "$W/opt.err")"
OPENBLAS_CORETYPE=Nehalem run_l optenv $RUN --blas-core=Prescott
[ "$RC" = 0 ] && [ "$(key core "$W/optenv.err")" = Prescott ] && [ "$(key detected "$W/optenv.err")" = Nehalem ] \
  && ok "--blas-core=Prescott beats OPENBLAS_CORETYPE=Nehalem" || bad "--blas-core over the env: $(head -1 "$W/optenv.err")"
# the synchronizer and dloco eval take the same option
"$B/synchronizer/dloco-sync" --blas_core Prescott --help > /dev/null 2> "$W/sync.err"; RC=$?
[ "$RC" = 0 ] && [ "$(key core "$W/sync.err")" = Prescott ] && ok "dloco-sync --blas_core Prescott" \
  || bad "dloco-sync: rc $RC: $(head -1 "$W/sync.err")"
"$B/tools/dloco" eval "$W/no-store" --blas_core Prescott > /dev/null 2> "$W/eval.err"; RC=$?
[ "$RC" != 0 ] && [ "$(key core "$W/eval.err")" = Prescott ] && grep -q 'opening the store' "$W/eval.err" \
  && ok "dloco eval --blas_core Prescott (then refuses the missing store)" || bad "dloco eval: rc $RC: $(cat "$W/eval.err")"
"$B/tools/dloco" status "$W/no-store" > /dev/null 2> "$W/status.err"
grep -q ' blas=' "$W/status.err" && bad "dloco status (no matmul) printed a blas line" || ok "dloco status: no blas line"

# ---- the guard: a process that already re-executed itself never does again
DLOCO_BLAS_CHOICE="Nehalem Zen option PID" OPENBLAS_CORETYPE=Nehalem \
  bash -c 'export DLOCO_BLAS_CHOICE=${DLOCO_BLAS_CHOICE/PID/$$}; exec "$0" --blas_core Prescott --help' "$L" \
  > /dev/null 2> "$W/guard.err"; RC=$?
[ "$RC" = 0 ] && [ "$(key core "$W/guard.err")" = Nehalem ] && grep -q 'did not take it' "$W/guard.err" \
  && ok "re-exec guard: same pid, no second re-exec" || bad "guard: rc $RC: $(head -1 "$W/guard.err")"
# under a tracer: no re-exec, and the line says what to set
if strace -f -o /dev/null true 2> /dev/null; then
  strace -f -o /dev/null "$L" --blas_core Prescott --help > /dev/null 2> "$W/trace.err"; RC=$?
  [ "$RC" = 0 ] && [ "$(key core "$W/trace.err")" = "$core" ] && grep -q 'debugger.*OPENBLAS_CORETYPE=Prescott' "$W/trace.err" \
    && ok "under strace: not re-executed, says to set OPENBLAS_CORETYPE" || bad "strace: rc $RC: $(head -1 "$W/trace.err")"
else echo "skip: strace cannot trace here (the debugger case)"; fi

# ---- refusals: bad values, and cores this CPU cannot run
run_l badv --blas_core Pentium4 $RUN
[ "$RC" = 2 ] && grep -q "option --blas_core 'Pentium4' is not an OpenBLAS core" "$W/badv.err" \
  && ok "--blas_core Pentium4 refused (exit 2)" || bad "bad value: rc $RC: $(cat "$W/badv.err")"
run_l nov $RUN --blas_core
[ "$RC" = 2 ] && grep -q 'option --blas_core needs a value' "$W/nov.err" && ok "--blas_core without a value refused" \
  || bad "no value: rc $RC"
if [ "$level" -lt 4 ]; then
  run_l high $RUN --blas_core SkylakeX
  [ "$RC" = 2 ] && grep -q 'needs avx512f.*illegal instruction' "$W/high.err" && ok "--blas_core SkylakeX refused on a CPU without AVX-512" \
    || bad "--blas_core SkylakeX: rc $RC: $(cat "$W/high.err")"
  OPENBLAS_CORETYPE=SkylakeX run_l highenv $RUN
  [ "$RC" = 2 ] && grep -q 'unset OPENBLAS_CORETYPE' "$W/highenv.err" && ok "OPENBLAS_CORETYPE=SkylakeX refused (exit 2, no SIGILL)" \
    || bad "OPENBLAS_CORETYPE=SkylakeX: rc $RC: $(cat "$W/highenv.err")"
else echo "skip: this CPU runs every core (the refusal of one above its flags)"; fi

# ---- every core the flags allow computes right: kernel tests and the same losses
cores="Prescott Nehalem"
[ "$level" -ge 2 ] && cores+=" Sandybridge"
[ "$level" -ge 3 ] && cores+=" Haswell Zen"
[ "$level" -ge 4 ] && cores+=" SkylakeX"
for c in $cores; do
  if OPENBLAS_CORETYPE=$c "$B/kernels/test_kernels" > "$W/k_$c.out" 2>&1; then ok "test_kernels under $c"
  else bad "test_kernels under $c: $(grep FAIL "$W/k_$c.out" | head -3)"; fi
  run_l "c_$c" $RUN --blas_core "$c"
  l=$(loss3 "c_$c")
  if [ "$RC" = 0 ] && [ "$(key core "$W/c_$c.err")" = "$c" ] && [ -n "$l" ] && [ -n "$base" ] \
     && awk -v a="$l" -v b="$base" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-4 * b) }'; then
    ok "learner under $c: step 3 loss $l (default $base)"
  else bad "learner under $c: rc $RC loss '$l' vs '$base': $(head -1 "$W/c_$c.err")"; fi
done
exit $fail
