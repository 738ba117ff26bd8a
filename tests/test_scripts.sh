#!/bin/bash
# The scripts people run by hand: `--help` prints usage and exits 0, an
# unknown option or a bad argument is refused with exit 2, and neither builds
# or runs anything (BUILD_DIR points nowhere: a script that went on would fail
# its build, or time out here, instead of exiting 0 / 2 at once).
set -u
cd "$(dirname "$0")/.."
export BUILD_DIR=/dev/null/nobuild
fail=0
expect() { # RC DESCRIPTION COMMAND...
  local want=$1 d=$2 out rc; shift 2
  out=$(timeout 20 "$@" 2>&1 < /dev/null); rc=$?
  if [ "$rc" = "$want" ] && [ -n "$out" ]; then echo "ok: $d (exit $rc): $(echo "$out" | head -1 | cut -c1-90)"
  else echo "FAIL: $d: exit $rc, wanted $want: $(echo "$out" | tail -2)"; fail=1; fi
}
for s in bench/bandwidth.sh bench/byzantine.sh bench/codec.sh bench/crashloop.sh bench/fuzz.sh bench/goodput.sh bench/gpu.sh bench/learner.sh \
         bench/quality.sh bench/sync_load.sh bench/wa.sh bench/wan.sh deploy/local_cluster.sh deploy/quickstart.sh deploy/setup.sh \
         tests/gpu.sh tests/run.sh; do
  expect 0 "$s --help" bash "$s" --help
  expect 0 "$s -h" bash "$s" -h
  [ "$s" = tests/run.sh ] && continue # its other arguments are ctest's
  expect 2 "$s --no-such-option" bash "$s" --no-such-option
done
for s in bench/bandwidth.sh bench/byzantine.sh bench/quality.sh bench/sync_load.sh; do expect 2 "$s takes no arguments" bash "$s" extra; done
expect 2 "crashloop.sh: crashes must be a number" bash bench/crashloop.sh ten
expect 2 "crashloop.sh: seed must be a number" bash bench/crashloop.sh 10 x
expect 2 "crashloop.sh: at most 2 arguments" bash bench/crashloop.sh 1 2 3
expect 2 "learner.sh: steps must be a number" bash bench/learner.sh many
expect 2 "fuzz.sh: seconds must be a number" bash bench/fuzz.sh soon
expect 2 "codec.sh: floats must be a number" bash bench/codec.sh lots
expect 2 "wan.sh: WAN_DURATION_S must be a number" env WAN_DURATION_S=soon bash bench/wan.sh
expect 2 "wan.sh: at most 1 argument" bash bench/wan.sh a b
# bench/sim.sh (dloco-sim's paper study)
expect 0 "bench/sim.sh --help" bash bench/sim.sh --help
expect 2 "bench/sim.sh --no-such-option" bash bench/sim.sh --no-such-option
expect 2 "bench/sim.sh takes no arguments" bash bench/sim.sh extra
expect 2 "local_cluster.sh --learners without a value" bash deploy/local_cluster.sh --learners
# bench/hetero.sh (plain token weighting vs dynamic H vs a bf16 learner)
expect 0 "bench/hetero.sh --help" bash bench/hetero.sh --help
expect 2 "bench/hetero.sh --no-such-option" bash bench/hetero.sh --no-such-option

# bench/gpa.sh (GPA vs AdamW steps to a target loss)
expect 0 "bench/gpa.sh --help" bash bench/gpa.sh --help
expect 2 "bench/gpa.sh --no-such-option" bash bench/gpa.sh --no-such-option
expect 2 "gpa.sh takes no arguments" bash bench/gpa.sh extra
expect 2 "gpa.sh: STEPS must be a number" env STEPS=many bash bench/gpa.sh
expect 2 "gpa.sh: BUDGET beyond STEPS" env STEPS=100 BUDGET=200 bash bench/gpa.sh
for s in tests/test_cluster.sh tests/test_refusals.sh tests/test_chaos.sh; do
  expect 0 "$s --help (starts nothing)" bash "$s" --help
done
expect 0 "local_cluster.sh --check-args" bash -c 'deploy/local_cluster.sh --check-args --learners 2 && echo fine'
[ $fail = 0 ] && echo "test_scripts: all checks passed" || echo "test_scripts: FAILED"
exit $fail
