#!/bin/bash
# Smoke test of bench/loadgen (the load generator of bench/sync_load.sh's cpu
# section): 4 learners back-to-back with fp32 pushes, then 8 on the push
# schedule with int4 pushes, a few seconds each, against a real dloco-sync on
# loopback (the tests' tiny model, 4 KiB chunks: every push and Update is
# chunked). Checks from loadgen's JSON summary and the synchronizer's events
# (never log text): every learner joined and held the model, pushes were
# merged (ACCEPTED in loadgen's window, merged contributions in the
# synchronizer's /metrics over that window, merge events), the codec travelled,
# nothing was refused as malformed, no learner was declared dead, every
# learner said Bye, the synchronizer's CPU was read over the window.
# Bounded: every wait has a deadline; only our own PIDs are killed.
set -u
TEST_NAME=loadgen
. "$(dirname "$0")/lib_cluster.sh"
LG=$B/bench/loadgen
[ -x "$LG" ] || die "$LG not built"
jf() { /usr/bin/python3 -c "import json, sys; print(eval(sys.argv[1], {'s': json.load(open(sys.argv[2]))}))" "$1" "$2"; }

# run_lg NAME [loadgen args...]: one dloco-sync, one loadgen run against it; its JSON in $W/NAME.json
run_lg() {
  local name=$1; shift
  start_sync "sync-$name" --durability periodic --eval_every_s 0 --metrics 127.0.0.1:0
  local ma="" lp rc
  for _ in $(seq 1 100); do
    ma=$(ev_last "$W/events-sync-$name.log" metrics_listen addr)
    [ -n "$ma" ] && break
    sleep 0.1
  done
  [ -n "$ma" ] || die "dloco-sync ($name) did not say its metrics address"
  "$LG" --endpoint "$EP" $MODEL --vocab 256 --fragments 4 --sync_pid "$SPID" --metrics "$ma" --join_timeout 20 \
    --warmup 0.5 --json "$W/$name.json" "$@" > "$W/lg-$name.log" 2>&1 &
  lp=$!; PIDS+=("$lp")
  wait_pid 40 "$lp"; rc=$?
  check "$name: loadgen exits 0 (rc=$rc)" [ "$rc" = 0 ]
  stop_sync
  [ -f "$W/$name.json" ] || die "$name: no JSON summary from loadgen"
  echo "$name: $(jf "'window %.1f s, pushes %d, accepted %d, merged %.1f MB/s, sync cpu %.2f s, loadgen cpu %.2f s' % (s['window_s'], s['window']['pushes'], s['window']['accepted'], s['merged_mb_per_s'], s['sync_cpu_s'], s['loadgen_cpu_s'])" "$W/$name.json")"
}

run_lg b2b_fp32 --learners 4 --mode b2b --push_codec fp32 --duration 3
S=$W/b2b_fp32.json EV=$W/events-sync-b2b_fp32.log
check "b2b: every learner joined and held the model" [ "$(jf "s['joined'] == s['ready'] == s['learners'] == 4" "$S")" = True ]
check "b2b: the window ran to its end" [ "$(jf "s['window_complete']" "$S")" = 1 ]
check "b2b: pushes were merged in the window (ACCEPTED acks)" [ "$(jf "s['window']['accepted'] > 0 and s['merged_bytes'] > 0" "$S")" = True ]
check "b2b: the synchronizer merged contributions in the window (its /metrics)" [ "$(jf "s['sync_merged_contributions'] > 0" "$S")" = True ]
check "b2b: the synchronizer's CPU was read over the window" [ "$(jf "s['sync_cpu_s'] >= 0 and s['sync_cpu_s_per_merged_gb'] >= 0" "$S")" = True ]
check "b2b: no message refused either way, no Error" [ "$(jf "s['total']['bad_msgs'] + s['total']['errors']" "$S")" = 0 ]
check "b2b: the synchronizer saw fp32 pushes merged" [ "$(ev_count "$EV" merge)" -ge 1 ]
check "b2b: no learner declared dead" [ "$(ev_count "$EV" learner_dead)" = 0 ]
check "b2b: every learner said Bye" [ "$(ev_count "$EV" learner_bye id~'^lg-' reason=done)" = 4 ]

run_lg sched_int4 --learners 8 --mode schedule --rate 20 --H 2 --push_codec int4 --push_block 16 --duration 3
S=$W/sched_int4.json EV=$W/events-sync-sched_int4.log
check "schedule: every learner joined and held the model" [ "$(jf "s['joined'] == s['ready'] == s['learners'] == 8" "$S")" = True ]
check "schedule: int4 pushes" [ "$(jf "s['push_codec']" "$S")" = int4 ]
check "schedule: pushes were merged in the window" [ "$(jf "s['window']['accepted'] > 0" "$S")" = True ]
check "schedule: no push refused as undecodable" [ "$(jf "s['total']['rejected_by_reason'].get('int4 payload refused', 0)" "$S")" = 0 ]
check "schedule: no message refused either way, no Error" [ "$(jf "s['total']['bad_msgs'] + s['total']['errors']" "$S")" = 0 ]
check "schedule: no learner declared dead" [ "$(ev_count "$EV" learner_dead)" = 0 ]
check "schedule: every learner said Bye" [ "$(ev_count "$EV" learner_bye id~'^lg-' reason=done)" = 8 ]

[ $fail = 0 ] && echo "test_loadgen: all checks passed" || echo "test_loadgen: FAILED"
exit $fail
