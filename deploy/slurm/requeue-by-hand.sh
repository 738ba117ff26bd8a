#!/bin/bash
# The job-level path of deploy/slurm/dloco-learners.sbatch, by hand (about 3
# minutes, most of it Slurm's hold on a requeued job): on a private
# single-node Slurm (deploy/slurm/private-slurm.sh; root, slurm-wlm, munge)
# and a local dloco-sync, 2 learners run as job steps; USR1 to the batch shell
# (what `#SBATCH --signal=B:USR1@120` sends before the time limit) stops both
# steps with SIGTERM (each learner says Bye and reports its steps), the script
# requeues the job, and the requeued job (same job id) runs each learner id
# only for the steps it had left. Asserts on the events; stops everything it
# started by PID. Too long for the ctest (tests/test_slurm.sh covers the
# step-level restarts); exit 0 pass, 1 fail, 77 when Slurm cannot start here.
#   deploy/slurm/requeue-by-hand.sh [--keep]
set -u
case "${1:-}" in
  --keep) export KEEP_W=1 ;;
  -h | --help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
  "") ;;
  *) echo "requeue-by-hand.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."
SRC=$PWD
export DLOCO_BIN=${DLOCO_BIN:-$(readlink -f "${BUILD_DIR:-build}")}
TEST_NAME=requeue
. tests/lib_cluster.sh
SD="$W/slurm" JOB=""
teardown() {
  [ -n "$JOB" ] && { scancel "$JOB" 2> /dev/null; for _ in $(seq 1 100); do [ -z "$(squeue -h -j "$JOB" 2> /dev/null)" ] && break; sleep 0.2; done; }
  bash "$SRC/deploy/slurm/private-slurm.sh" stop "$SD" 2> /dev/null
  cleanup
}
trap teardown EXIT
for b in "$SYNC" "$LEARNER"; do [ -x "$b" ] || die "$b is not built"; done
bash "$SRC/deploy/slurm/private-slurm.sh" start "$SD" --cpus 4 --port 26921; rc=$?
[ "$rc" = 0 ] || exit "$rc"
export SLURM_CONF="$SD/slurm.conf"
make_corpus
start_sync sync $OUTER
EV="$W/events-sync.log"
printf 'data = %s\nn_layer = 2\nn_head = 2\nn_embd = 32\nseq_len = 32\nfragments = 4\nbatch = 8\nlog_every = 50\ndevice = cpu\n' \
  "$W/corpus.txt" > "$W/learner.ini"
STEPS=400 JD="$W/job"
JOB=$(cd "$W" && sbatch --parsable --output="$W/job.out" --ntasks=2 "$SRC/deploy/slurm/dloco-learners.sbatch" \
  --connect "$EP" --config "$W/learner.ini" --steps $STEPS --id-prefix rq- --logdir "$JD" --learner "$(readlink -f "$LEARNER")" \
  --restart-delay 1 -- --throttle 0.05) || die "sbatch"
JOB=${JOB%%;*}
SEV="$JD/events.log"
check "rq-0 trained 100 steps" ev_wait 90 "$JD/events-rq-0.a1.log" step id=rq-0 step=100
scancel --signal=USR1 --batch "$JOB" || die "scancel --signal=USR1 --batch"
echo "USR1 to the batch shell of job $JOB (the time limit's warning)"
check "the script stopped for the time limit" ev_wait 30 "$SEV" job_stop reason=time_limit
for id in rq-0 rq-1; do
  check "$id said Bye (signal)" ev_wait 60 "$EV" learner_bye id=$id reason=signal
  check "$id's step ended stopped, exit 0" ev_wait 60 "$SEV" step_end id=$id attempt=1 rc=0 action=stopped
done
check "the script requeued the job" ev_wait 60 "$SEV" job_requeued by=script
echo "waiting for the requeued job (Slurm holds a requeued job for a while: BeginTime)"
for id in rq-0 rq-1; do
  d=$(ev_last "$SEV" step_end done id=$id attempt=1)
  check "the requeued job runs $id for its remaining $((STEPS - ${d:-0})) steps (attempt 2)" \
    ev_wait 240 "$SEV" step_start id=$id attempt=2 steps=$((STEPS - ${d:-0}))
done
check "the requeued job finished" wait_until 120 '[ -z "$(squeue -h -j "$JOB" 2> /dev/null)" ]'
check "it ended with nobody given up" ev_has "$SEV" job_end failed=0
for id in rq-0 rq-1; do
  t=$(ev_field "$SEV" step_end steps id=$id | awk '{ s += $1 } END { print s + 0 }')
  check "$id: $STEPS steps over the two runs of the job (got $t)" [ "$t" = "$STEPS" ]
done
JOB=""
[ "$fail" = 0 ] && echo "PASS: requeue by hand" || { tail -n 20 "$SEV" "$W/job.out"; echo "FAIL: requeue by hand"; }
exit "$fail"
