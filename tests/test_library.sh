#!/usr/bin/env bash
# libdloco_learner as another program sees it: `cmake --install` into a fresh prefix (library with its
# soname and only the API exported, header, pkg-config file, Python package), the C example
# (examples/c/learner.c) built with pkg-config alone, joining a real dloco-sync: its pushes are accepted
# and it adopts merged versions (its events); the same learner against a synchronizer of another model is
# refused at once (exit 1, a `refused` event), not retried.
TEST_NAME=library
. "$(dirname "$0")/lib_cluster.sh"
SRC=${DLOCO_SRC:-.}
P=$W/prefix

cmake --install "$B" --prefix "$P" > "$W/install.log" 2>&1 || die "cmake --install failed"
lib=$(find "$P" -name 'libdloco_learner.so.*.*' | head -n 1)
pc=$(find "$P" -name dloco-learner.pc | head -n 1)
check "the library is installed" test -n "$lib"
check "the header is installed" test -f "$P/include/dloco/learner.h"
check "the pkg-config file is installed" test -n "$pc"
check "the Python package is installed" test -f "$P/lib/python3/dist-packages/dloco/__init__.py"
check "the soname is the API's major" quietly bash -c "readelf -d '$lib' | grep -q 'SONAME.*libdloco_learner.so.1\\]'"
others=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBR]$/ && $3 !~ /^dloco_learner_/' | wc -l)
api=$(nm -D --defined-only "$lib" | awk '$3 ~ /^dloco_learner_/' | wc -l)
check "only the API is exported ($api dloco_learner_* symbols, $others others)" test "$others" -eq 0 -a "$api" -ge 20

export PKG_CONFIG_PATH=$(dirname "$pc")
cc -std=c11 -Wall -Wextra -Werror "$SRC/examples/c/learner.c" $(pkg-config --cflags --libs dloco-learner) -lm \
  -o "$W/c-learner" > "$W/cc.log" 2>&1 || die "the example does not build with pkg-config alone: $(cat "$W/cc.log")"
export LD_LIBRARY_PATH=$(dirname "$lib")

make_corpus
start_sync sync
printf 'events = %s\nflush_timeout_ms = 20000\n' "$W/events-c1.log" > "$W/c1.ini"
"$W/c-learner" "$EP" dloco c1 60 "$W/c1.ini" > "$W/c1.log" 2>&1 &
CPID=$!; PIDS+=("$CPID")
wait_pid 120 "$CPID"; rc=$?
check "the C learner ran to its end (exit $rc)" test "$rc" -eq 0
pushes=$(ev_count "$W/events-c1.log" push)
accepted=$(ev_count "$W/events-c1.log" ack decision=accepted)
adopted=$(ev_count "$W/events-c1.log" adopt mode=keep)
fetched=$(ev_count "$W/events-c1.log" adopt mode=rebase)
echo "C learner: $pushes pushes, $accepted accepted, $adopted merged versions adopted, $fetched fetched"
check "it fetched the whole model at join" test "$fetched" -ge 4
check "its pushes were accepted" test "$accepted" -ge 10
check "it adopted merged versions" test "$adopted" -ge 10
check "the synchronizer merged its pushes" test "$(ev_count "$W/events-sync.log" merge)" -ge 10
stop_sync

# another model: refused at once, no retry loop
rm -rf "$W/store"
MODEL="--n_layer 1 --n_head 2 --n_embd 32 --seq_len 32" start_sync other
printf 'events = %s\n' "$W/events-c2.log" > "$W/c2.ini"
"$W/c-learner" "$EP" dloco c2 10 "$W/c2.ini" > "$W/c2.log" 2>&1 &
CPID=$!; PIDS+=("$CPID")
wait_pid 60 "$CPID"; rc=$?
check "a learner of another model exits 1 (exit $rc)" test "$rc" -eq 1
check "it was refused by the synchronizer" ev_has "$W/events-c2.log" refused
check "and never fetched" test "$(ev_count "$W/events-c2.log" adopt)" -eq 0
stop_sync
exit $fail
