#!/bin/bash
# Integration: one dloco-learner with --optimizer gpa (docs/GPA.md) against a
# real dloco-sync on loopback. Checks: the optimizer event carries mu_x from
# the DiLoCo mapping (gpa_mu^(1/gpa_h)), the learner's pushes are accepted
# and it adopts merged updates, every fragment merges, and the global
# model's validation loss falls. Also the learner's option refusals (exit 2,
# the option named on stderr): mu_x or mu_y out of [0, 1), gpa_mu 1, gpa on
# --device cuda, gpa with adam_fleet, and resuming a checkpoint of the other
# optimizer (standalone, both ways). Bounded: every wait has a deadline;
# only our own PIDs are killed.
set -u
TEST_NAME=gpa_cluster
. "$(dirname "$0")/lib_cluster.sh"
make_corpus

# refusals of the options, before anything trains (no synchronizer needed)
refuse() { # DESCRIPTION NEEDLE args...
  local d=$1 needle=$2 out rc; shift 2
  out=$(timeout 60 "$LEARNER" --standalone --device cpu $MODEL --data "$W/corpus.txt" --steps 2 --threads 1 \
        --events /dev/null "$@" 2>&1); rc=$?
  if [ $rc = 2 ] && echo "$out" | grep -q -- "$needle"; then echo "ok: refused: $d (exit 2)"
  else echo "FAIL: $d: exit $rc: $(echo "$out" | tail -2)"; fail=1; fi
}
refuse "gpa_mu_x 1" "option gpa_mu_x" --optimizer gpa --gpa_mu_x 1
refuse "gpa_mu_x -0.5 (only -1 derives)" "option gpa_mu_x: -0.5 is not -1" --optimizer gpa --gpa_mu_x -0.5
refuse "gpa_mu_x 1.5 (out of the row's range)" "gpa_mu_x" --optimizer gpa --gpa_mu_x 1.5
refuse "gpa_mu_y 1" "option gpa_mu_y" --optimizer gpa --gpa_mu_y 1
refuse "gpa_mu 1" "option gpa_mu" --optimizer gpa --gpa_mu 1
refuse "gpa_h 0" "gpa_h" --optimizer gpa --gpa_h 0
refuse "gpa on cuda" "gpa runs on the cpu only" --optimizer gpa --device cuda
refuse "gpa with adam_fleet" "adam_fleet" --optimizer gpa --adam_fleet 2 --batch 4
refuse "an unknown optimizer" "optimizer" --optimizer sgd
# checkpoints do not mix optimizers
quietly "$LEARNER" --standalone --device cpu $MODEL --data "$W/corpus.txt" --steps 2 --threads 1 --events /dev/null \
  --checkpoint "$W/adamw.ckpt" || { echo "FAIL: adamw checkpoint run"; fail=1; }
quietly "$LEARNER" --standalone --device cpu $MODEL --data "$W/corpus.txt" --steps 2 --threads 1 --events /dev/null \
  --optimizer gpa --checkpoint "$W/gpa.ckpt" || { echo "FAIL: gpa checkpoint run"; fail=1; }
refuse "gpa resuming an adamw checkpoint" "checkpoint of an adamw run" --optimizer gpa --steps 4 --resume "$W/adamw.ckpt"
refuse "adamw resuming a gpa checkpoint" "checkpoint of a gpa run" --steps 4 --resume "$W/gpa.ckpt"

start_sync sync $OUTER
v0=$(val_loss); echo "global model before training: val loss $v0"
EVL="$W/events-gpa-0.log"
start_learner gpa-0 --steps 96 --seed 100 --log_every 32 --optimizer gpa --gpa_h 8
wait_pid 240 "$LPID"; rc=$?
[ $rc = 0 ] || { echo "FAIL: the gpa learner exited $rc"; tail -5 "$W/gpa-0.log"; fail=1; }
mu_x=$(ev_last "$EVL" optimizer mu_x name=gpa)
check "optimizer event: gpa, mu_x from the mapping 0.9^(1/8) (got $mu_x)" \
  python3 -c "import sys; sys.exit(0 if abs(float('${mu_x:-nan}') - 0.9 ** (1 / 8)) < 1e-6 else 1)"
check "optimizer event: mu_y 0.7, mu_x_from=mapping" ev_has "$EVL" optimizer name=gpa mu_y~^0\\.69999 mu_x_from=mapping
read -r adopted accepted code <<< "$(ev_last "$EVL" learner_summary "updates_adopted accepted exit_code")"
echo "gpa learner: updates_adopted=$adopted accepted=$accepted exit_code=$code"
check "the gpa learner's pushes were accepted and it adopted merges" \
  [ "${adopted:-0}" -gt 0 -a "${accepted:-0}" -gt 0 -a "${code:-1}" = 0 ]
vers=$(versions); echo "versions after training: $vers"
for v in $vers; do [ "$v" -gt 0 ] || { echo "FAIL: a fragment never merged ($vers)"; fail=1; }; done
m=$(merges); echo "merge records: $m"
check "merges happened ($m)" [ "${m:-0}" -ge 4 ]
v1=$(val_loss); echo "global model after training: val loss $v1"
check "global val loss fell by more than 0.5 ($v0 -> $v1)" python3 -c "import sys; sys.exit(0 if $v1 < $v0 - 0.5 else 1)"
stop_sync
[ $fail = 0 ] && echo "test_gpa_cluster: all checks passed" || echo "test_gpa_cluster: FAILED"
exit $fail
