#!/bin/bash
# Workload-aware sync timing against a matched-random control (docs/SYNC_TIMING.md).
#
# A serving sidecar (dloco-serve: CPU work per request, latency SLO) shares one CPU (taskset -c $CPU) with a
# real dloco-sync and one dloco-learner; dloco-loadgen (on $LGCPU) drives it with a seeded open-loop load.
# For each regime (steady, bursty, aperiodic) x seed, with the same load schedule for every run of a seed:
#   nosync      the same networked learner and dloco-sync with H = 1000000 and --final_flush false (no push,
#               no Update: sync disabled, the same processes and code path otherwise): the load match
#   fixed       --sync_timing fixed (push every H, staggered)
#   wa          --sync_timing wa, pressure from the sidecar's /pressure
#   wa_forecast --sync_timing wa_forecast
#   mr_wa       matched_random with the per-fragment push counts of this seed's wa run
#   mr_wf       matched_random with those of this seed's wa_forecast run
#   oracle      oracle with wa_forecast's counts and the pressure it observed per step
# The SLO-violation rate of a run is the share of requests scheduled while the learner trained (from the
# load's start to the learner's summary event) that took longer than SLO_MS from their scheduled time (or
# failed). Training loss cost: mean training loss of the last 20 steps minus fixed's. Placement gain =
# violation rate of matched-random minus that of the policy (percentage points; > 0: the policy's placement
# helps), tested across seeds by the exact paired sign-flip permutation test (two-sided, all 2^n sign
# assignments of the per-seed differences; n seeds give p >= 2/2^n). Last line, for the bursty regime:
#   wa_forecast_gain_vs_matched_random_pp: X (p=Y)
# Knobs (env): REGIMES ("steady bursty aperiodic"), SEEDS (4), DUR_S (12: load seconds per run), STEPS (the
# learner's steps; 0 = sized from a calibration run to outlast DUR_S), RATE (30 req/s), BURST_X (5),
# PERIOD_S (5), DUTY (0.3), SLO_MS (20), WORK_ITERS (400000), H (8), P (4), HMIN (4), HMAX (24),
# CPU (0), LGCPU (1), W_LINK (0), W_QUEUE (1: --wa_w_queue), KEEP_W (keep the work folder). Defaults: 3 x 4 x 7 runs of ~15 s (runs at DUR_S=8 took 11-17 s), ~20-25 min on 2 cores.
. "$(dirname "$0")/../tests/lib_args.sh"
dl_args 0 "$@"
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
REGIMES=${REGIMES:-steady bursty aperiodic} SEEDS=${SEEDS:-4} DUR_S=${DUR_S:-12} STEPS=${STEPS:-0}
RATE=${RATE:-30} BURST_X=${BURST_X:-5} PERIOD_S=${PERIOD_S:-5} DUTY=${DUTY:-0.3} SLO_MS=${SLO_MS:-20}
WORK_ITERS=${WORK_ITERS:-400000} H=${H:-8} P=${P:-4} HMIN=${HMIN:-4} HMAX=${HMAX:-24} CPU=${CPU:-0} LGCPU=${LGCPU:-1}
for v in SEEDS DUR_S STEPS WORK_ITERS H P HMIN HMAX CPU LGCPU; do dl_args_number "$v" "${!v}"; done
B=$BUILD_DIR
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$B" -j"$(nproc)" --target dloco-sync dloco-learner dloco-serve dloco-loadgen >/dev/null || exit 1
command -v taskset >/dev/null || { echo "wa.sh: needs taskset (util-linux) to pin the learner and the sidecar" >&2; exit 1; }
W=$(mktemp -d /tmp/dloco_wa.XXXXXX)
PIDS=()
cleanup() { local p; for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; [ -n "${KEEP_W:-}" ] || rm -rf "$W"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
. tests/lib_events.sh
export OMP_NUM_THREADS=1
for i in $(seq 1 3000); do echo "line $i: the quick brown fox jumps over the lazy dog number $((i * 7919 % 1000))."; done > "$W/corpus.txt"
DATA=${DATA:-/usr/share/games/fortunes}
[ -e "$DATA" ] || DATA="$W/corpus.txt"
MODEL="--n_layer 2 --n_head 4 --n_embd 128 --seq_len 64 --vocab 256"
LARGS="$MODEL --data $DATA --batch 8 --warmup 10 --lr 3e-3 --threads 1 --seed 7 --val_every 0 --val_batches 1 --log_every 1000"
SYNCARGS="$MODEL --fragments $P --quorum 1 --heartbeat_ms 200 --status_every_ms 0 --outer_lr 1.0 --outer_momentum 0"
# link pressure off (W_LINK=0): the only link here is loopback, which carries this learner's own sync traffic
# (and the other processes' of the host), so link_util would be the policy's own pushes fed back.
# Backlog pressure W_QUEUE (1, with --wa_queue_ref 1), set before any run with it: one /work request waiting
# or in service is pressure 1, more than the most staleness progress before the forced push
# ((HMAX - H) / (HMAX - HMIN) = 0.8 at the defaults), so wa pushes unforced only while the sidecar is idle
WA_ARGS="--h_min $HMIN --h_max $HMAX --wa_rate_ref $(python3 -c "print($RATE * 1.5)") --wa_w_link ${W_LINK:-0} --wa_w_queue ${W_QUEUE:-1} --wa_queue_ref 1 --pressure_poll_ms 50"

wait_for() { # SECONDS 'condition'
  local end=$(( $(date +%s) + $1 )); while ! eval "$2"; do [ "$(date +%s)" -lt "$end" ] || return 1; sleep 0.05; done
}
stop_pid() { kill -TERM "$1" 2>/dev/null; local i; for i in $(seq 1 200); do kill -0 "$1" 2>/dev/null || break; sleep 0.05; done; kill -KILL "$1" 2>/dev/null; wait "$1" 2>/dev/null; }

# run_one NAME REGIME SEED [learner args...]: one measured run; NAME=nosync runs with sync disabled (H = 1000000)
run_one() {
  local name=$1 regime=$2 seed=$3; shift 3
  local d="$W/$regime-$seed-$name"; mkdir -p "$d"
  local sp="" ep=""
  local sh=$H; [ "$name" = nosync ] && sh=1000000
  : > "$d/ev-sync.log"
  taskset -c "$CPU" "$B/synchronizer/dloco-sync" --store "$d/store" --bind tcp://127.0.0.1:0 $SYNCARGS --H "$sh" \
    --events "$d/ev-sync.log" > "$d/sync.log" 2>&1 &
  sp=$!; PIDS+=("$sp")
  wait_for 30 '[ -n "$(ev_last "$d/ev-sync.log" sync_start endpoint)" ]' || { echo "wa.sh: dloco-sync did not start ($d)"; return 1; }
  ep=$(ev_last "$d/ev-sync.log" sync_start endpoint)
  : > "$d/ev-serve.log"
  taskset -c "$CPU" "$B/chaos/dloco-serve" --work_iters "$WORK_ITERS" --slo_ms "$SLO_MS" --events "$d/ev-serve.log" \
    > "$d/serve.log" 2>&1 &
  local vp=$!; PIDS+=("$vp")
  wait_for 30 '[ -n "$(ev_last "$d/ev-serve.log" serve_start work)" ]' || { echo "wa.sh: dloco-serve did not start"; return 1; }
  local wk pr; wk=$(ev_last "$d/ev-serve.log" serve_start work); pr=$(ev_last "$d/ev-serve.log" serve_start pressure)
  : > "$d/ev-learner.log"
  taskset -c "$CPU" "$B/learner/dloco-learner" --connect "$ep" --id l0 --recovery off --fragments "$P" $LARGS --steps "$STEPS" \
    --pressure "http://$pr/pressure" --timing_trace_out "$d/trace.txt" --events "$d/ev-learner.log" \
    --loss_log "$d/loss.txt" "$@" > "$d/learner.log" 2>&1 &
  local lp=$!; PIDS+=("$lp")
  wait_for 60 '[ -s "$d/loss.txt" ] || ! kill -0 $lp 2>/dev/null' || { echo "wa.sh: learner did not start ($d)"; return 1; }
  : > "$d/ev-loadgen.log"
  taskset -c "$LGCPU" "$B/chaos/dloco-loadgen" --target "$wk" --regime "$regime" --seed "$seed" --rate "$RATE" \
    --burst_x "$BURST_X" --period_s "$PERIOD_S" --duty "$DUTY" --duration_s "$DUR_S" --slo_ms "$SLO_MS" \
    --out "$d/lat.txt" --events "$d/ev-loadgen.log" > "$d/loadgen.log" 2>&1 &
  local gp=$!; PIDS+=("$gp")
  local end=$(( $(date +%s) + DUR_S * 4 + 120 ))
  while kill -0 "$lp" 2>/dev/null; do [ "$(date +%s)" -lt "$end" ] || { echo "wa.sh: learner overran ($d)"; stop_pid "$lp"; break; }; sleep 0.1; done
  wait "$lp"; local rc=$?
  while kill -0 "$gp" 2>/dev/null; do [ "$(date +%s)" -lt "$end" ] || { stop_pid "$gp"; break; }; sleep 0.1; done
  wait "$gp" 2>/dev/null
  stop_pid "$vp"
  stop_pid "$sp"
  rm -rf "$d/store"
  [ "$rc" = 0 ] || { echo "wa.sh: learner exited $rc ($d)"; tail -5 "$d/learner.log"; return 1; }
}

if [ "$STEPS" = 0 ]; then # calibrate: steps per second of a networked learner next to the sidecar under load
  STEPS=60
  run_one fixed steady 999 --sync_timing fixed >/dev/null || exit 1
  STEPS=$(python3 - "$W/steady-999-fixed" "$DUR_S" <<'EOF'
import sys, os
d, dur = sys.argv[1], float(sys.argv[2])
ts = [int(l.split()[0][3:]) for l in open(os.path.join(d, 'ev-learner.log')) if ' event=ready ' in l or ' event=learner_summary ' in l]
sps = 60 / ((ts[-1] - ts[0]) / 1e9)
print(int(sps * dur * 1.25) + 10)  # outlast the load by a quarter
EOF
)
  echo "calibration: $STEPS steps to cover ${DUR_S} s of load"
fi
echo "bench/wa.sh: regimes [$REGIMES], $SEEDS seeds, ${DUR_S} s of load per run, $STEPS learner steps, rate $RATE" \
     "req/s x$BURST_X bursts (period ${PERIOD_S} s, duty $DUTY), SLO ${SLO_MS} ms, work_iters $WORK_ITERS, H=$H P=$P" \
     "corridor [$HMIN, $HMAX], CPU $CPU (learner, sync, sidecar) / $LGCPU (load)"
order() { python3 -c "import random, sys; l = sys.argv[2:]; random.Random(sys.argv[1]).shuffle(l); print(' '.join(l))" "$@"; }
t_all=$(date +%s)
for regime in $REGIMES; do
  for s in $(seq 1 "$SEEDS"); do
    t0=$(date +%s)
    # seeded order inside each group, so a drift of the machine's background load is not always on one policy
    for pol in $(order "$regime$s" nosync fixed wa wa_forecast); do
      case $pol in
      nosync) run_one nosync "$regime" "$s" --sync_timing fixed --final_flush false ;;
      fixed) run_one fixed "$regime" "$s" --sync_timing fixed ;;
      *) run_one "$pol" "$regime" "$s" --sync_timing "$pol" $WA_ARGS ;;
      esac || exit 1
    done
    for pol in $(order "$s$regime" mr_wa mr_wf oracle); do
      case $pol in
      mr_wa) run_one mr_wa "$regime" "$s" --sync_timing matched_random $WA_ARGS --timing_seed $((1000 + s)) \
        --timing_trace_in "$W/$regime-$s-wa/trace.txt" ;;
      mr_wf) run_one mr_wf "$regime" "$s" --sync_timing matched_random $WA_ARGS --timing_seed $((2000 + s)) \
        --timing_trace_in "$W/$regime-$s-wa_forecast/trace.txt" ;;
      oracle) run_one oracle "$regime" "$s" --sync_timing oracle $WA_ARGS \
        --timing_trace_in "$W/$regime-$s-wa_forecast/trace.txt" ;;
      esac || exit 1
    done
    echo "  $regime seed $s: 7 runs in $(( $(date +%s) - t0 )) s"
  done
done
echo "all runs: $(( $(date +%s) - t_all )) s"
python3 - "$W" "$SLO_MS" "$SEEDS" "$RATE" $REGIMES <<'EOF'
import sys, os, itertools, math
W, slo, nseeds, rate_ref, regimes = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), 1.5 * float(sys.argv[4]), sys.argv[5:]
POL = ['nosync', 'fixed', 'wa', 'wa_forecast', 'mr_wa', 'mr_wf', 'oracle']

def events(path, name):
    out = []
    for l in open(path):
        if f' event={name} ' not in l and not l.rstrip().endswith(f' event={name}'): continue
        kv = dict(t.split('=', 1) for t in l.split() if '=' in t)
        out.append(kv)
    return out

def run(regime, seed, pol):
    d = os.path.join(W, f'{regime}-{seed}-{pol}')
    t0 = int(events(os.path.join(d, 'ev-loadgen.log'), 'loadgen_start')[0]['t0_ns'])
    summ = events(os.path.join(d, 'ev-learner.log'), 'learner_summary')
    t1 = int(summ[-1]['ts'])
    n = v = 0
    for l in open(os.path.join(d, 'lat.txt')):
        ts, lat, ok = l.split()
        ts = int(ts)
        if t0 <= ts <= t1:
            n += 1
            v += (ok != '1') or float(lat) > slo * 1e3
    losses = [float.fromhex(l.split()[1]) for l in open(os.path.join(d, 'loss.txt'))]
    per_step = {}
    if pol != 'nosync':
        for l in open(os.path.join(d, 'trace.txt')):
            if l.startswith('d '): per_step[l.split()[1]] = per_step.get(l.split()[1], 0) + 1
    pushes = sum(per_step.values())
    multi = 100.0 * sum(k for k in per_step.values() if k > 1) / pushes if pushes else 0.0
    dec = events(os.path.join(d, 'ev-learner.log'), 'sync_timing')
    hi = sum(1 for e in dec if float(e['rate']) > rate_ref) if dec else 0
    return dict(rate=100.0 * v / n if n else float('nan'), n=n, win=(t1 - t0) / 1e9,
                loss=sum(losses[-20:]) / len(losses[-20:]), pushes=pushes, multi=multi,
                hi=100.0 * hi / len(dec) if dec else float('nan'))

def signflip(d):
    """exact two-sided paired sign-flip permutation test of mean(d) = 0"""
    n = len(d)
    obs = abs(sum(d))
    hits = sum(1 for s in itertools.product((1, -1), repeat=n) if abs(sum(a * b for a, b in zip(s, d))) >= obs - 1e-12)
    return hits / 2 ** n

last = None
for regime in regimes:
    R = {p: [run(regime, s, p) for s in range(1, nseeds + 1)] for p in POL}
    print(f'== {regime}: SLO-violation rate % (requests in the training window; mean over {nseeds} seeds, per seed)')
    for p in POL:
        rs = [r['rate'] for r in R[p]]
        print(f'  {p:12s} {sum(rs)/len(rs):7.2f}   [' + ' '.join(f'{x:.2f}' for x in rs) + ']'
              f'   pushes {sum(r["pushes"] for r in R[p]) / nseeds:.0f}  requests {sum(r["n"] for r in R[p]) / nseeds:.0f}'
              f'  training {sum(r["win"] for r in R[p]) / nseeds:.1f} s'
              + (f'  decisions at rate > {rate_ref:g}/s: {sum(r["hi"] for r in R[p]) / nseeds:.1f}%'
                 f'  in a step with another: {sum(r["multi"] for r in R[p]) / nseeds:.1f}%' if p != 'nosync' else ''))
    fx = [r['loss'] for r in R['fixed']]
    print(f'  training loss (mean of the last 20 steps) vs fixed {sum(fx)/len(fx):.4f}:')
    for p in POL:
        if p == 'fixed': continue
        dl = [a['loss'] - b for a, b in zip(R[p], fx)]
        print(f'    {p:12s} {sum(dl)/len(dl):+.4f}  (p={signflip(dl):.3f})')
    def gain(ctrl, pol):
        d = [a['rate'] - b['rate'] for a, b in zip(R[ctrl], R[pol])]
        return sum(d) / len(d), signflip(d)
    rows = [('wa', 'mr_wa'), ('wa_forecast', 'mr_wf')]
    for pol, ctrl in rows:
        g, pv = gain(ctrl, pol)
        print(f'  placement gain {pol} vs matched-random ({ctrl}): {g:+.2f} pp (p={pv:.3f})')
        if regime == 'bursty' and pol == 'wa_forecast': last = (g, pv)
    for pol in ['wa', 'wa_forecast', 'oracle']:
        g, pv = gain('fixed', pol)
        print(f'  {pol} vs fixed: {g:+.2f} pp (p={pv:.3f})')
    g, pv = gain('mr_wf', 'oracle')
    print(f'  oracle vs matched-random (mr_wf): {g:+.2f} pp (p={pv:.3f})')
    g, pv = gain('fixed', 'nosync')
    print(f'  sync cost (fixed minus nosync): {g:+.2f} pp (p={pv:.3f})')
print('test: exact paired sign-flip permutation test over seeds, two-sided')
if last is None:
    print('wa_forecast_gain_vs_matched_random_pp: nan (p=nan)  # the bursty regime was not run')
else:
    print(f'wa_forecast_gain_vs_matched_random_pp: {last[0]:.2f} (p={last[1]:.3f})')
EOF
