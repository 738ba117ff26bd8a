#!/bin/bash
# The operator view (docs/OPERATING.md "Metrics", "Status"): a synchronizer
# and two learners serve /metrics (found from their metrics_listen events),
# the expositions pass `promtool check metrics`, their numbers agree with the
# event log, a SIGHUP reload shows in dloco_sync_config, `dloco status ADDR`
# and `dloco status STORE` carry live per-learner counters, rejected pushes
# (failed merges included) are counted alike on both sides, and the
# counters survive a synchronizer restart. Hostile HTTP gets refusals.
set -u
TEST_NAME=metrics
. "$(dirname "$0")/lib_cluster.sh"
make_corpus
# metric FILE 'name{labels}': the sample's value (the whole series name must match)
metric() { awk -v k="$2" '$1 == k { print $2; f = 1 } END { if (!f) print "absent" }' "$1"; }
gt0() { awk -v v="$1" 'BEGIN { exit !(v != "absent" && v + 0 > 0) }'; } # VALUE: a sample above 0
# http_code URL [curl args]: the status code of one request (000 = none)
http_code() { local u=$1; shift; curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$@" "$u"; }
scrape() { curl -s --max-time 10 "http://$1/metrics" > "$2"; }
promcheck() { # FILE: promtool must find nothing to say
  local out; out=$(promtool check metrics < "$1" 2>&1); local rc=$?
  [ -n "$out" ] && echo "$out" | head -5
  [ $rc = 0 ] && [ -z "$out" ]
}
missing() { # a tool this test needs: SKIP (exit 77), but a failure under CI=true
  echo "SKIP: $1 (deploy/setup.sh installs it)"
  [ "${CI:-}" = true ] && { echo "FAIL: CI=true and $1"; exit 1; }
  exit 77
}
command -v curl > /dev/null || missing "curl not installed"
command -v promtool > /dev/null || missing "promtool not installed (Debian's prometheus)"

EV="$W/events-sync.log"
# the outer step of $OUTER, from the file (a flag would override the file on reload too)
printf 'outer_lr = 1\nouter_momentum = 0\nquorum = 1\n' > "$W/sync.ini"
EVAL="--eval_every_s 1 --eval_data $W/corpus.txt --eval_seqs 64 --eval_batch 8"
start_sync sync --config "$W/sync.ini" $EVAL
MA=$(ev_last "$EV" metrics_listen addr)
check "synchronizer wrote metrics_listen with HOST:PORT" [ -n "$MA" ]
start_learner a --steps 100000000 --throttle 0.3; LA=$LPID
start_learner b --steps 100000000 --throttle 0.3; LB=$LPID
wait_until 30 '[ -n "$(ev_last "$W/events-a.log" metrics_listen addr)" ] && [ -n "$(ev_last "$W/events-b.log" metrics_listen addr)" ]' \
  || die "learners wrote no metrics_listen"
MLA=$(ev_last "$W/events-a.log" metrics_listen addr); MLB=$(ev_last "$W/events-b.log" metrics_listen addr)
wait_until 60 '[ "$(ev_count "$EV" merge)" -ge 8 ]' || die "no merges"
# the documents are re-rendered every second: wait for a render that has seen merges and pushes
wait_until 20 'scrape "$MA" "$W/sync.prom" && scrape "$MLA" "$W/a.prom" &&
  gt0 "$(metric "$W/sync.prom" dloco_sync_merges_total)" &&
  gt0 "$(metric "$W/sync.prom" "dloco_sync_learner_pushes_total{learner=\"a\"}")" &&
  gt0 "$(metric "$W/a.prom" "dloco_learner_pushes_total{learner=\"a\",outcome=\"sent\"}")"' \
  || echo "note: no render with merges and pushes within 20 s (the checks below say which)"
check "synchronizer /metrics passes promtool check metrics" promcheck "$W/sync.prom"
check "learner /metrics passes promtool check metrics" promcheck "$W/a.prom"
check "live learners by state" [ "$(metric "$W/sync.prom" 'dloco_sync_learners{state="live"}')" = 2 ]
check "per-learner pushes counted live" \
  awk -v a="$(metric "$W/sync.prom" 'dloco_sync_learner_pushes_total{learner="a"}')" 'BEGIN { exit !(a > 0) }'
check "merges_total no more than the merge events so far" \
  [ "$(metric "$W/sync.prom" dloco_sync_merges_total)" -le "$(ev_count "$EV" merge)" ]
check "learner reports its steps and pushes" awk -v s="$(metric "$W/a.prom" 'dloco_learner_steps_total{learner="a"}')" \
  -v p="$(metric "$W/a.prom" 'dloco_learner_pushes_total{learner="a",outcome="sent"}')" 'BEGIN { exit !(s > 0 && p > 0) }'
check "learner's adopt lag in steps is present" [ "$(metric "$W/a.prom" 'dloco_learner_steps_behind_max{learner="a"}')" != absent ]
check "config gauge shows outer_lr 1" [ "$(metric "$W/sync.prom" 'dloco_sync_config{option="outer_lr"}')" = 1 ]

# hostile HTTP: refused, and the server goes on serving
check "POST refused 405" [ "$(http_code "http://$MA/metrics" -X POST -d x=1)" = 405 ]
check "PUT refused 405" [ "$(http_code "http://$MA/metrics" -X PUT -d x=1)" = 405 ]
check "unknown path 404" [ "$(http_code "http://$MA/admin")" = 404 ]
huge=$(head -c 70000 /dev/zero | tr '\0' a)
code=$(http_code "http://$MA/$huge")
check "huge URL refused 414/431 (got $code)" [ "$code" = 414 -o "$code" = 431 ]
check "GET with a body refused 413" [ "$(http_code "http://$MA/metrics" -X GET -d x=1)" = 413 ]
check "still serving /metrics and /status.json" [ "$(http_code "http://$MA/metrics")$(http_code "http://$MA/status.json")" = 200200 ]
check "learner refuses POST too" [ "$(http_code "http://$MLB/metrics" -X POST -d x=1)" = 405 ]

# a reload is visible in the config gauge
n=$(ev_count "$EV" reload)
printf 'outer_lr = 0.5\nouter_momentum = 0\nquorum = 1\n' > "$W/sync.ini"
kill -HUP "$SPID"
wait_until 10 "[ \$(ev_count '$EV' reload) -gt $n ]" || die "no reload event"
check "reload applied" [ "$(ev_last "$EV" reload refused)" = 0 ]
wait_until 5 'scrape "$MA" "$W/r.prom"; [ "$(metric "$W/r.prom" "dloco_sync_config{option=\"outer_lr\"}")" = 0.5 ]'
check "config gauge shows outer_lr 0.5 after SIGHUP" [ "$(metric "$W/r.prom" 'dloco_sync_config{option="outer_lr"}')" = 0.5 ]

# dloco status, live and from the store while the run goes on
pyj() { /usr/bin/python3 -c "import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if ($1) else 1)" "$2"; } # EXPR FILE
"$DLOCO" status "$MA" --json > "$W/live.json"
check "dloco status ADDR --json parses, two live learners with counters" \
  pyj 'd["source"] == "live" and d["learners_live"] == 2 and all(l["pushes"] > 0 and l["tokens_applied"] > 0 and l["alive"] for l in d["learners"])' "$W/live.json"
check "... each with its latest push's training loss" \
  pyj 'all(l["train_loss"] is not None and 0 < l["train_loss"] < 20 for l in d["learners"])' "$W/live.json"
"$DLOCO" status "http://$MA" > "$W/live.txt"
check "dloco status http://ADDR prints both learners" grep -q '^b ' "$W/live.txt"
check "... with a TRAIN_LOSS column and its value" \
  bash -c "grep -q 'TRAIN_LOSS' '$W/live.txt' && grep -Eq '^b +- +yes +[0-9.]+ +[0-9]+\.[0-9]{4} ' '$W/live.txt'"
check "... and the scope of its counts (this epoch)" grep -q "this epoch (since the synchronizer started): merges" "$W/live.txt"
check "dloco_sync_learner_train_loss in /metrics" [ "$(metric "$W/sync.prom" 'dloco_sync_learner_train_loss{learner="b"}')" != absent ]
# --watch on a non-terminal: one block per refresh, until SIGINT
timeout -s INT 3 "$DLOCO" status "$MA" --watch 0.5 > "$W/watch.txt"
check "--watch printed several blocks ($(grep -c '^run ' "$W/watch.txt"))" [ "$(grep -c '^run ' "$W/watch.txt")" -ge 3 ]
if command -v script > /dev/null; then # on a terminal: clear + home before each refresh
  timeout -s INT 3 script -qec "$DLOCO status $MA --watch 0.5" /dev/null > "$W/watch_tty.txt" 2>&1
  check "--watch on a terminal redraws in place ($(grep -c $'\e\[H\e\[2J' "$W/watch_tty.txt") clears)" \
    [ "$(grep -c $'\e\[H\e\[2J' "$W/watch_tty.txt")" -ge 2 ]
fi
wait_until 20 '"$DLOCO" status "$W/store" --json > "$W/store.json" && pyj "len(d[\"learners\"]) == 2 and all(l[\"pushes\"] > 0 and l[\"step\"] > 0 for l in d[\"learners\"])" "$W/store.json"'
check "dloco status STORE --json parses, counters non-zero while the run is live" \
  pyj 'd["source"] == "store" and len(d["learners"]) == 2 and all(l["pushes"] > 0 and l["step"] > 0 for l in d["learners"])' "$W/store.json"
"$DLOCO" status "$W/store" > "$W/store.txt"
check "dloco status STORE names the ledger's unit" grep -q '^token ledger (fragment-tokens): ' "$W/store.txt"
check "dloco status STORE: last merge of each fragment" [ "$(grep -c '^fragment [0-9]*: version' "$W/store.txt")" = 4 ]

# rejected pushes on both sides: merges fail (param_abs_max far below the
# parameters), every push of such a round is answered REJECTED
printf 'outer_lr = 0.5\nouter_momentum = 0\nquorum = 1\nparam_abs_max = 1e-9\n' > "$W/sync.ini"; kill -HUP "$SPID"
wait_until 30 '[ "$(ev_count "$EV" merge_failed)" -ge 3 ]' || die "no merge failed"
printf 'outer_lr = 0.5\nouter_momentum = 0\nquorum = 1\n' > "$W/sync.ini"; kill -HUP "$SPID"
m=$(ev_count "$EV" merge); wait_until 30 "[ \$(ev_count '$EV' merge) -gt $((m + 2)) ]" || die "merges did not resume"
wait_until 20 'scrape "$MA" "$W/f.prom" &&
  awk -v r="$(metric "$W/f.prom" "dloco_sync_pushes_rejected_total{reason=\"merge_failed\"}")" "BEGIN { exit !(r >= 3) }"'
check "failed merges counted as rejected pushes (reason merge_failed)" \
  awk -v r="$(metric "$W/f.prom" 'dloco_sync_pushes_rejected_total{reason="merge_failed"}')" 'BEGIN { exit !(r >= 3) }'

kill -TERM "$LA" "$LB"; wait_pid 60 "$LA"; wait_pid 60 "$LB"
# quiesced: both Byes handled (their pushes came before them), and a render that counts every merge event
wait_until 20 "[ \$(ev_count '$EV' learner_bye) -ge 2 ]" || die "the learners' Byes did not arrive"
wait_until 20 'scrape "$MA" "$W/q.prom" &&
  [ "$(metric "$W/q.prom" dloco_sync_merges_total)" = "$(ev_count "$EV" merge)" ] &&
  [ "$(metric "$W/q.prom" dloco_sync_merged_contributions_total)" = "$(ev_count "$EV" merge_contrib)" ]'
check "merges_total equals the merge events once quiesced" \
  [ "$(metric "$W/q.prom" dloco_sync_merges_total)" = "$(ev_count "$EV" merge)" ]
check "merged contributions equal the merge_contrib events" \
  [ "$(metric "$W/q.prom" dloco_sync_merged_contributions_total)" = "$(ev_count "$EV" merge_contrib)" ]
failed_contribs=$(metric "$W/q.prom" 'dloco_sync_pushes_rejected_total{reason="merge_failed"}')
# periodic evaluation: once quiesced it reports the final model, with the loss `dloco eval` computes
vsum=$(awk '$1 ~ /^dloco_sync_fragment_version[{]/ { s += $2 } END { print s }' "$W/q.prom")
wait_until 20 "ev_has '$EV' eval version=$vsum" || die "no evaluation of the final version $vsum"
check "eval events carry loss and seqs=64" [ "$(ev_last "$EV" eval seqs version=$vsum)" = 64 ]
el=$(ev_last "$EV" eval loss version=$vsum)
dl=$(val_loss)
check "the synchronizer's eval loss $el is dloco eval's $dl" awk -v a="$el" -v b="$dl" 'BEGIN { d = a - b; exit !(d < 1e-3 && d > -1e-3) }'
wait_until 20 'scrape "$MA" "$W/e.prom" && [ "$(metric "$W/e.prom" dloco_sync_eval_loss)" != absent ]'
check "eval loss in /metrics" [ "$(metric "$W/e.prom" dloco_sync_eval_loss)" != absent ]
"$DLOCO" status "$MA" --json > "$W/e.json"
check "eval in /status.json" pyj 'd["eval"] is not None and d["eval"]["seqs"] == 64 and d["eval"]["loss"] > 0' "$W/e.json"
stop_sync
# one unit for the ledger: status and check print the same numbers, both named fragment-tokens
st_led=$("$DLOCO" status "$W/store" | sed -n 's/^token ledger (fragment-tokens): //p')
ck_led=$("$DLOCO" check "$W/store" | sed -n 's/^ *ledger fragment-tokens: //p')
check "ledger: status ($st_led) and check ($ck_led) agree" [ -n "$st_led" -a "$st_led" = "$ck_led" ]
"$DLOCO" status "$W/store" --json > "$W/e2.json"
check "the last evaluation is in the store: offline status shows it" pyj 'd["eval"] is not None and d["eval"]["seqs"] == 64' "$W/e2.json"
for id in a b; do
  lr=$(ev_last "$W/events-$id.log" learner_summary rejected)
  sr=$(ev_last "$EV" sync_learner rejected id=$id)
  check "learner $id: rejected pushes $lr (learner) = $sr (synchronizer)" [ -n "$lr" -a "$lr" = "$sr" ]
done
check "the synchronizer's summary counts the failed merges' pushes ($failed_contribs)" \
  [ "$(ev_last "$EV" sync_summary rejected)" -ge "$failed_contribs" ]

# restart: the store keeps every counter; the new process starts from them
"$DLOCO" status "$W/store" --json > "$W/before.json"
pa=$(python3 -c "import json, sys; print([l['pushes'] for l in json.load(open(sys.argv[1]))['learners'] if l['id'] == 'a'][0])" "$W/before.json")
start_sync sync2 --status_every_ms 300
MA2=$(ev_last "$W/events-sync2.log" metrics_listen addr)
wait_until 10 "ev_has '$W/events-sync2.log' sync_status" || die "no sync_status"
check "restarted synchronizer's status: 0 live, 2 known from the store" \
  [ "$(ev_last "$W/events-sync2.log" sync_status live)/$(ev_last "$W/events-sync2.log" sync_status known)" = 0/2 ]
"$DLOCO" status "$MA2" --json > "$W/r0.json"
check "restarted synchronizer knows the 2 learners of the store before any Hello" pyj 'd["learners_known"] == 2' "$W/r0.json"
start_learner a --steps 40; LA=$LPID
wait_until 30 "[ \$(ev_count '$W/events-sync2.log' learner_join id=a) -ge 1 ]" || die "a did not join again"
# /status.json is re-rendered every second: wait for the one that has a live again
wait_until 20 '"$DLOCO" status "$MA2" --json > "$W/r1.json" && pyj "[l for l in d[\"learners\"] if l[\"id\"] == \"a\"][0][\"alive\"]" "$W/r1.json"'
check "learner a's pushes continue from the store's $pa after the restart" \
  pyj "[l for l in d['learners'] if l['id'] == 'a'][0]['pushes'] >= $pa > 0" "$W/r1.json"
# an explicit busy address is an error naming the option, for both programs
"$SYNC" --store "$W/store_b" --bind tcp://127.0.0.1:0 $MODEL --vocab 256 --fragments 4 --H 8 --heartbeat_ms 200 \
  --metrics "$MA2" > "$W/busy.log" 2>&1 &
BP=$!; PIDS+=("$BP")
wait_pid 30 "$BP"; brc=$?
check "explicit busy --metrics address: start-up error naming the option (exit $brc)" \
  grep -q "option metrics" "$W/busy.log"
check "... and it exits non-zero" [ "$brc" != 0 ]
start_learner mbusy --steps 5 --metrics "$MA2"; BL=$LPID
wait_pid 30 "$BL"; blrc=$?
check "learner with a busy explicit --metrics: start-up error naming the option" grep -q "option metrics" "$W/mbusy.log"
check "... exits non-zero ($blrc), never joined" [ "$blrc" != 0 -a "$(ev_count "$W/events-sync2.log" learner_join id=mbusy)" = 0 ]
# the default address while another synchronizer holds it (or 9470 is taken): an ephemeral port, not a
# failure; and an evaluation far longer than the test (a million sequences) does not hold up SIGTERM
: > "$W/events-sync3.log"
"$SYNC" --store "$W/store_c" --bind tcp://127.0.0.1:0 $MODEL --vocab 256 --fragments 4 --H 8 --heartbeat_ms 200 \
  --eval_every_s 1 --eval_data "$W/corpus.txt" --eval_seqs 1000000 --events "$W/events-sync3.log" > "$W/sync3.log" 2>&1 &
S3=$!; PIDS+=("$S3")
wait_until 20 "ev_has '$W/events-sync3.log' sync_start" || die "a third synchronizer with the default --metrics did not start"
MA3=$(ev_last "$W/events-sync3.log" metrics_listen addr)
check "default --metrics busy: served on another loopback port ($MA3, not $MA2)" [ -n "$MA3" -a "$MA3" != "$MA2" ]
check "... which serves" [ "$(http_code "http://$MA3/metrics")" = 200 ]
wait_until 30 "ev_has '$W/events-sync3.log' eval_start" || die "the third synchronizer's first evaluation did not start"
kill -TERM "$S3"; wait_pid 20 "$S3"
check "SIGTERM during a long evaluation: a clean stop, no eval result" \
  [ "$(ev_count "$W/events-sync3.log" sync_summary)" = 1 -a "$(ev_count "$W/events-sync3.log" eval)" = 0 ]
wait_pid 120 "$LA"
stop_sync
[ $fail = 0 ] && echo "test_metrics: all checks passed" || echo "test_metrics: FAILED"
exit $fail
