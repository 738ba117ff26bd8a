# Argument handling of the scripts people run by hand (bench/*.sh, tests/gpu.sh,
# tests/run.sh; sourced first thing): `--help` prints the script's header
# comment and exits 0; an unknown option or too many arguments is refused with
# exit 2, before anything is built or run.
#   dl_args MAX "$@"            -h/--help, refuse options and more than MAX positional arguments
#   dl_args_number NAME VALUE   refuse a VALUE that is not a whole number
dl_usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }
dl_args() {
  local max=$1 a
  shift
  case "${1:-}" in -h | --help) dl_usage; exit 0 ;; esac
  for a in "$@"; do
    case "$a" in -*) echo "$(basename "$0"): unknown option '$a' (try --help)" >&2; exit 2 ;; esac
  done
  if [ $# -gt "$max" ]; then echo "$(basename "$0"): at most $max argument(s), got $# (try --help)" >&2; exit 2; fi
}
dl_args_number() {
  case "$2" in '' | *[!0-9]*) echo "$(basename "$0"): $1 must be a whole number, got '$2' (try --help)" >&2; exit 2 ;; esac
}
