#!/bin/bash
# SIGHUP reload: the reloadable merge hyper-parameters change without a
# restart and the change is logged old -> new; an invalid file (bad value,
# broken timeout order) leaves the running values untouched; a change that
# needs a restart is reported and ignored. The run keeps merging throughout.
set -u
TEST_NAME=reload
. "$(dirname "$0")/lib_cluster.sh"
make_corpus
cat > "$W/sync.ini" <<'INI'
quorum = 1
outer_lr = 0.7
staleness = poly
grace_cap_ms = 5000
INI
start_sync sync --config "$W/sync.ini"
start_learner r0 --steps 100000000 --throttle 0.3; L0=$LPID
wait_until 30 '[ "$(merges)" -ge 5 ]' || die "no merges"
EV="$W/events-sync.log"
# hup_and_wait applied|refused TEXT: SIGHUP, wait for the next reload event;
# true when it was applied with TEXT in its changed= list, or refused with
# TEXT in its reason (both fixed strings)
hup_and_wait() {
  local n; n=$(ev_count "$EV" reload)
  kill -HUP "$SPID"
  wait_until 10 "[ \$(ev_count '$EV' reload) -gt $n ]" || return 1
  # the newest reload event decides; only applied ones carry changed=, only refused ones reason=
  case $1 in
  applied) [ "$(ev_last "$EV" reload refused)" = 0 ] && ev_last "$EV" reload changed | grep -qF -- "$2" ;;
  refused) [ "$(ev_last "$EV" reload refused)" = 1 ] && ev_last "$EV" reload reason | grep -qF -- "$2" ;;
  esac
}
printf 'quorum = 2\nouter_lr = 0.5\nstaleness = hinge\ngrace_cap_ms = 4000\n' > "$W/sync.ini"
check "valid change applied and reported" hup_and_wait applied "quorum 1 -> 2, grace_cap_ms 5000 -> 4000, staleness poly -> hinge, outer_lr 0.7 -> 0.5"
printf 'quorum = abc\nouter_lr = 0.1\n' > "$W/sync.ini"
check "bad value refused, running values unchanged" hup_and_wait refused "quorum: 'abc' is not an integer"
printf 'quorum = 2\nouter_lr = 0.5\nstaleness = hinge\ngrace_cap_ms = 100\n' > "$W/sync.ini"
check "broken timeout order refused" hup_and_wait refused "timeouts must be ordered"
# the refused files changed nothing: the next valid reload starts from quorum 2 / outer_lr 0.5
printf 'quorum = 3\nouter_lr = 0.6\nstaleness = hinge\ngrace_cap_ms = 4000\nmerge = mean\n' > "$W/sync.ini"
check "after refused reloads the running values were still the last valid ones" hup_and_wait applied "quorum 2 -> 3, outer_lr 0.5 -> 0.6"
check "restart-only change reported and ignored" ev_has "$EV" reload_ignored key=merge from=rda to=mean
# A restart-only value that was ignored is not kept: the candidate of every
# reload is the running config with only the reloadable keys from the file.
# Here liveness 30 (ignored) would make the eviction 30 x 200 = 6000 ms; once
# it is gone from the file, grace_cap_ms 3500 is valid against the running
# liveness 6 (eviction 1200) and must be applied.
BASE='quorum = 3\nouter_lr = 0.6\nstaleness = hinge\nmerge = mean\n'
printf "${BASE}grace_cap_ms = 4000\nliveness = 30\n" > "$W/sync.ini"
check "ignored liveness change: the reload is applied" hup_and_wait applied ""
check "ignored liveness reported with the running value" ev_has "$EV" reload_ignored key=liveness from=6 to=30
printf "${BASE}grace_cap_ms = 3500\n" > "$W/sync.ini"
check "after an ignored liveness is removed, grace_cap_ms is checked against the running one" \
  hup_and_wait applied "grace_cap_ms 4000 -> 3500"
# An ignored change never becomes a phantom one: max_learners 512 is reported
# once; removing it reports nothing (the run never left 1024). H = 4 in the
# file changes nothing either: the start's --H 8 still wins over the file.
printf "${BASE}grace_cap_ms = 3500\nmax_learners = 512\nH = 4\n" > "$W/sync.ini"
check "ignored max_learners change: the reload is applied" hup_and_wait applied ""
check "the reload event counts the ignored keys (merge, max_learners)" [ "$(ev_last "$EV" reload ignored)" = 2 ]
check "a start flag still overrides the file: no H change to report" [ "$(ev_count "$EV" reload_ignored key=H)" = 0 ]
printf "${BASE}grace_cap_ms = 3500\nquorum = 2\n" > "$W/sync.ini"
check "removing the ignored max_learners applies the real change only" hup_and_wait applied "quorum 3 -> 2"
check "no phantom 'max_learners 512 -> 1024' was reported" [ "$(ev_count "$EV" reload_ignored key=max_learners)" = 1 ]
check "an ignored value is reported once, not at every reload (merge = mean stood in 6 files)" \
  [ "$(ev_count "$EV" reload_ignored key=merge)" = 1 ]
check "the last reload lists only its real change" [ "$(ev_last "$EV" reload changes)" = 1 ]
printf "${BASE}grace_cap_ms = 3500\nquorum = 2\nnorm_action = clip\n" > "$W/sync.ini"
check "a choice is reported by name" hup_and_wait applied "norm_action reject -> clip"
echo "  reload events: $(ev_count "$EV" reload refused=0) applied, $(ev_count "$EV" reload refused=1) refused"
m=$(merges)
wait_until 30 "[ \$(merges) -gt $((m + 5)) ]" && echo "ok: merges continue after the reloads" || { echo "FAIL: merges stopped"; fail=1; }
kill -TERM "$L0"; wait_pid 60 "$L0"
stop_sync
[ $fail = 0 ] && echo "test_reload: all checks passed" || echo "test_reload: FAILED"
exit $fail
