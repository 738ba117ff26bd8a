#!/bin/bash
# dloco-sync start-up refusals leave nothing behind and never crash.
#   test_startup.sh bind:     a typo'd --bind (bad syntax, port > 65535, an
#     address not on this host) and a non-loopback bind without keys are
#     refused with exit 2 and the reason, before any store directory exists.
#   test_startup.sh diskfull: a store on a full filesystem (a 2 MiB tmpfs the
#     test mounts and unmounts; root only, else SKIP): exit 2 naming the lack
#     of space, never SIGBUS; with room for the lock file but not the run, the
#     same (the commit's error says the filesystem is full); with room again
#     the same directory starts as a store.
set -u
TEST_NAME=startup
. "$(dirname "$0")/lib_cluster.sh"
ARGS=($MODEL --vocab 256 --fragments 4 --status_every_ms 0)

# refuse NAME REGEX args...: exit 2, the reason on stderr, no store directory
refuse() {
  local name=$1 re=$2; shift 2
  rm -rf "$W/store-$name"
  timeout 30 "$SYNC" --store "$W/store-$name" "${ARGS[@]}" "$@" > "$W/$name.log" 2>&1; local rc=$?
  check "$name: exit 2 (got $rc)" [ "$rc" = 2 ]
  check "$name: the reason ($re)" grep -Eq "$re" "$W/$name.log"
  check "$name: no store directory left behind" [ ! -e "$W/store-$name" ]
}

case "${1:-bind}" in
bind)
  refuse syntax "bind tcp//127.0.0.1:5555: Invalid argument" --bind tcp//127.0.0.1:5555 --auth off
  refuse port "port '99999' is not \\* or 0..65535" --bind tcp://127.0.0.1:99999
  refuse notnum "port '55x' is not" --bind tcp://127.0.0.1:55x
  refuse foreign "bind tcp://192.0.2.1:5555: Cannot assign requested address" --bind tcp://192.0.2.1:5555 --auth off
  refuse nokeys "CURVE authentication is on: set key_file" --bind tcp://0.0.0.0:0
  # the store of a start that works is where it was asked for
  start_sync ok
  # a second synchronizer on the same store: refused at once, "in use" and
  # what to do, never "try again" (retrying does not help)
  timeout 30 "$SYNC" --store "$W/store" "${ARGS[@]}" --bind tcp://127.0.0.1:0 > "$W/twice.log" 2>&1; rc=$?
  check "a second dloco-sync on the same store: exit 2 (got $rc)" [ "$rc" = 2 ]
  check "... says the store is in use and the fix" \
    grep -q "cannot start: in use: store .* is already open for writing .*give this one another --store" "$W/twice.log"
  check "... never 'try again'" bash -c "! grep -q 'try again' '$W/twice.log'"
  stop_sync
  check "a good start creates its store" [ -f "$W/store/data.mdb" ]
  ;;
diskfull)
  [ "$(id -u)" = 0 ] || { echo "SKIP: not root: mounting a full tmpfs needs root"; exit 77; }
  M="$W/full"; mkdir -p "$M"
  mount -t tmpfs -o size=2M tmpfs "$M" || { echo "SKIP: mount -t tmpfs failed (no privilege in this container?)"; exit 77; }
  trap 'umount "$M" 2>/dev/null; cleanup' EXIT
  # full: not a block left
  dd if=/dev/zero of="$M/fill" bs=64k > /dev/null 2>&1
  timeout 30 "$SYNC" --store "$M/store" --bind tcp://127.0.0.1:0 "${ARGS[@]}" > "$W/full.log" 2>&1; rc=$?
  check "full disk: exit 2, not SIGBUS (got $rc)" [ "$rc" = 2 ]
  check "full disk: the reason names the lack of space" grep -q "no space left on its filesystem" "$W/full.log"
  # the next start on the same (still full) disk finds what the first left: the same
  timeout 30 "$SYNC" --store "$M/store" --bind tcp://127.0.0.1:0 "${ARGS[@]}" > "$W/full2.log" 2>&1; rc=$?
  check "full disk, again: exit 2 (got $rc)" [ "$rc" = 2 ]
  # room for the lock file, not for the run's first commit
  rm -rf "$M/store" "$M/fill"
  avail=$(df --output=avail -B1 "$M" | tail -1)
  dd if=/dev/zero of="$M/fill" bs=4096 count=$(( (avail - 61440) / 4096 )) > /dev/null 2>&1
  timeout 30 "$SYNC" --store "$M/store" --bind tcp://127.0.0.1:0 "${ARGS[@]}" > "$W/nearly.log" 2>&1; rc=$?
  check "nearly full disk: exit 2, not SIGBUS (got $rc)" [ "$rc" = 2 ]
  check "nearly full disk: the reason says the filesystem is full" grep -q "bytes free: full?" "$W/nearly.log"
  # room again: the same store directory starts
  rm -f "$M/fill"
  BIND=tcp://127.0.0.1:0 start_sync after --store "$M/store"
  stop_sync
  check "with room, the store starts and is consistent" quietly "$DLOCO" check "$M/store"
  ;;
*) echo "usage: test_startup.sh bind|diskfull"; exit 2 ;;
esac
[ $fail = 0 ] && echo "test_startup ${1:-bind}: all checks passed" || echo "test_startup ${1:-bind}: FAILED"
exit $fail
