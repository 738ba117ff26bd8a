#!/bin/bash
# Learners as Slurm job steps: a private single-node Slurm on this machine
# (deploy/slurm/private-slurm.sh: munged, slurmctld, slurmd as processes of
# this test, own dirs and ports, no cgroups), a local dloco-sync with CURVE
# keys from dloco keygen, and
# deploy/slurm/dloco-learners.sbatch submitted with sbatch: 2 learners as srun
# job steps. Both learners' pushes merge. `scancel JOB.STEP` kills sl-1's step
# (SIGKILL, like a lost node): the synchronizer declares it dead, merges go on
# from sl-0, and the batch script starts sl-1 again as a new step with the
# same id, which resumes at the step of its last recovery file (every 50
# steps here) and trains to the end; its pushes merge again. Then
# `scancel --signal=TERM` stops sl-0's step the way a preemption does: it says
# Bye, writes its recovery file, exits 0 with its own step count, and is
# started again: it resumes at exactly that step. The job ends by itself with
# every learner at its last step. Asserts on the
# synchronizer's events and the batch script's events (proc=sbatch).
# Everything it started is stopped by PID at the end, and it checks that no
# process of the job and no daemon is left.
# SKIP (exit 77) without root or the slurm-wlm / munge packages, or when
# the daemons cannot start here; deploy/slurm/run-by-hand.sh runs the same
# scenario on a real cluster or by hand.
set -u
TEST_NAME=slurm
. "$(dirname "$0")/lib_cluster.sh"
SRC=${DLOCO_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
SD="$W/slurm"
JOB=""
teardown() {
  if [ -n "$JOB" ]; then
    scancel "$JOB" 2>/dev/null
    for _ in $(seq 1 100); do [ -z "$(squeue -h -j "$JOB" 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  bash "$SRC/deploy/slurm/private-slurm.sh" stop "$SD" 2>/dev/null
  cleanup
}
trap teardown EXIT

# DLOCO_SLURM_EXTERNAL=1 (deploy/slurm/run-by-hand.sh): the Slurm cluster
# this host submits to instead of a private one; the job's files go to
# DLOCO_SLURM_SHARED (a folder the compute nodes see) and the learners connect
# to this host as DLOCO_SLURM_HOST
EXT=${DLOCO_SLURM_EXTERNAL:-0}
if [ "$EXT" != 1 ]; then
  [ "$(id -u)" = 0 ] || { echo "SKIP: the private Slurm needs root (uid $(id -u)); deploy/slurm/run-by-hand.sh runs this on a real cluster"; exit 77; }
  for b in sbatch srun scancel squeue /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged; do
    command -v "$b" > /dev/null || { echo "SKIP: $(basename "$b") not installed (deploy/setup.sh --with-slurm installs slurm-wlm and munge)"; exit 77; }
  done
fi
for b in "$SYNC" "$LEARNER" "$DLOCO"; do [ -x "$b" ] || die "$b is not built"; done
LEARNER_ABS=$(readlink -f "$LEARNER") # the job runs in its own folder

if [ "$EXT" = 1 ]; then
  for b in sbatch squeue scancel; do command -v "$b" > /dev/null || die "$b not found: run-by-hand needs a Slurm client"; done
  mkdir -p "${DLOCO_SLURM_SHARED:?DLOCO_SLURM_SHARED: a folder the compute nodes see}" || die "cannot create $DLOCO_SLURM_SHARED"
  JW=$(mktemp -d "$DLOCO_SLURM_SHARED/dloco_slurm.XXXXXX") || die "mktemp in $DLOCO_SLURM_SHARED"
  HOST=${DLOCO_SLURM_HOST:-$(hostname -f)}
  BIND=tcp://0.0.0.0:0
  echo "by hand: the Slurm cluster of $(command -v sbatch), job files in $JW, synchronizer on $HOST"
else
  JW=$W HOST=127.0.0.1
  # two free ports in a row for slurmctld and slurmd (bounded search)
  PORT=""
  for p in $(seq 26817 2 26857); do
    [ -z "$(ss -Htln "( sport = :$p or sport = :$((p + 1)) )" 2>/dev/null)" ] && { PORT=$p; break; }
  done
  [ -n "$PORT" ] || die "no two free ports in 26817..26858 for the private Slurm"
  out=$(bash "$SRC/deploy/slurm/private-slurm.sh" start "$SD" --cpus 4 --port "$PORT" 2>&1); rc=$?
  echo "$out"
  [ "$rc" = 77 ] && exit 77
  [ "$rc" = 0 ] || die "private-slurm.sh start failed ($rc)"
  export SLURM_CONF="$SD/slurm.conf"
  echo "ok: a private single-node Slurm is up ($(sinfo -h -o '%P %D %t %c' | head -n 1) cpus), slurmctld port $PORT"
fi

make_corpus
cp "$W/corpus.txt" "$JW/corpus.txt" 2> /dev/null || [ "$JW" = "$W" ]
# CURVE, as across sites (docs/DEPLOY.md): a key pair per learner id and the
# synchronizer's, the ids in its allowlist; the batch script passes
# --key-dir / --server-key on to every learner
K="$JW/keys"; mkdir -p "$K"; chmod 700 "$K"
for n in sync sl-0 sl-1; do quietly "$DLOCO" keygen "$K/$n" || die "dloco keygen $n"; done
for n in sl-0 sl-1; do echo "$n $(sed -n 's/^public = //p' "$K/$n.pub")"; done > "$W/allow.txt"
start_sync sync $OUTER --auth curve --key_file "$K/sync.key" --allowlist "$W/allow.txt"
EV="$W/events-sync.log"
check "the synchronizer serves CURVE" ev_has "$EV" sync_start auth=curve
CONNECT="tcp://$HOST:${EP##*:}"
# the learners' settings: lib_cluster's test model, from an INI file as a site's would be
cat > "$JW/learner.ini" << INI
data = $JW/corpus.txt
n_layer = 2
n_head = 2
n_embd = 32
seq_len = 32
fragments = 4
batch = 8
warmup = 5
lr = 3e-3
log_every = 50
device = cpu
INI
STEPS=360
JD="$JW/job"
# DLOCO_SLURM_MARK travels with the job's environment (sbatch --export=ALL): it
# tells this test's job processes from anything else at the end
JOB=$(cd "$JW" && DLOCO_SLURM_MARK="$W" sbatch --parsable --output="$JW/job.out" --ntasks=2 --cpus-per-task=1 \
  ${DLOCO_SLURM_SBATCH_ARGS:-} "$SRC/deploy/slurm/dloco-learners.sbatch" --connect "$CONNECT" --config "$JW/learner.ini" \
  --steps "$STEPS" --id-prefix sl- --logdir "$JD" --learner "$LEARNER_ABS" --key-dir "$K" --server-key "$K/sync.pub" \
  --max-restarts 2 --restart-delay 3 -- --throttle 0.05 --recovery_every_steps 50 --recovery_every_s 0) \
  || die "sbatch refused the batch script"
JOB=${JOB%%;*}
echo "submitted job $JOB"
SEV="$JD/events.log"
# each learner's supervisor is its own subshell of the batch script: either may write its step_start first
# (waiting for sl-1's and then only looking for sl-0's failed a CI run, sl-0 a moment behind)
both_started() { ev_wait 60 "$SEV" step_start id=sl-1 attempt=1 && ev_wait 60 "$SEV" step_start id=sl-0 attempt=1; }
check "the batch script started both learners as job steps" both_started
check "pushes of sl-0 merge" ev_wait 60 "$EV" merge_contrib id=sl-0
check "pushes of sl-1 merge" ev_wait 60 "$EV" merge_contrib id=sl-1

# step_of ID: the job step that runs learner ID now (srun --job-name is the learner id)
step_of() {
  local st=""
  for _ in $(seq 1 50); do
    st=$(squeue -h -s -j "$JOB" -o '%i %j' | awk -v id="$1" '$2 == id { print $1 }' | head -n 1)
    [ -n "$st" ] && break; sleep 0.2
  done
  echo "$st"
}
# tss FILE EVENT CONDS...: the ts (unix ns: the order of the lines) of each such event
tss() { local f=$1 e=$2; shift 2; ev_field "$f" "$e" ts "$@"; }
# count_between FILE EVENT A B CONDS...: such events with A < ts < B
count_between() { local f=$1 e=$2 a=$3 b=$4; shift 4; tss "$f" "$e" "$@" | awk -v a="$a" -v b="$b" '$1 > a && $1 < b { n++ } END { print n + 0 }'; }

# 1. a hard stop: `scancel JOB.STEP` kills the step (SIGKILL, as a lost node
#    would): no Bye, the synchronizer declares sl-1 dead after its liveness
check "sl-1 trained 100 steps" ev_wait 60 "$JD/events-sl-1.a1.log" step id=sl-1 step=100
STEP=$(step_of sl-1)
[ -n "$STEP" ] || die "no job step named sl-1 in squeue -s"
merged0=$(ev_count "$EV" merge_contrib id=sl-0)
scancel "$STEP" || die "scancel $STEP"
echo "scancel $STEP (sl-1), with $merged0 merged pushes of sl-0 so far"
check "the synchronizer declared the killed sl-1 dead" ev_wait 30 "$EV" learner_dead id=sl-1
check "the batch script saw the step end early and restarts it" ev_wait 30 "$SEV" step_end id=sl-1 attempt=1 action=restart
c1=$(ev_last "$SEV" step_end steps id=sl-1 attempt=1)
between() { [ "$1" -gt "$2" ] && [ "$1" -lt "$3" ]; } # N LOW HIGH: LOW < N < HIGH
check "the killed step is credited the steps of its last step event ($c1 of $STEPS)" between "${c1:-0}" 99 "$STEPS"
check "a new step for sl-1 started with the remaining steps" ev_wait 30 "$SEV" step_start id=sl-1 attempt=2 steps=$((STEPS - ${c1:-0}))
check "sl-1 said Hello again and took its id over" ev_wait 60 "$EV" learner_duplicate id=sl-1 action=took_over_gone
t_dead=$(tss "$EV" learner_dead id=sl-1 | head -n 1)
t_back=$(tss "$EV" learner_join id=sl-1 | tail -n 1)
away=$(count_between "$EV" merge_contrib "$t_dead" "$t_back" id=sl-0)
check "merges went on from sl-0 while sl-1 was away ($away between its death and its new Hello)" [ "$away" -gt 0 ]
check "pushes of the restarted sl-1 merge" wait_until 60 '[ "$(count_between "$EV" merge_contrib "$t_back" 9e18 id=sl-1)" -gt 0 ]'

# 2. a graceful stop, as a preemption's SIGTERM: sl-0 pushes what it has, says
#    Bye, exits 0 with its steps so far; the script starts the rest
check "sl-0 trained 200 steps" ev_wait 60 "$JD/events-sl-0.a1.log" step id=sl-0 step=200
STEP0=$(step_of sl-0)
[ -n "$STEP0" ] || die "no job step named sl-0 in squeue -s"
scancel --signal=TERM "$STEP0" || die "scancel --signal=TERM $STEP0"
echo "scancel --signal=TERM $STEP0 (sl-0)"
check "sl-0 said Bye (signal)" ev_wait 30 "$EV" learner_bye id=sl-0 reason=signal
check "the batch script restarts sl-0" ev_wait 30 "$SEV" step_end id=sl-0 attempt=1 rc=0 action=restart
c0=$(ev_last "$SEV" step_end steps id=sl-0 attempt=1)
s0=$(ev_last "$JD/events-sl-0.a1.log" learner_summary steps)
check "its credit is the steps of the learner's own summary ($c0 = $s0)" [ "${c0:-x}" = "${s0:-y}" ]
check "... 200 or more, fewer than $STEPS" between "${c0:-0}" 199 "$STEPS"
check "sl-0's second step started with the remaining $((STEPS - ${c0:-0})) steps" ev_wait 30 "$SEV" step_start id=sl-0 attempt=2 steps=$((STEPS - ${c0:-0}))
t_bye=$(tss "$EV" learner_bye id=sl-0 | head -n 1)
check "pushes of the restarted sl-0 merge" wait_until 60 '[ "$(count_between "$EV" merge_contrib "$t_bye" 9e18 id=sl-0)" -gt 0 ]'

# the job ends by itself: every learner's steps done, sl-1's over two steps
check "the job finished" wait_until 120 '[ -z "$(squeue -h -j "$JOB" 2> /dev/null)" ]'
check "the batch script ended with no learner given up" ev_has "$SEV" job_end failed=0
for id in sl-0 sl-1; do
  check "$id ended done in its second job step" ev_has "$SEV" step_end id=$id attempt=2 action=done
  check "$id's second step ended at its last step ($STEPS)" \
    [ "$(ev_last "$JD/events-$id.a2.log" learner_summary steps)" = "$STEPS" ]
  # credits: the first step's steps, then the second's from the step it resumed at
  r=$(ev_last "$JD/events-$id.a2.log" recovery_resumed step)
  t=$(ev_field "$SEV" step_end steps id=$id | awk '{ s += $1 } END { print s + 0 }')
  c=$(ev_last "$SEV" step_end steps id=$id attempt=1)
  check "$id's credits add up: $c trained, resumed at ${r:-none}, then $STEPS - ${r:-0} (got $t)" \
    test -n "$r" -a "$t" = $((c + STEPS - ${r:-0}))
  check "the restarted $id exited 0" [ "$(ev_last "$JD/events-$id.a2.log" learner_summary exit_code)" = 0 ]
done
r1=$(ev_last "$JD/events-sl-1.a2.log" recovery_resumed step)
check "the killed sl-1 resumed from a recovery file written before its kill (step ${r1:-none}, killed after ${c1:-0})" \
  test -n "$r1" -a "${r1:-0}" -ge 50 -a "${r1:-0}" -le "${c1:-0}"
check "the stopped sl-0 resumed at exactly its last step (${c0:-0})" \
  ev_has "$JD/events-sl-0.a2.log" recovery_resumed step="${c0:-x}"
JOB_DONE=$JOB
JOB=""
check "both learners were admitted by their keys" ev_has "$EV" learner_join id=sl-1 auth=1
echo "merged pushes: sl-0 $(ev_count "$EV" merge_contrib id=sl-0), sl-1 $(ev_count "$EV" merge_contrib id=sl-1); sl-1 away for $away merges of sl-0"
stop_sync

[ "$EXT" = 1 ] && { [ -n "${KEEP_W:-}" ] || rm -rf "$JW"; [ "$fail" = 0 ] && echo "PASS: slurm (by hand)"; exit "$fail"; }
# nothing of the job is left (its processes carry DLOCO_SLURM_MARK in their environment)
bash "$SRC/deploy/slurm/private-slurm.sh" stop "$SD"
left=()
for e in /proc/[0-9]*/environ; do
  p=${e#/proc/}; p=${p%/environ}
  [ "$p" = $$ ] && continue
  { tr '\0' '\n' < "$e"; } 2> /dev/null | grep -qx "DLOCO_SLURM_MARK=$W" && left+=("$p")
done
for p in "${left[@]}"; do kill -KILL "$p" 2> /dev/null; done
check "no process of job $JOB_DONE is left (found: ${left[*]:-none})" [ "${#left[@]}" = 0 ]
daemons=0
for f in "$SD"/*.pid; do [ -e "$f" ] && daemons=$((daemons + 1)); done
check "the Slurm and munge daemons are stopped" [ "$daemons" = 0 ]
[ "$fail" = 0 ] && echo "PASS: slurm" || { for f in "$JD"/*.log "$JW/job.out"; do [ -f "$f" ] && { echo "== $f"; tail -n 8 "$f"; }; done; echo "FAIL: slurm"; }
exit "$fail"
