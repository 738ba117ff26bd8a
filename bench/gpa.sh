#!/bin/bash
# Steps to a target validation loss: AdamW vs GPA (generalized primal
# averaging over AdamW, docs/GPA.md) on the bench model (the model, corpus and
# learning rate of bench/quality.sh), standalone learners, the same learning-
# rate schedule (warm-up + cosine over STEPS) and the same 3 seeds each.
# Target (measured in this run, never given): the mean over the AdamW seeds
# of AdamW's validation loss at step BUDGET (2/3 of STEPS by default), so
# both optimizers have STEPS - BUDGET steps of headroom to reach it. Steps
# to target: the first evaluation (every EVAL steps: the resolution) at or
# below it. GPA runs with its defaults (gpa_mu_x from the DiLoCo mapping
# 0.9^(1/32), gpa_mu_y 0.7: the untuned figure), then the small sweep
# SWEEP_H (gpa_h values; mu_x = 0.9^(1/gpa_h)), 3 seeds each. Prints
# per-seed steps, mean and spread (min..max) per optimizer, and as its last
# line `gpa_steps_speedup: X.XX` (AdamW mean steps / GPA mean steps, the
# untuned GPA). A run that never reaches the target counts as STEPS (and is
# marked: the speedup is then an upper bound).
# Runs are deterministic (one thread each by default), so they may run side
# by side: PAR at a time (steps are counted, not seconds).
# Usage: bench/gpa.sh   (env: STEPS=200 BUDGET=130 EVAL=10 SEEDS="1 2 3"
#        SWEEP_H="4 8" (empty: no sweep) L=4 C=128 NH=4 T=128 B=16 LR=3e-3
#        WARMUP=20 VB=8 (validation batches of B sequences) THREADS=1 PAR=6
#        DATA=/usr/share/games/fortunes BUILD_DIR=build)
set -euo pipefail
. "$(dirname "$0")/../tests/lib_args.sh"
dl_args 0 "$@"
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
STEPS=${STEPS:-200} BUDGET=${BUDGET:-130} EVAL=${EVAL:-10} SEEDS=${SEEDS:-"1 2 3"} SWEEP_H=${SWEEP_H-"4 8"}
L=${L:-4} C=${C:-128} NH=${NH:-4} T=${T:-128} B=${B:-16} LR=${LR:-3e-3} WARMUP=${WARMUP:-20} VB=${VB:-8}
THREADS=${THREADS:-1} PAR=${PAR:-6} DATA=${DATA:-/usr/share/games/fortunes}
for v in STEPS BUDGET EVAL L C NH T B WARMUP VB THREADS PAR; do dl_args_number "$v" "${!v}"; done
if [ "$BUDGET" -gt "$STEPS" ] || [ "$EVAL" -lt 1 ] || [ $((BUDGET % EVAL)) != 0 ]; then
  echo "gpa.sh: BUDGET ($BUDGET) must be <= STEPS ($STEPS) and a multiple of EVAL ($EVAL)" >&2; exit 2
fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target dloco-learner >/dev/null
W=$(mktemp -d /tmp/dloco_gpa.XXXXXX)
trap 'rm -rf "$W"' EXIT
echo "model L=$L C=$C NH=$NH T=$T B=$B, lr $LR warm-up $WARMUP + cosine over $STEPS steps (both optimizers)," \
     "eval every $EVAL steps on $((VB * B)) validation sequences, seeds $SEEDS, $THREADS thread(s) per run, $PAR at a time;" \
     "target = mean AdamW val loss at step $BUDGET"
# run NAME SEED ARGS...: one standalone learner, its events in $W/NAME-SEED.ev
run() {
  local name=$1 seed=$2 t0; shift 2
  t0=$(date +%s)
  OMP_NUM_THREADS=$THREADS "$BUILD_DIR"/learner/dloco-learner --standalone --n_layer "$L" --n_head "$NH" \
    --n_embd "$C" --seq_len "$T" --data "$DATA" --batch "$B" --steps "$STEPS" --lr "$LR" --warmup "$WARMUP" \
    --seed "$seed" --val_every "$EVAL" --val_batches "$VB" --log_every "$EVAL" --events "$W/$name-$seed.ev" \
    "$@" > "$W/$name-$seed.log" 2>&1 || { echo "run $name seed $seed failed:"; tail -5 "$W/$name-$seed.log"; return 1; }
  touch "$W/$name-$seed.ok"
  echo "  $name seed $seed: $(( $(date +%s) - t0 )) s, final val $(sed -n -E 's/^summary:.*-> ([0-9.]+) \(best.*/\1/p' "$W/$name-$seed.log")"
}
# queue NAME SEED ARGS...: run in the background, at most PAR at a time
queue() {
  while [ "$(jobs -rp | wc -l)" -ge "$PAR" ]; do wait -n || true; done
  run "$@" &
}
for s in $SEEDS; do queue adamw "$s" --optimizer adamw; done
for s in $SEEDS; do queue gpa "$s" --optimizer gpa; done
for h in $SWEEP_H; do
  for s in $SEEDS; do queue "gpa_h$h" "$s" --optimizer gpa --gpa_h "$h"; done
done
wait
for s in $SEEDS; do
  for n in adamw gpa $(for h in $SWEEP_H; do echo "gpa_h$h"; done); do
    [ -f "$W/$n-$s.ok" ] || { echo "gpa.sh: run $n seed $s failed"; exit 1; }
  done
done
python3 - "$W" "$BUDGET" "$STEPS" "$SEEDS" "$SWEEP_H" <<'PY'
import re, statistics, sys
w, budget, steps, seeds, sweep = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(), sys.argv[5].split()

def curve(name, seed):
    """{step: val_loss} from the run's `step` events (docs/EVENTS.md)"""
    out = {}
    for line in open("%s/%s-%s.ev" % (w, name, seed)):
        if " event=step " not in line or "val_loss=" not in line:
            continue
        kv = dict(t.split("=", 1) for t in line.split() if "=" in t)
        out[int(kv["step"])] = float(kv["val_loss"])
    return out

adam = {s: curve("adamw", s) for s in seeds}
for s in seeds:
    if budget not in adam[s]:
        sys.exit("gpa.sh: adamw seed %s has no evaluation at step %d" % (s, budget))
target = statistics.mean(adam[s][budget] for s in seeds)
print("target: %.4f (mean AdamW val loss at step %d: %s)" % (target, budget,
      ", ".join("%.4f" % adam[s][budget] for s in seeds)))

def steps_to(c):
    hit = [k for k in sorted(c) if c[k] <= target]
    return (hit[0], True) if hit else (steps, False)

def report(label, name):
    per = [steps_to(curve(name, s)) for s in seeds]
    st = [p[0] for p in per]
    finals = [curve(name, s)[steps] for s in seeds]
    marks = ", ".join("%d%s" % (p[0], "" if p[1] else " (not reached)") for p in per)
    print("%-28s steps to target per seed: %s | mean %.1f, spread %d..%d (sd %.1f) | final val mean %.4f"
          % (label, marks, statistics.mean(st), min(st), max(st), statistics.pstdev(st), statistics.mean(finals)))
    return statistics.mean(st), all(p[1] for p in per), st

def signflip(ds):
    """exact two-sided paired sign-flip permutation test (all 2^n sign patterns; n seeds give p >= 2/2^n)"""
    n, obs = len(ds), abs(sum(ds))
    return sum(1 for k in range(1 << n)
               if abs(sum(d if k >> i & 1 else -d for i, d in enumerate(ds))) >= obs - 1e-12) / (1 << n)

def paired(label, st, ref):
    ds = [x - y for x, y in zip(st, ref)]
    print("  paired by seed, %s minus adamw steps: %s | sign-flip p=%.3f (n=%d, smallest possible %.3f)"
          % (label, " ".join("%+d" % d for d in ds), signflip(ds), len(ds), 2.0 / (1 << len(ds))))

a, _, ast = report("adamw", "adamw")
g, reached, gst = report("gpa (defaults, untuned)", "gpa")
paired("gpa", gst, ast)
for h in sweep:
    gh, rh, hst = report("gpa gpa_h=%s (mu_x %.4f)" % (h, 0.9 ** (1.0 / int(h))), "gpa_h" + h)
    paired("gpa_h=" + h, hst, ast)
    print("  speedup gpa_h=%s: %.2f%s" % (h, a / gh, "" if rh else " (a run did not reach the target: upper bound)"))
if not reached:
    print("note: an untuned GPA run did not reach the target in %d steps; the speedup is an upper bound" % steps)
print("gpa_steps_speedup: %.2f" % (a / g))
PY
