#!/bin/bash
# The container's entrypoint: dloco-entrypoint sync|learner|dloco [flags...]
#   sync     exec dloco-sync with the flags
#   learner  exec dloco-learner with the flags
#   dloco    exec the operator tool (status, keygen, eval, ...)
# Environment:
#   DLOCO_KEYS_SRC=DIR   key files mounted read-only (a Kubernetes Secret, a bind mount):
#                        copied to /run/dloco/keys with mode 0600 (0644 for *.pub and the
#                        allowlist), since the programs refuse a key file group or others
#                        can read and a Secret volume's modes are not always the file's own
#   DLOCO_SHARD_FROM_HOSTNAME=1   sync: --shard K from the host name's last -K (a
#                        StatefulSet's pod dloco-sync-K); the shard count comes from the config
#   DLOCO_BIN_DIR        where the programs are (default /usr/local/bin)
#   DLOCO_RUN_DIR        where the private key copies go (default /run/dloco)
set -euo pipefail
BIN=${DLOCO_BIN_DIR:-/usr/local/bin}
RUN=${DLOCO_RUN_DIR:-/run/dloco}
usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }
[ $# -ge 1 ] || { usage; exit 2; }
what=$1; shift
case "$what" in
  sync) prog=$BIN/dloco-sync ;;
  learner) prog=$BIN/dloco-learner ;;
  dloco) prog=$BIN/dloco ;;
  -h | --help) usage; exit 0 ;;
  *) echo "dloco-entrypoint: the first argument is sync, learner or dloco, not '$what' (try --help)" >&2; exit 2 ;;
esac
if [ -n "${DLOCO_KEYS_SRC:-}" ]; then
  [ -d "$DLOCO_KEYS_SRC" ] || { echo "dloco-entrypoint: DLOCO_KEYS_SRC=$DLOCO_KEYS_SRC is not a directory" >&2; exit 2; }
  umask 077
  mkdir -p "$RUN/keys"
  for f in "$DLOCO_KEYS_SRC"/*; do
    [ -f "$f" ] || continue
    n=$(basename "$f")
    case "$n" in *[!A-Za-z0-9._-]*) echo "dloco-entrypoint: skipping key file with an odd name: $n" >&2; continue ;; esac
    cp "$f" "$RUN/keys/$n"
    case "$n" in *.pub | allowlist) chmod 0644 "$RUN/keys/$n" ;; *) chmod 0600 "$RUN/keys/$n" ;; esac
  done
fi
extra=()
if [ "$what" = sync ] && [ "${DLOCO_SHARD_FROM_HOSTNAME:-0}" = 1 ]; then
  h=${HOSTNAME:-$(hostname)}
  k=${h##*-}
  case "$k" in '' | *[!0-9]*) echo "dloco-entrypoint: DLOCO_SHARD_FROM_HOSTNAME=1 but host name '$h' does not end in -K" >&2; exit 2 ;; esac
  extra=(--shard "$k")
fi
exec "$prog" "$@" "${extra[@]}"
