#!/bin/bash
# Set up, build and run every test (Release), then the C unit tests once more
# under ASan+UBSan; ends with ctest's summary of that last run.
# Usage: tests/run.sh [extra ctest args for the Release run]
#   BUILD_DIR        Release build directory (default build)
#   ASAN_BUILD_DIR   sanitizer build directory (default build-asan)
#   DLOCO_SANITIZE_CI=0  skip the sanitizer pass locally (it always runs
#                    when CI=true)
#   DLOCO_SANITIZE=ON  build the Release pass itself with the sanitizers
# Exits non-zero when either run fails.
set -uo pipefail
. "$(dirname "$0")/lib_args.sh"
case "${1:-}" in -h | --help) dl_usage; exit 0 ;; esac
cd "$(dirname "$0")/.."
# torch: the PyTorch checks of test_export (tests/export_check.py); slurm: test_slurm's private single-node Slurm
deploy/setup.sh --with-torch --with-slurm || exit 1
BUILD_DIR=${BUILD_DIR:-build}
ASAN_BUILD_DIR=${ASAN_BUILD_DIR:-build-asan}
if [ "${CI:-}" = true ]; then SAN=1; else SAN=${DLOCO_SANITIZE_CI:-1}; fi
JOBS=$(nproc)

t0=$(date +%s)
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DDLOCO_SANITIZE="${DLOCO_SANITIZE:-OFF}" >/dev/null || exit 1
cmake --build "$BUILD_DIR" -j"$JOBS" || exit 1
# Tests run one at a time: each already uses every core (OpenMP), and
# several processes spinning on 2 cores only slow each other down.
ctest --test-dir "$BUILD_DIR" --output-on-failure "$@"
release_rc=$?
# why each test skipped: ctest's own summary ends with it (CTestCustom.cmake, tests/skip_note.sh)
t1=$(date +%s)
echo "tests/run.sh: Release build and tests took $((t1 - t0)) s (ctest exit $release_rc)"
[ "$SAN" = 0 ] && { echo "tests/run.sh: sanitizer pass skipped (DLOCO_SANITIZE_CI=0)"; exit $release_rc; }

# The unit tests (label "unit", not the GPU ones) under AddressSanitizer and
# UndefinedBehaviorSanitizer: memory errors and UB fail the run, leaks too.
# Only the test binaries are built; the integration scripts need the programs
# and take minutes under ASan, so they stay in the Release pass.
cmake -S . -B "$ASAN_BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DDLOCO_SANITIZE=ON -DDLOCO_CUDA=OFF >/dev/null || exit 1
units=$(ctest --test-dir "$ASAN_BUILD_DIR" -N -L unit -LE gpu | sed -n -E 's/^ *Test +#[0-9]+: +([A-Za-z0-9_]+)$/\1/p')
[ -n "$units" ] || { echo "tests/run.sh: no unit tests found in $ASAN_BUILD_DIR"; exit 1; }
# test_comms/test_sync start dloco-learner/dloco-sync: build those too
cmake --build "$ASAN_BUILD_DIR" -j"$JOBS" --target $units dloco-learner dloco-sync || exit 1
echo "tests/run.sh: Release pass $((t1 - t0)) s (ctest exit $release_rc); ASan+UBSan build $(( $(date +%s) - t1 )) s"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1:halt_on_error=1"
# the last output is this run's summary (its "Total Test time" is the ASan test time)
ctest --test-dir "$ASAN_BUILD_DIR" --output-on-failure -L unit -LE gpu
asan_rc=$?
[ $release_rc = 0 ] && [ $asan_rc = 0 ]
