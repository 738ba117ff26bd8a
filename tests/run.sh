#!/bin/bash
# Set up, build and run every test (Release) in parallel, fuzz for time, then
# the C unit tests once more under ASan+UBSan; ends with ctest's summary of
# that last run. The tiers and their timings: tests/README.md.
# Usage: tests/run.sh [extra ctest args for the Release run]
#   BUILD_DIR        Release build directory (default build)
#   ASAN_BUILD_DIR   sanitizer build directory (default build-asan)
#   DLOCO_JOBS       tests run at once (default nproc); each test process uses
#                    one OpenMP thread (OMP_NUM_THREADS=1, set per test)
#   DLOCO_FUZZ_SECONDS  the fuzzing stage: seconds per libFuzzer target, the
#                    targets DLOCO_JOBS at a time (default 10 when CI=true,
#                    else 0 = no stage; the Release run replays the seed
#                    corpora either way)
#   DLOCO_SANITIZE_CI=0  skip the sanitizer pass locally (it always runs
#                    when CI=true)
#   DLOCO_SANITIZE=ON  build the Release pass itself with the sanitizers
# Exits non-zero when any stage fails.
set -uo pipefail
. "$(dirname "$0")/lib_args.sh"
case "${1:-}" in -h | --help) dl_usage; exit 0 ;; esac
cd "$(dirname "$0")/.."
# torch: the PyTorch checks of test_export (tests/export_check.py); slurm: test_slurm's private single-node Slurm
deploy/setup.sh --with-torch --with-slurm || exit 1
BUILD_DIR=${BUILD_DIR:-build}
ASAN_BUILD_DIR=${ASAN_BUILD_DIR:-build-asan}
if [ "${CI:-}" = true ]; then SAN=1; FUZZ_S=${DLOCO_FUZZ_SECONDS:-10}; else
  SAN=${DLOCO_SANITIZE_CI:-1}; FUZZ_S=${DLOCO_FUZZ_SECONDS:-0}; fi
JOBS=${DLOCO_JOBS:-$(nproc)}
dl_args_number DLOCO_JOBS "$JOBS"
dl_args_number DLOCO_FUZZ_SECONDS "$FUZZ_S"

t0=$(date +%s)
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DDLOCO_SANITIZE="${DLOCO_SANITIZE:-OFF}" >/dev/null || exit 1
cmake --build "$BUILD_DIR" -j"$JOBS" || exit 1
tb=$(date +%s)
# Every tier at once (unit, integration, the fuzz seed corpora), JOBS tests at a
# time; tests that share a resource carry a RESOURCE_LOCK and wait for each other.
DLOCO_FUZZ_SECONDS=0 ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$JOBS" "$@"
release_rc=$?
# why each test skipped: ctest's own summary ends with it (CTestCustom.cmake, tests/skip_note.sh)
t1=$(date +%s)
echo "tests/run.sh: Release build $((tb - t0)) s, tests $((t1 - tb)) s at -j$JOBS (ctest exit $release_rc)"

# ---- fuzzing for time: each libFuzzer target on a copy of its corpus (tests/fuzz/run.sh)
fuzz_rc=0
if [ "$FUZZ_S" -gt 0 ]; then
  targets=$(ctest --test-dir "$BUILD_DIR" -N -L fuzz | sed -n -E 's/^ *Test +#[0-9]+: +([A-Za-z0-9_]+)$/\1/p')
  [ -n "$targets" ] || { echo "tests/run.sh: no fuzz targets found in $BUILD_DIR"; exit 1; }
  # a target's build (once, shared) and libFuzzer's last input (-timeout=10) fit in the margin;
  # exit 77: clang cannot build fuzzers here (the seed run above said SKIP already)
  echo "$targets" | DLOCO_BIN=$(cd "$BUILD_DIR" && pwd) DLOCO_FUZZ_SECONDS=$FUZZ_S xargs -P "$JOBS" -I{} \
    bash -c 'timeout -k 10 "$1" bash tests/fuzz/run.sh "$2"; rc=$?; [ $rc = 77 ] && rc=0; exit $rc' _ $((FUZZ_S + 240)) {} \
    > "$BUILD_DIR/fuzz-stage.log" 2>&1
  fuzz_rc=$?
  grep -E "execs|^SKIP|^FAIL|^input|^reproduce" "$BUILD_DIR/fuzz-stage.log"
  [ $fuzz_rc = 0 ] || tail -80 "$BUILD_DIR/fuzz-stage.log"
fi
t2=$(date +%s)
echo "tests/run.sh: fuzzing stage $((t2 - t1)) s (${FUZZ_S} s per target, exit $fuzz_rc)"
[ "$SAN" = 0 ] && { echo "tests/run.sh: sanitizer pass skipped (DLOCO_SANITIZE_CI=0)"; [ $release_rc = 0 ] && [ $fuzz_rc = 0 ]; exit; }

# The unit tests (label "unit", not the GPU ones nor the static checks) under
# AddressSanitizer and UndefinedBehaviorSanitizer: memory errors and UB fail the
# run, leaks too. Only the test binaries are built; the integration scripts need
# the programs and take minutes under ASan, so they stay in the Release pass.
cmake -S . -B "$ASAN_BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DDLOCO_SANITIZE=ON -DDLOCO_CUDA=OFF >/dev/null || exit 1
units=$(ctest --test-dir "$ASAN_BUILD_DIR" -N -L unit -LE 'gpu|static' | sed -n -E 's/^ *Test +#[0-9]+: +([A-Za-z0-9_]+)$/\1/p')
[ -n "$units" ] || { echo "tests/run.sh: no unit tests found in $ASAN_BUILD_DIR"; exit 1; }
# test_comms/test_sync start dloco-learner/dloco-sync: build those too
cmake --build "$ASAN_BUILD_DIR" -j"$JOBS" --target $units dloco-learner dloco-sync || exit 1
echo "tests/run.sh: Release pass $((t1 - t0)) s (ctest exit $release_rc); fuzzing $((t2 - t1)) s;" \
     "ASan+UBSan build $(( $(date +%s) - t2 )) s"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1:halt_on_error=1"
# the last output is this run's summary (its "Total Test time" is the ASan test time)
ctest --test-dir "$ASAN_BUILD_DIR" --output-on-failure -j"$JOBS" -L unit -LE 'gpu|static'
asan_rc=$?
[ $release_rc = 0 ] && [ $fuzz_rc = 0 ] && [ $asan_rc = 0 ]
