#!/bin/bash
# Integration: refusals that cannot heal end a learner at once with exit 3,
# the reason on stderr and a `refused` event (docs/PROTOCOL.md "Errors"):
# another run id, another model shape, another fragment count, another vocab.
# Every learner here has a connect timeout far beyond its wait, so exit 3
# cannot come from a timeout.
set -u
TEST_NAME=refusals
. "$(dirname "$0")/lib_cluster.sh"
make_corpus
start_sync sync --liveness 5
EV="$W/events-sync.log"

# refused NAME WHAT-CHECK args...: the learner exits 3 with a refused event whose reason matches
refused() {
  local name=$1 kind=$2 re=$3; shift 3
  start_learner "$name" --steps 5 --connect_timeout_ms 120000 "$@"
  wait_pid 60 "$LPID"; local rc=$?
  check "$name: exit 3 (got $rc)" [ "$rc" = 3 ]
  check "$name: refused event kind=$kind reason~$re" ev_has "$W/events-$name.log" refused kind="$kind" "reason~$re"
  check "$name: the reason is on stderr" grep -q "refused learner $name" "$W/$name.log"
  check "$name: never joined" [ "$(ev_count "$EV" learner_join id="$name")" = 0 ]
}
refused run-id mismatch "run id 'other' is not this synchronizer's run 'dloco'" --run_id other
refused shape mismatch "C=64 .*does not match.*C=32" --n_embd 64
refused frags mismatch "P=8\\).*does not match.*P=4\\)" --fragments 8
refused vocab mismatch "V=300 .*does not match.*V=256" --vocab 300

stop_sync
[ $fail = 0 ] && echo "test_refusals: all checks passed" || echo "test_refusals: FAILED"
exit $fail
