#!/bin/bash
# Every program's config table from the outside: --help lists every option
# --print-config prints (default, range, reloadable); --print-config's INI
# reads back to the same text (print -> --config -> print); flags override
# the file; dash and underscore names are one; a bad value is refused at
# start (exit 2) naming the option. No process stays running.
set -u
B=${DLOCO_BIN:-build}
W=$(mktemp -d /tmp/dloco_config.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
mkdir -p "$W/store"
# name|command prefix (a program, or the dloco subcommand that takes flags)
PROGS=("dloco-sync|$B/synchronizer/dloco-sync"
       "dloco-learner|$B/learner/dloco-learner"
       "dloco eval|$B/tools/dloco eval $W/store"
       "dloco plan|$B/tools/dloco plan"
       "swarm|$B/bench/swarm"
       "dloco-serve|$B/chaos/dloco-serve"
       "dloco-loadgen|$B/chaos/dloco-loadgen")
for p in "${PROGS[@]}"; do
  name=${p%%|*}; read -r -a cmd <<< "${p#*|}"
  "${cmd[@]}" --print-config > "$W/a.ini" 2> "$W/err" || { bad "$name --print-config exited $?: $(cat "$W/err")"; continue; }
  # --help-all: every option in full (--help groups them: checked below)
  "${cmd[@]}" --help-all > "$W/help" 2>&1 || bad "$name --help-all exited $?"
  keys=$(sed -n -E 's/^([A-Za-z0-9_.]+) = .*/\1/p' "$W/a.ini")
  n=0; missing=""
  for k in $keys; do
    n=$((n + 1))
    # the option's line, then its "default ... | reloadable|restart" line
    grep -A1 -E "^  --$k <" "$W/help" | grep -qE "^      default .*\| (reloadable \(SIGHUP\)|restart to change)$" || missing+=" $k"
  done
  [ "$n" -gt 0 ] && [ -z "$missing" ] && ok "$name --help-all lists all $n options with default and reloadability" \
    || bad "$name --help-all misses:$missing (of $n)"
  # --help names every option too (the common ones in full, the rest one line each)
  "${cmd[@]}" --help > "$W/help1" 2> "$W/err" || bad "$name --help exited $?"
  grep -q "bad --help sections" "$W/err" && bad "$name --help: $(grep "bad --help sections" "$W/err")"
  missing=""
  for k in $keys; do grep -qE "^  --$k <" "$W/help1" || missing+=" $k"; done
  [ -z "$missing" ] && ok "$name --help names all $n options" || bad "$name --help misses:$missing"
  if grep -A1 -E '^  --[a-z_]+ <int' "$W/help" | grep -E 'range' | grep -qE '[0-9]e'; then
    bad "$name: int bounds printed with an exponent"
  else ok "$name: int bounds printed as integers"; fi
  "${cmd[@]}" --config "$W/a.ini" --print-config > "$W/b.ini" 2> "$W/err" || bad "$name --config (its own print) failed: $(cat "$W/err")"
  cmp -s "$W/a.ini" "$W/b.ini" && ok "$name: print -> load -> print identical" || { bad "$name: round trip differs"; diff "$W/a.ini" "$W/b.ini" | head -5; }
done

# the two big programs: --help starts with the common options in full, the
# rest under headings, one line each, in fewer than 200 lines
for p in "dloco-sync|$B/synchronizer/dloco-sync" "dloco-learner|$B/learner/dloco-learner"; do
  name=${p%%|*}; prog=${p#*|}
  "$prog" --help > "$W/help" 2>&1
  lines=$(wc -l < "$W/help"); heads=$(grep -cE '^[a-z][a-z ,():/.-]*:$' "$W/help")
  first=$(grep -m1 -E '^[a-z][a-z ,():/.-]*:$' "$W/help")
  if [ "$lines" -lt 200 ] && [ "$heads" -ge 5 ] && [ "$first" = "common options:" ] \
     && grep -A2 -E '^  --(connect|bind) <text>$' "$W/help" | grep -q '^      default '; then
    ok "$name --help: $lines lines, $heads headings, common options first in full"
  else bad "$name --help: $lines lines, $heads headings, first heading '$first'"; fi
done

# every dloco subcommand answers --help (exit 0, its usage), even without a STORE
for sub in check status records eval export keygen plan manifest; do
  out=$("$B/tools/dloco" "$sub" --help 2>&1); rc=$?
  if [ $rc = 0 ] && echo "$out" | grep -q "^usage: dloco $sub"; then ok "dloco $sub --help"
  else bad "dloco $sub --help: rc=$rc: $(echo "$out" | head -2)"; fi
done

# dloco-chaos reads its tables from scenario files: `keys` lists them all
C=$B/chaos/dloco-chaos
if [ -x "$C" ]; then
  out=$("$C" keys 2>&1); rc=$?
  n=$(echo "$out" | grep -cE '^      default ')
  if [ $rc = 0 ] && [ "$n" -ge 40 ] && echo "$out" | grep -q '^  rtt_ms <float, ms>$' && echo "$out" | grep -q '^\[fault NAME\]' \
     && ! echo "$out" | grep -E '^  [a-z_]+ <int' -A1 | grep -E 'range' | grep -qE '[0-9]e'; then
    ok "dloco-chaos keys lists $n scenario keys with type, unit, default and range"
  else bad "dloco-chaos keys: rc=$rc, $n keys"; fi
fi

S=$B/synchronizer/dloco-sync
# flags override the file, wherever they stand; - and _ are one
printf 'quorum = 4\nlog_level = warn\nrun_id = "a run"\n' > "$W/s.ini"
out=$("$S" --log-level debug --config "$W/s.ini" --quorum=3 --print-config 2>&1)
echo "$out" | grep -qx 'quorum = 3' && echo "$out" | grep -qx 'log_level = debug' && echo "$out" | grep -qx 'run_id = a run' \
  && ok "flags override the file (--log-level and --log_level are one), quoted strings read" \
  || bad "flags over file: $(echo "$out" | grep -E '^(quorum|log_level|run_id) ')"

# refused at start, exit 2, naming the option
refused() { # program want args...
  local prog=$1 want=$2; shift 2
  local out rc
  out=$("$prog" "$@" 2>&1); rc=$?
  if [ $rc = 2 ] && echo "$out" | grep -qF -- "$want"; then ok "$(basename "$prog") $* refused: $(echo "$out" | tail -1 | cut -c1-150)"
  else bad "$(basename "$prog") $*: rc=$rc, want '$want': $out"; fi
}
L=$B/learner/dloco-learner
refused "$S" "option quorum: 'abc' is not an integer" --quorum abc --print-config
refused "$S" "option grace_cap_ms: 0 out of range [1, 86400000]" --grace_cap_ms 0
refused "$S" "option gamma: 20 out of range [1e-6, 10]" --gamma 20
refused "$S" "option log_level: 'loud' is not one of debug|info|warn|error" --log-level loud
refused "$S" "option share_scaling: 'maybe' is not a boolean" --share_scaling=maybe
refused "$S" "unknown option '--no-such'" --no-such 1
refused "$S" "timeouts must be ordered" --heartbeat_ms 1000 --grace_cap_ms 2000 --print-config
refused "$S" "option run_id: must be 1..64 characters" --run_id ""
printf '[x]\nquorum = 2\n' > "$W/sec.ini"
refused "$S" "sec.ini:2: unknown option 'x.quorum'" --config "$W/sec.ini"
refused "$L" "option throttle: 0 out of range [0.001, 1]" --throttle 0
refused "$L" "option device: 'tpu' is not one of auto|cpu|cuda" --device tpu
refused "$L" "poll_max_ms < hello_retry_ms" --hello_retry_ms 100 --print-config
refused "$L" "option id: 'a b' is not" --id "a b" --print-config
refused "$L" "option push_codec: 'int3' is not one of" --push_codec int3 --print-config
refused "$L" "option push_block: 17 is odd" --push_codec int4 --push_block 17 --print-config
refused "$L" "option push_topk: 200 is more than half of push_block 128" --push_codec topk --push_topk 200 --print-config
refused "$B/tools/dloco" "option batch: 0 out of range [1, 4096]" eval "$W/store" --batch 0
refused "$B/tools/dloco" "option shards: 0 out of range [1, 4096]" plan --shards 0
[ $fail = 0 ] && echo "test_config.sh: all checks passed" || echo "test_config.sh: FAILED"
exit $fail
