#!/bin/bash
# One fuzz target as a CTest test: build it (tests/fuzz/build.sh), check that the
# seeds still mean what their names say, then (DLOCO_FUZZ_SECONDS > 0) fuzz a copy
# of the committed corpus.
# Usage: tests/fuzz/run.sh TARGET
#   DLOCO_BIN                build directory (default build); fuzzers go to $DLOCO_BIN/fuzz
#   DLOCO_FUZZ_SECONDS       fuzzing time, s (default 0: the seeds only; tests/run.sh's fuzzing
#                            stage sets it)
#   DLOCO_FUZZ_TEST_TIMEOUT  the test's CTest TIMEOUT (CMake sets it): a longer run is refused
# Fails on any crash, sanitizer report, leak, timeout (-timeout=10 s per input)
# or out-of-memory (-rss_limit_mb=2048), and then prints the report, keeps the
# input under $DLOCO_BIN/fuzz/findings/TARGET/ and shows how to reproduce it.
# Prints the execs count either way. Exits 77 (CTest: skipped) after a "SKIP:"
# line when clang cannot build fuzzers here. The committed corpus never grows.
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
T=${1:?usage: tests/fuzz/run.sh TARGET}
BIN=${DLOCO_BIN:-$SRC/build}
FUZZ_DIR=$BIN/fuzz
CORPUS=$SRC/tests/fuzz/corpus/$T
[ -d "$CORPUS" ] || { echo "FAIL: no seed corpus $CORPUS"; exit 1; }

SECS=${DLOCO_FUZZ_SECONDS:-0}
case "$SECS" in '' | *[!0-9]*) echo "FAIL: DLOCO_FUZZ_SECONDS='$SECS' is not a whole number of seconds"; exit 1 ;; esac
# the build, the seed check and libFuzzer's last input (up to -timeout) must fit too
if [ -n "${DLOCO_FUZZ_TEST_TIMEOUT:-}" ] && [ $((SECS + 120)) -gt "$DLOCO_FUZZ_TEST_TIMEOUT" ]; then
  echo "FAIL: DLOCO_FUZZ_SECONDS=$SECS does not fit this test's TIMEOUT of $DLOCO_FUZZ_TEST_TIMEOUT s;" \
       "configure with DLOCO_FUZZ_SECONDS=$SECS in the environment (cmake -S . -B $BIN) to raise it"
  exit 1
fi

# ---- build
out=$(bash "$SRC/tests/fuzz/build.sh" "$FUZZ_DIR" "$T" 2>&1)
rc=$?
if [ $rc = 77 ]; then
  echo "$out" | grep '^SKIP' || echo "SKIP: tests/fuzz/build.sh cannot build $T here"
  exit 77
fi
[ $rc = 0 ] || { echo "$out"; echo "FAIL: tests/fuzz/build.sh $FUZZ_DIR $T exited $rc"; exit 1; }
FUZZER=$FUZZ_DIR/$T

WORK=$(mktemp -d "${TMPDIR:-/tmp}/dloco-$T.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/corpus" "$WORK/artifacts"
cp "$CORPUS"/* "$WORK/corpus/"
nseeds=$(ls "$WORK/corpus" | wc -l)

# ---- the seeds: bad_* refused, the others accepted (a stale corpus would
# still fuzz, but from shallower starting points; warn, do not fail)
FUZZ_EXPLAIN=1 "$FUZZER" "$WORK"/corpus/* >"$WORK/seeds.log" 2>&1
rc=$?
if [ $rc != 0 ]; then
  grep -v '^fuzz verdict' "$WORK/seeds.log" | tail -60
  echo "FAIL: $T crashed on its own seed corpus (rc $rc)"
  exit 1
fi
# libFuzzer may run an input twice (leak check): keep each seed's first verdict
stale=$(awk '/^Running: /{n=$2; sub(".*/", "", n); cur=n; next}
             /^fuzz verdict: / && cur != "" {v=$0; sub("^fuzz verdict: ", "", v);
               bad = (cur ~ /^bad_/); ok = (v ~ /^accepted/);
               if (bad == ok) printf "  %s: %s\n", cur, v; cur=""}' "$WORK/seeds.log")
if [ -n "$stale" ]; then
  echo "WARN: seeds whose verdict no longer matches their name (regenerate: tests/fuzz/corpus/README.md):"
  echo "$stale"
fi

# ---- fuzz
if [ "$SECS" = 0 ]; then
  echo "$T: $nseeds seeds ran clean (DLOCO_FUZZ_SECONDS=0: no fuzzing)"
  exit 0
fi
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1"
t0=$(date +%s)
(cd "$WORK" && "$FUZZER" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -error_exitcode=1 \
   -timeout_exitcode=1 -print_final_stats=1 -artifact_prefix="$WORK/artifacts/" "$WORK/corpus" >"$WORK/log" 2>&1)
rc=$?
t1=$(date +%s)
execs=$(awk '/^stat::number_of_executed_units:/{print $2}' "$WORK/log" | tail -1)
rss=$(awk '/^stat::peak_rss_mb:/{print $2}' "$WORK/log" | tail -1)
units=$(ls "$WORK/corpus" | wc -l)
el=$((t1 - t0))
[ "$el" -gt 0 ] || el=1
summary="$T: ${execs:-?} execs in ${el} s ($(( ${execs:-0} / el )) execs/s), corpus $nseeds -> $units units, peak rss ${rss:-?} MB"
findings=$(ls "$WORK/artifacts" | grep -E '^(crash|leak|timeout|oom)-')
if [ $rc = 0 ] && [ -z "$findings" ] && [ -n "$execs" ] && [ "$execs" -gt 0 ] &&
   ! grep -qE '^==[0-9]+==ERROR|runtime error:|fuzz check failed|^SUMMARY: ' "$WORK/log"; then
  echo "$summary, no crash, leak or timeout"
  exit 0
fi

# ---- a finding (or a run that did not run)
# the report: from the first error line on, without libFuzzer's progress lines
awk '/==ERROR|ERROR: libFuzzer|runtime error:|fuzz check failed|ALARM|out-of-memory/{on=1} on && !/^#[0-9]+\t/' \
  "$WORK/log" | head -120
[ -n "$findings" ] || tail -30 "$WORK/log"
keep=$FUZZ_DIR/findings/$T
mkdir -p "$keep"
for f in $findings; do
  cp "$WORK/artifacts/$f" "$keep/$f"
  echo "input $keep/$f ($(stat -c %s "$keep/$f") bytes):"
  od -A d -t x1 -v "$keep/$f" | head -32
  echo "reproduce: $FUZZER $keep/$f"
done
echo "$summary"
echo "FAIL: $T: libFuzzer exited $rc with ${findings:-no input saved} (FUZZ_EXPLAIN=1 before the command prints the verdict)"
exit 1
