#!/bin/bash
# Runs a test that may SKIP (exit 77) and, when it does, keeps its SKIP line
# in $DLOCO_SKIP_DIR/NAME; ctest shows only "Skipped" for such a test, never
# why, so CTestCustom.cmake (written by the top CMakeLists.txt) clears that
# folder before a ctest run and prints every kept reason after its summary.
# Output and exit status of the test pass through unchanged.
#   skip_note.sh NAME COMMAND [ARGS...]   run a test
#   skip_note.sh --clear DIR              before a ctest run
#   skip_note.sh --report DIR             after it: "Skipped tests, and why:" + one line each
case "${1:-}" in
--clear) rm -rf "${2:?}"; exit 0 ;;
--report)
  [ -d "${2:?}" ] || exit 0
  set -- "$2"/*
  [ -e "$1" ] || exit 0
  echo "Skipped tests, and why:"
  for f in "$@"; do echo "  $(basename "$f"): $(cat "$f")"; done
  exit 0 ;;
-h|--help) sed -n 2,10p "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
[ $# -ge 2 ] || { echo "usage: skip_note.sh NAME COMMAND [ARGS...]" >&2; exit 2; }
name=$1; shift
out=$(mktemp "${TMPDIR:-/tmp}/dloco_skip_note.XXXXXX") || exit 1
"$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
if [ "$rc" = 77 ] && [ -n "${DLOCO_SKIP_DIR:-}" ]; then
  mkdir -p "$DLOCO_SKIP_DIR"
  why=$(grep -m1 '^SKIP' "$out" | cut -c1-400)
  echo "${why:-SKIP (exit 77 without a SKIP line)}" > "$DLOCO_SKIP_DIR/$name"
fi
rm -f "$out"
# a test killed by a signal dies of it here too, so ctest still reports the crash as one
if [ "$rc" -gt 128 ] && [ "$rc" -lt 160 ]; then trap - "$((rc - 128))" 2>/dev/null; kill -"$((rc - 128))" $$; fi
exit "$rc"
