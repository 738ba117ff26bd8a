#!/bin/bash
# Heterogeneous learners (docs/HETEROGENEOUS.md): the scenario
# chaos/scenarios/hetero.ini (learners at speeds 1, 1, 0.5, 0.25, one of the
# fast ones at twice the batch, no faults) in three variants, each over SEEDS
# seeds with the same seed per variant:
#   plain    as written: every learner pushes every H steps, the merge weights
#            each push by its tokens (the batch-16 learner's by twice as many)
#   dynamic  every learner with --dynamic_h speed (H scaled by its step rate
#            over the fleet's median, changed at push-cycle boundaries)
#   bf16     plain, with the half-speed learner computing in bf16
#            (--precision bf16; the synchronizer merges fp32 as always)
# Prints per variant and seed the goodput, the final global validation loss,
# merges and mean staleness (dloco-chaos's report.json) and the pushes each
# learner had accepted / dropped stale and its last H (its events), then per
# variant the mean and spread (sample standard deviation), the ratios of the
# means against plain measured in the same run, and per variant the per-seed
# differences from plain with an exact paired sign-flip test; last line
#   hetero_dynamic_h_loss_ratio: X.XXX   (dynamic's mean final loss / plain's)
# Usage: bench/hetero.sh [OUT_DIR]   (env: SEEDS="1 2 3", DURATION_S=90,
#        VARIANTS="plain dynamic bf16", DYNAMIC_ARGS="--dynamic_h speed" (the
#        dynamic variant's learner flags, e.g. add --dynamic_h_max 16),
#        BUILD_DIR=build)
set -euo pipefail
. "$(dirname "$0")/../tests/lib_args.sh"
dl_args 1 "$@"
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
OUT=${1:-runs/hetero-$(date +%Y%m%d-%H%M%S)}
SEEDS=${SEEDS:-1 2 3}
DURATION_S=${DURATION_S:-90}
VARIANTS=${VARIANTS:-plain dynamic bf16}
DYNAMIC_ARGS=${DYNAMIC_ARGS:---dynamic_h speed}
case "$DYNAMIC_ARGS" in *$'\n'*) echo "bench/hetero.sh: DYNAMIC_ARGS holds a newline" >&2; exit 2 ;; esac
for s in $SEEDS; do dl_args_number SEEDS "$s"; done
dl_args_number DURATION_S "$DURATION_S"
for v in $VARIANTS; do
  case "$v" in plain|dynamic|bf16) ;; *) echo "bench/hetero.sh: VARIANTS: '$v' is not plain, dynamic or bf16" >&2; exit 2 ;; esac
done
case " $VARIANTS " in *" plain "*) ;; *) echo "bench/hetero.sh: VARIANTS must include plain (the reference)" >&2; exit 2 ;; esac
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target dloco-chaos dloco-sync dloco-learner dloco > /dev/null
[ -e "$OUT" ] && { echo "bench/hetero.sh: $OUT exists (a run directory must be new)" >&2; exit 2; }
mkdir -p "$OUT"
# the variants' scenario files, from the one scenario
python3 - chaos/scenarios/hetero.ini "$OUT" "$DYNAMIC_ARGS" << 'PY'
import sys
src, out, dyn = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(src).read()
base = "args = --warmup 20"
assert text.count(base) == 1, "hetero.ini: the [learners] args line changed; update bench/hetero.sh"
open(out + "/plain.ini", "w").write(text)
open(out + "/dynamic.ini", "w").write(text.replace(base, base + " " + dyn))
half = "[learner half]\n"
assert text.count(half) == 1
open(out + "/bf16.ini", "w").write(text.replace(half, half + "args = --warmup 20 --precision bf16\n"))
PY
echo "dynamic variant: $DYNAMIC_ARGS"
echo "hetero: $(sed -n 's/^# hetero: //p' <("$BUILD_DIR"/chaos/dloco-chaos timeline "$OUT/plain.ini")); variants: $VARIANTS; seeds: $SEEDS; ${DURATION_S} s each"
for seed in $SEEDS; do
  for v in $VARIANTS; do
    t0=$(date +%s)
    "$BUILD_DIR"/chaos/dloco-chaos run "$OUT/$v.ini" --out "$OUT/$v-s$seed" --seed "$seed" \
      --duration_s "$DURATION_S" > "$OUT/$v-s$seed.log" 2>&1 || { tail -20 "$OUT/$v-s$seed.log"; exit 1; }
    echo "  ran $v seed $seed ($(( $(date +%s) - t0 )) s)"
  done
done
python3 - "$OUT" "$SEEDS" "$VARIANTS" << 'PY'
import glob, json, math, os, sys
out, seeds, variants = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()

def events(path, name):
    for line in open(path, errors="replace"):
        if " event=%s " % name not in line + " ":
            continue
        kv = {}
        for tok in line.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                kv[k] = v
        yield kv

res = {}
print("%-8s %5s %8s %10s %7s %9s  %s" % ("variant", "seed", "goodput", "val loss", "merges", "staleness",
                                         "per learner: accepted/dropped_stale pushes, last H"))
for v in variants:
    for s in seeds:
        d = os.path.join(out, "%s-s%s" % (v, s))
        rep = json.load(open(os.path.join(d, "report.json")))
        r = rep["runs"][0]
        per = []
        for f in sorted(glob.glob(os.path.join(d, "decoupled", "events-*.log"))):
            lid = os.path.basename(f)[7:-4]
            if lid in ("chaos", "sync"):
                continue
            summ = list(events(f, "learner_summary"))
            hs = list(events(f, "dynamic_h"))
            acc = sum(int(e.get("accepted", 0)) for e in summ)
            drop = sum(int(e.get("dropped_stale", 0)) for e in summ)
            per.append("%s %d/%d H=%s" % (lid, acc, drop, hs[-1]["h"] if hs else "-"))
        loss = r.get("final_val_loss")
        st = (r.get("staleness") or {}).get("mean")
        res[(v, s)] = (r["goodput"], loss)
        print("%-8s %5s %8.3f %10s %7d %9s  %s" % (v, s, r["goodput"], "%.4f" % loss if loss is not None else "-",
              r["merges"], "%.2f" % st if st is not None else "-", "; ".join(per)))

def stats(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd

print("%-8s %18s %20s %12s %12s" % ("variant", "goodput mean+-sd", "val loss mean+-sd", "loss/plain", "goodput/plain"))
means = {}
for v in variants:
    g = stats([res[(v, s)][0] for s in seeds])
    l = stats([res[(v, s)][1] for s in seeds])
    means[v] = (g[0], l[0])
for v in variants:
    g = stats([res[(v, s)][0] for s in seeds])
    l = stats([res[(v, s)][1] for s in seeds])
    lr = l[0] / means["plain"][1] if l[0] and means["plain"][1] else float("nan")
    gr = g[0] / means["plain"][0] if g[0] and means["plain"][0] else float("nan")
    print("%-8s %9.3f +- %-6.3f %11.4f +- %-6.4f %12.3f %12.3f" % (v, g[0], g[1], l[0] or float("nan"), l[1] or 0, lr, gr))
# paired by seed (the same seed runs the same scenario timeline in every variant): the exact two-sided sign-flip
# permutation test of the per-seed differences against plain (all 2^n sign patterns; n seeds give p >= 2/2^n)
def signflip(ds):
    n = len(ds)
    obs = abs(sum(ds))
    hits = sum(1 for k in range(1 << n) if abs(sum(d if k >> i & 1 else -d for i, d in enumerate(ds))) >= obs - 1e-12)
    return hits / (1 << n)
for v in variants:
    if v == "plain":
        continue
    for what, i in (("val loss", 1), ("goodput", 0)):
        pairs = [(res[(v, s)][i], res[("plain", s)][i]) for s in seeds]
        if any(a is None or b is None for a, b in pairs):
            continue
        ds = [a - b for a, b in pairs]
        print("paired %-7s %-8s minus plain per seed: %s | mean %+.4f | sign-flip p=%.3f (n=%d, smallest possible %.3f)"
              % (v, what, " ".join("%+.4f" % d for d in ds), sum(ds) / len(ds), signflip(ds), len(ds),
                 2.0 / (1 << len(ds))))
if "dynamic" in variants:
    print("hetero_dynamic_h_loss_ratio: %.3f" % (means["dynamic"][1] / means["plain"][1]))
PY
