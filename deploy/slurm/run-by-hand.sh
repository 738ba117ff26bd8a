#!/bin/bash
# tests/test_slurm.sh by hand: the same scenario (a dloco-sync on this host
# with CURVE keys, deploy/slurm/dloco-learners.sbatch with 2 learners as job
# steps, one step killed with scancel and one stopped with SIGTERM, both
# started again by the batch script, the job ending with every step done),
# with the same assertions on the events.
#   deploy/slurm/run-by-hand.sh [--private] [--shared DIR] [--host HOST] [--sbatch-args "ARGS"] [--keep]
#   --private      bring up the private single-node Slurm of the test (root; Debian's
#                  slurm-wlm and munge: deploy/setup.sh --with-slurm): exactly the ctest
#   (default)      submit to the Slurm cluster this host's sbatch talks to
#   --shared DIR   a folder the compute nodes see (keys, corpus, config, logs); default
#                  runs/slurm-by-hand; the build (BUILD_DIR, default build) must be visible too
#   --host HOST    the address the compute nodes reach this host at (default hostname -f);
#                  the synchronizer binds 0.0.0.0 on an ephemeral port: open it to them
#   --sbatch-args  extra sbatch options, e.g. "--partition debug --time 10"
#   --keep         keep the run's files
# Exit 0 when every check passed, 1 otherwise, 77 when --private cannot start here.
set -uo pipefail
cd "$(dirname "$0")/../.."
PRIVATE=0 SHARED=runs/slurm-by-hand HOST="" SARGS="" KEEP=""
while [ $# -gt 0 ]; do
  case "$1" in
    --shared | --host | --sbatch-args) [ $# -ge 2 ] || { echo "run-by-hand.sh: $1 needs a value (try --help)" >&2; exit 2; } ;;&
    --private) PRIVATE=1; shift ;;
    --shared) SHARED=$2; shift 2 ;;
    --host) HOST=$2; shift 2 ;;
    --sbatch-args) SARGS=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h | --help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
    *) echo "run-by-hand.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
BUILD_DIR=${BUILD_DIR:-build}
for b in synchronizer/dloco-sync learner/dloco-learner tools/dloco; do
  [ -x "$BUILD_DIR/$b" ] || { echo "run-by-hand.sh: $BUILD_DIR/$b is not built (cmake --build $BUILD_DIR)" >&2; exit 2; }
done
export DLOCO_BIN DLOCO_SRC KEEP_W=$KEEP
DLOCO_BIN=$(readlink -f "$BUILD_DIR") DLOCO_SRC=$PWD
[ -n "$KEEP" ] || unset KEEP_W
if [ "$PRIVATE" = 1 ]; then exec bash tests/test_slurm.sh; fi
mkdir -p "$SHARED" || exit 1
DLOCO_SLURM_EXTERNAL=1 DLOCO_SLURM_SHARED=$(readlink -f "$SHARED") DLOCO_SLURM_HOST=${HOST:-$(hostname -f)} \
  DLOCO_SLURM_SBATCH_ARGS="$SARGS" exec bash tests/test_slurm.sh
