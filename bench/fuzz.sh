#!/bin/bash
# Fuzz every tests/fuzz target for SECONDS each (default 300), one after the other,
# each on one core, and print executions, crashes and corpus size per target.
# Usage: bench/fuzz.sh [SECONDS]   (BUILD_DIR=build)
# Each target starts from its committed seeds plus what earlier bench runs
# found ($BUILD_DIR/fuzz/bench/<target>/corpus; the repository's corpus never
# grows). libFuzzer runs in fork mode and keeps going after a crash, leak,
# timeout (-timeout=10 s) or out-of-memory (-rss_limit_mb=2048); each distinct
# failing input is saved in $BUILD_DIR/fuzz/bench/<target>/findings and counted.
# Output, after the build: one line per target
#   fuzz <target>: execs N, crashes K, corpus M
# then, last, "fuzz_total_crashes: K". Exits 0 even with crashes (read the
# total); 77 when clang cannot build fuzzers here, 1 when the build fails.
set -uo pipefail
. "$(dirname "$0")/../tests/lib_args.sh"
dl_args 1 "$@"
cd "$(dirname "$0")/.."
SECS=${1:-300}
case "$SECS" in '' | *[!0-9]* | 0) echo "bench/fuzz.sh: SECONDS must be a positive whole number" >&2; exit 2 ;; esac
BUILD_DIR=${BUILD_DIR:-build}
FUZZ_DIR=$BUILD_DIR/fuzz
TARGETS=(fuzz_envelope fuzz_message fuzz_config)
[ -e proto/auth.h ] && TARGETS+=(fuzz_allowlist)

bash tests/fuzz/build.sh "$FUZZ_DIR" "${TARGETS[@]}"
rc=$?
[ $rc = 0 ] || exit $rc
FUZZ_DIR=$(cd "$FUZZ_DIR" && pwd)
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1"

lines=()
total=0
for t in "${TARGETS[@]}"; do
  dir=$FUZZ_DIR/bench/$t
  rm -rf "$dir/run"
  mkdir -p "$dir/corpus" "$dir/findings" "$dir/run"
  cp -n tests/fuzz/corpus/"$t"/* "$dir/corpus/"
  echo "bench/fuzz.sh: $t for $SECS s (log: $dir/log)"
  (cd "$dir" && "$FUZZ_DIR/$t" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
     -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$dir/run/" \
     "$dir/corpus" >"$dir/log" 2>&1)
  # fork mode's status lines: "#EXECS: cov: .. corp: .. exec/s .. oom/timeout/crash: a/b/c ..."
  execs=$(grep -E '^#[0-9]+: ' "$dir/log" | tail -1 | sed -E 's/^#([0-9]+):.*/\1/')
  crashes=$(ls "$dir/run" | grep -cE '^(crash|leak|timeout|oom)-')
  cp "$dir"/run/* "$dir/findings/" 2>/dev/null
  units=$(ls "$dir/corpus" | wc -l)
  total=$((total + crashes))
  lines+=("fuzz $t: execs ${execs:-0}, crashes $crashes, corpus $units")
done
printf '%s\n' "${lines[@]}"
echo "fuzz_total_crashes: $total"
